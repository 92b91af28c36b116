"""What the study scripts share: options, running a sweep into a table, and
writing the CSV and figure next to each other.

Every study runs its cases through ``simulator.experiments.sweep`` (so a study that is
stopped resumes where it stopped: its sweep directories live under
``runs/studies/``) and writes ``NAME.csv`` and ``NAME.png`` into ``--out``
(default ``docs/studies``, the files the README shows).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

import pandas as pd
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from simulator.experiments.sweep import SweepError, sweep  # noqa: E402
from simulator.outputs.style import OKABE_ITO, save  # noqa: E402,F401 - the studies' palette


def options(doc: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=str(ROOT / "docs" / "studies"),
                        help="where NAME.csv and NAME.png go (default docs/studies)")
    parser.add_argument("--runs", default=str(ROOT / "runs" / "studies"),
                        help="sweep directories (resumable)")
    parser.add_argument("--quick", action="store_true",
                        help="a few small cases (for tests), not the study's design")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    return parser.parse_args()


def run_design(args: argparse.Namespace, name: str, base: Mapping, grid: Mapping,
               zipped: Mapping | None = None) -> pd.DataFrame:
    """Run ``grid`` x ``zipped`` over ``base`` (resumable); the finished cases."""
    folder = Path(args.runs) / (f"{name}-quick" if args.quick else name)
    folder.mkdir(parents=True, exist_ok=True)
    base_file = folder / "base.yaml"
    base_file.write_text(yaml.safe_dump(dict(base), sort_keys=False))
    try:
        results, invalid = sweep(base_file, grid, zipped or {}, folder / "sweep",
                                 workers=args.workers)
    except SweepError:  # the study or clustersim changed: its old results are stale
        shutil.rmtree(folder / "sweep")
        results, invalid = sweep(base_file, grid, zipped or {}, folder / "sweep",
                                 workers=args.workers)
    if invalid:
        print(f"{name}: {len(invalid)} impossible cases skipped, e.g. "
              f"{next(iter(invalid.values()))}")
    table = results.table()
    failed = table[table["status"] != "ok"]
    if len(failed):
        print(f"{name}: {len(failed)} cases failed, e.g. {failed['error'].iloc[0]}")
    return table[table["status"] == "ok"].reset_index(drop=True)


def write(args: argparse.Namespace, name: str, table: pd.DataFrame, fig) -> None:
    """``NAME.csv`` and ``NAME.png`` into ``--out`` (``-quick`` suffix with --quick)."""
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-quick" if args.quick else name
    table.to_csv(out / f"{stem}.csv", index=False, float_format="%.6g")
    save(fig, out / f"{stem}.png")
    print(out / f"{stem}.csv")
    print(out / f"{stem}.png")
