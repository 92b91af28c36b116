"""``clustersim sweep``: many scenarios from one base, resumable, on local workers or Dask."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from simulator.base.user_files import read_yaml
from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs import out_dirs


def add_parser(sub) -> None:
    sweep = sub.add_parser("sweep", help="run many scenarios from one base",
                           description="Run the cartesian product of --grid values (crossed "
                                       "with --zip rows) over a base scenario, in parallel; "
                                       "re-run the same command to resume.")
    sweep.add_argument("base", help="base scenario YAML, or a sweep file (base, grid, zip)")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a key and its values; every combination runs (repeatable)")
    sweep.add_argument("--zip", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="keys whose values pair up element by element (repeatable)")
    sweep.add_argument("--out", required=True, help="results directory")
    sweep.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="local worker processes (default: the number of cores)")
    sweep.add_argument("--dask", metavar="ADDRESS",
                       help="run on an existing Dask scheduler, e.g. tcp://host:8786")
    sweep.add_argument("--retry-failed", action="store_true",
                       help="run again the cases that failed last time")


def _design(args: argparse.Namespace) -> tuple[Path, dict, dict]:
    from simulator.experiments import sweep_design

    raw = read_yaml(args.base, "scenario or sweep file")
    is_file = isinstance(raw, dict) and "base" in raw  # a sweep file: the CLI's axes add to its
    base, file_grid, file_zip = (sweep_design.design_from(raw, args.base) if is_file
                                 else (Path(args.base), {}, {}))
    grid = sweep_design.axes(args.grid, "--grid", {**file_grid, **file_zip})
    zipped = sweep_design.axes(args.zip, "--zip", {**file_grid, **file_zip, **grid})
    if not (is_file or grid or zipped):
        raise ScenarioError("sweep: give --grid KEY=V1,V2 (or --zip), or a sweep file")
    return base, {**file_grid, **grid}, {**file_zip, **zipped}


class _Bar:
    """tqdm progress bar: cases done, failed, ETA."""

    def __init__(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self.failed = 0
        self.bar = tqdm(total=total, initial=done, unit="case", dynamic_ncols=True)

    def update(self, row: dict) -> None:
        self.failed += row["status"] != "ok"
        self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run(args: argparse.Namespace) -> int:
    from simulator.experiments import sweep

    base, grid, zipped = _design(args)
    if args.workers < 1:
        raise ScenarioError(f"--workers: {args.workers} must be at least 1")
    out = options.output_dir(args.out, "--out")
    try:
        with out_dirs.exclusive(out, "--out"):  # a second sweep into out is refused
            results, invalid = sweep.sweep(base, grid, zipped, out, args.workers, args.dask,
                                           args.retry_failed, _Bar)
    except KeyboardInterrupt:
        print(f"interrupted: the finished cases are in {args.out}/results.csv; run the same "
              "command again to resume", file=sys.stderr)
        return 130
    table = results.table()
    if invalid and len(invalid) == len(results.order):  # nothing could run
        print(f"error: every case of the sweep is invalid ({len(invalid)}); the first: "
              f"{next(iter(invalid.values()))} (all in {args.out}/invalid.csv)", file=sys.stderr)
        return 2
    failed = table[table["status"] != "ok"] if len(table) else table
    print(f"{len(table)} cases in {args.out}/results.csv (and .parquet): "
          f"{len(table) - len(failed)} ok, {len(failed)} failed, {len(invalid)} invalid")
    for error in list(dict.fromkeys(invalid.values()))[:5]:
        print(f"  invalid: {error}")
    for error in failed["error"].head(5) if len(failed) else []:
        print(f"  failed: {error}")
    return 0 if len(failed) == 0 else 1
