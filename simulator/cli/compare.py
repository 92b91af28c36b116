"""``clustersim compare``: two finished runs side by side, and their Gantt charts."""

from __future__ import annotations

import argparse

from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs import run_dir
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    compare = sub.add_parser("compare", help="two finished runs side by side",
                             description="Print two runs' summaries side by side and draw "
                                         "their Gantt charts on one time axis.")
    compare.add_argument("run_a", help="the first run directory (clustersim run --out)")
    compare.add_argument("run_b", help="the second run directory")
    compare.add_argument("--out", help="figure file (default: RUN_B/compare.png)")
    compare.add_argument("--ranks", help="ranks to draw in both, e.g. 0-7,64")


COMPARED = ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "compute_s",
            "exposed_comm_s", "overlapped_comm_s", "comm_wait_s", "bubble_s", "idle_s",
            "peak_memory_gib", "gpus")


def run(args: argparse.Namespace) -> int:
    from simulator.outputs.gantt import compare_figure
    from simulator.outputs.style import save

    a, b = run_dir.read(args.run_a), run_dir.read(args.run_b)
    out = options.figure(args.out or b.path / "compare.png", "--out")
    ranks = options.ranks_option(args.ranks, max(len(a.placement), len(b.placement)))
    for finished in (a, b):  # drawn in both: each must have them (checked before printing)
        missing = [r for r in ranks or () if r >= len(finished.placement)]
        if missing:
            raise ScenarioError(f"--ranks: rank {missing[0]} is not in {finished.path} (its "
                                f"ranks are 0 to {len(finished.placement) - 1})")
    names = (a.name, b.name) if a.name != b.name else (f"A: {a.path.name}", f"B: {b.path.name}")
    print(f"{'':24} {names[0][:20]:>20} {names[1][:20]:>20} {'B / A':>8}")
    for key in COMPARED:
        va, vb = a.summary.get(key), b.summary.get(key)
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
            continue
        ratio = f"{vb / va:8.3f}" if va else f"{'-':>8}"
        print(f"{key:24} {va:20.6g} {vb:20.6g} {ratio}")
    # a folded run: the ranks asked for expanded from their classes, else a row per class
    spans = [r.spans_of(ranks) if ranks else r.spans for r in (a, b)]
    classes = (None, None) if ranks else (a.classes(), b.classes())
    figure = compare_figure(*spans, names, ranks, classes=classes)
    guarded(out, lambda: save(figure, out))
    print(f"figure           {out}")
    return 0
