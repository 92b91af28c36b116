"""``clustersim plot``: lines or a heatmap from a sweep's results."""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli import options
from simulator.config.scenario import ScenarioError


def add_parser(sub) -> None:
    plot = sub.add_parser("plot", help="draw a sweep's results",
                          description="Lines of --y against --x (one per --hue value), or a "
                                      "heatmap of --z over --x and --y.")
    plot.add_argument("sweep_dir", help="a directory written by clustersim sweep")
    plot.add_argument("--x", required=True, help="column for the x axis, e.g. cluster.nodes")
    plot.add_argument("--y", required=True, help="metric (line) or key (heatmap)")
    plot.add_argument("--hue", help="one line per value of this column")
    plot.add_argument("--z", help="metric for a heatmap over --x and --y")
    plot.add_argument("--out", help="figure file (default: DIR/plot.png)")


def run(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulator.outputs.sweep_plot import plot

    path = Path(args.sweep_dir) / "results.parquet"
    if not path.exists():
        raise ScenarioError(f"{args.sweep_dir}: no results.parquet (run clustersim sweep)")
    out = options.figure(args.out or Path(args.sweep_dir) / "plot.png", "--out")
    if args.hue and args.z:
        raise ScenarioError("--hue: a heatmap (--z) has no hue; give one of them")
    try:
        table = pd.read_parquet(path)
    except (OSError, ValueError) as error:  # pyarrow's errors are both
        raise ScenarioError(f"{path}: damaged ({str(error).splitlines()[0][:120]}); run the "
                            "sweep again to rewrite it from results.jsonl") from None
    try:
        plot(table, out, args.x, args.y, args.hue, args.z, title=Path(args.sweep_dir).name)
    except ValueError as error:
        raise ScenarioError(str(error)) from None
    print(out)
    return 0
