"""``clustersim calibrate``: fit the compute model to a measured kernel table."""

from __future__ import annotations

import argparse

from simulator.cli import options
from simulator.config.scenario import ScenarioError


def add_parser(sub) -> None:
    calibrate = sub.add_parser("calibrate", help="fit the compute model to measured kernels",
                               description="Fit the GPU's five compute-model efficiencies to a "
                                           "table of measured kernel times (README: Calibration)"
                                           " and write a calibration file for "
                                           "cluster.calibration.")
    calibrate.add_argument("kernels", help="kernel table CSV (scripts/measure_kernels.py)")
    calibrate.add_argument("--gpu", required=True, help="GPU preset the table was measured on")
    calibrate.add_argument("--out", required=True, help="calibration file to write (YAML)")
    calibrate.add_argument("--precision", default="bf16", help="precision of the GEMMs")


def run(args: argparse.Namespace) -> int:
    from simulator.compute import calibration
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
        table, floor = calibration.without_launch_floor(calibration.read_kernels(args.kernels),
                                                        gpu, args.precision)
        values = calibration.fit(table, gpu, args.precision)
    except calibration.CalibrationError as error:
        raise ScenarioError(str(error)) from None
    calibration.write_calibration(out, gpu, values, table, str(args.kernels),
                                  args.precision)
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

    from simulator.compute.model import ComputeModel
    from simulator.compute.table import leave_one_out
    from topologies.gpus import calibrated

    roofline = ComputeModel.of(replace(calibrated(gpu, values), kernel_table=None),
                               args.precision)
    errors = 100 * leave_one_out(table, roofline)
    for kind, part in pd_series(errors, table).groupby(table["kind"].to_numpy()):
        print(f"{kind:10} as a kernel table, each row predicted from the others: mean |error| "
              f"{part.abs().mean():.1f} %, worst {part.abs().max():.1f} %")
    print(f"                 (a shape-aware timing: cluster.kernel_table: {args.kernels})")


def pd_series(values, table):
    import pandas as pd

    return pd.Series(values, index=table.index)
