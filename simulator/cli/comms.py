"""``clustersim comms``: the communication profile and size histograms of a finished run."""

from __future__ import annotations

import argparse

from simulator.base.units import format_bytes
from simulator.cli import options
from simulator.outputs import run_dir
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    comms = sub.add_parser("comms", help="communication profile of a finished run",
                           description="Counts, volumes and message-size histograms per "
                                       "parallelism dimension, from RUN_DIR/comms.*")
    comms.add_argument("run_dir", help="a directory written by clustersim run")
    comms.add_argument("--csv", help="write the profile table to this CSV file")
    comms.add_argument("--histogram-csv", help="write the size histogram to this CSV file")
    comms.add_argument("--plot", help="draw the size histogram to this figure (png/pdf/svg)")


def run(args: argparse.Namespace) -> int:
    from simulator.analysis import comms
    from simulator.outputs import comms_plot

    finished = run_dir.read(args.run_dir)
    csv = options.output_file(args.csv, "--csv") if args.csv else None
    histogram_csv = (options.output_file(args.histogram_csv, "--histogram-csv")
                     if args.histogram_csv else None)
    figure = options.figure(args.plot, "--plot") if args.plot else None
    table, bins = comms.profile(finished.comms), comms.histogram(finished.comms)
    print(f"communication of {finished.name}: {len(finished.comms):,} calls and messages, "
          f"{format_bytes(float(finished.comms['bytes'].sum()))}")
    if len(finished.comms):
        print(comms.format_profile(table))
        print()
        print("calls per message size (bins of powers of two):")
        print(comms.format_histogram(bins))
    else:
        print("  none: no rank sends or receives anything (one GPU, or ranks that only compute)")
    if csv:
        guarded(csv, lambda: table.to_csv(csv, index=False, float_format="%.9g"))
    if histogram_csv:
        guarded(histogram_csv, lambda: bins.to_csv(histogram_csv, index=False,
                                                   float_format="%.9g"))
    if figure:
        guarded(figure, lambda: comms_plot.plot_histogram(bins, figure, finished.name))
    return 0
