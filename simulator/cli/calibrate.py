"""``clustersim calibrate``: fit the compute model to a measured kernel table."""

from __future__ import annotations

import argparse

from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    calibrate = sub.add_parser("calibrate", help="fit the compute model to measured kernels",
                               description="Fit the GPU's five compute-model efficiencies to a "
                                           "table of measured kernel times (README: Calibration)"
                                           " and write a calibration file for "
                                           "cluster.calibration.")
    calibrate.add_argument("kernels", help="kernel table CSV (scripts/measure_kernels.py), or "
                                           "a PyTorch profiler trace of one training step "
                                           "(.json or .json.gz, with record_shapes=True)")
    calibrate.add_argument("--gpu", required=True, help="GPU preset the table was measured on")
    calibrate.add_argument("--out", required=True, help="calibration file to write (YAML)")
    calibrate.add_argument("--precision", default="bf16", help="precision of the GEMMs")
    calibrate.add_argument("--table", help="also write the kernel table read from a trace "
                                           "(CSV, for cluster.kernel_table)")


def run(args: argparse.Namespace) -> int:
    from simulator.compute import calibration, kernel_file
    from topologies import GPUS
    from topologies.gpus import CALIBRATION_FIELDS

    if args.gpu not in GPUS:
        raise ScenarioError(f"--gpu: {args.gpu!r} is not one of {', '.join(GPUS)}")
    gpu = GPUS[args.gpu]
    if args.precision not in gpu.peak_flops:
        raise ScenarioError(f"--precision: {args.precision!r} is not one of "
                            f"{', '.join(gpu.peak_flops)} for {gpu.name}")
    out = options.output_file(args.out, "--out")
    try:
        table, floor = kernel_file.without_launch_floor(_read(args), gpu, args.precision)
        values = calibration.fit(table, gpu, args.precision)
    except kernel_file.CalibrationError as error:
        raise ScenarioError(str(error)) from None
    guarded(out, lambda: calibration.write_calibration(out, gpu, values, table,
                                                       str(args.kernels), args.precision))
    print(f"calibration of {gpu.name} from {len(table)} kernels "
          f"({', '.join(f'{n} {k}' for k, n in table['kind'].value_counts().items())})")
    print(f"{'':22} {'preset':>12} {'fitted':>12}")
    for key in CALIBRATION_FIELDS:
        print(f"{key:22} {getattr(gpu, key):12.6g} {values[key]:12.6g}")
    errors = 100 * (calibration.modelled(table, gpu, values, args.precision)
                    / table["seconds"] - 1)
    for kind, part in errors.groupby(table["kind"]):
        print(f"{kind:10} modelled vs measured: mean |error| {part.abs().mean():.1f} %, "
              f"worst {part.abs().max():.1f} %")
    if floor:
        print(f"launch floor     {floor * 1e6:.1f} us taken off every row (timed one call at a "
              "time: the host's launch latency)")
    _report_table(table, gpu, values, args)
    print(f"written          {args.out}  (use it with cluster.calibration: {args.out})")
    return 0


def _report_table(table, gpu, values, args) -> None:
    """How well the table itself, as ``cluster.kernel_table``, times shapes it
    has not measured (leave-one-out), next to the fitted roofline."""
    from dataclasses import replace

    import pandas as pd

    from simulator.compute.model import ComputeModel
    from simulator.compute.table import leave_one_out
    from topologies.gpus import calibrated

    roofline = ComputeModel.of(replace(calibrated(gpu, values), kernel_table=None),
                               args.precision)
    errors = pd.Series(100 * leave_one_out(table, roofline), index=table.index)
    for kind, part in errors.groupby(table["kind"]):
        print(f"{kind:10} as a kernel table, each row predicted from the others: mean |error| "
              f"{part.abs().mean():.1f} %, worst {part.abs().max():.1f} %")
    print(f"                 (a shape-aware timing: cluster.kernel_table: {args.kernels})")


def _read(args: argparse.Namespace):
    """The kernel table: a CSV as written, or read from a profiler trace (whose
    mapping is printed, and written with --table)."""
    from simulator.compute import kernel_file

    if not str(args.kernels).endswith((".json", ".json.gz")):
        if args.table:
            raise ScenarioError("--table: only a profiler trace is turned into a kernel table "
                                f"({args.kernels!r} is one already)")
        return kernel_file.read_kernels(args.kernels)
    from simulator.compute.kineto import kernel_table

    table, report = kernel_table(args.kernels)
    print(f"trace            {report['kernels']:,} GPU kernels: {report['calls']:,} operator "
          f"calls mapped to {report['rows']} shapes "
          f"({', '.join(f'{n} {k}' for k, n in report['kinds'].items())}), "
          f"{report['nccl']:,} NCCL skipped, {sum(report['unmapped'].values()):,} unmapped")
    if report["unmapped"]:
        print("                 unmapped, most frequent: " + ", ".join(
            f"{name} ({n})" for name, n in list(report["unmapped"].items())[:5]))
    table = table[(table["kind"] == "memory") | (table["dtype"] == args.precision)]
    if table.empty:
        raise ScenarioError(f"{args.kernels}: no GEMM or attention kernel in {args.precision} "
                            "(--precision)")
    if args.table:
        out = options.output_file(args.table, "--table")
        guarded(out, lambda: table.to_csv(out, index=False))
        print(f"kernel table     {args.table}  (use it with cluster.kernel_table: {args.table})")
    return kernel_file.checked(table.reset_index(drop=True), args.kernels)
