"""``clustersim trace``: a Perfetto trace of any ranks of a finished run.

A run with more than 100,000 spans writes ``trace.json`` for 8 ranks (at
least one per stage, ``outputs.run_dir.TRACE_RANKS``), one slice per layer
pass when those have too many spans (fewer ranks, spread over the stages, when
even those slices are too many); this writes one for the ranks asked for,
kernel by kernel, from the run's span table and communication log: slices and
flow arrows (the counters of memory and link traffic are in the run's own
trace).
"""

from __future__ import annotations

import argparse

from simulator.cli import options
from simulator.outputs import exports, run_dir
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    trace = sub.add_parser("trace", help="Perfetto trace of chosen ranks of a finished run",
                           description="Write a Chrome/Perfetto trace of the ranks asked "
                                       "for (default: every rank) from RUN_DIR's spans.")
    trace.add_argument("run_dir", help="a directory written by clustersim run")
    trace.add_argument("--ranks", help="ranks to include, e.g. 0-7,64 (default: every rank)")
    trace.add_argument("--out", help="trace file (default: RUN_DIR/trace-RANKS.json)")


def run(args: argparse.Namespace) -> int:
    finished = run_dir.read(args.run_dir)
    total = len(finished.placement)
    ranks = options.ranks_option(args.ranks, total) or list(range(total))
    spans = finished.spans_of(ranks)
    label = (args.ranks or "all").replace(",", "_")
    out = options.output_file(args.out or finished.path / f"trace-{label}.json", "--out")
    guarded(out, lambda: exports.write_chrome_trace(spans, finished.placement, out,
                                                    finished.comms))
    print(f"{out}  ({len(spans):,} spans of {len(ranks)} rank(s))")
    return 0
