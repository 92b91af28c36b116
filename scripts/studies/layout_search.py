"""Study 7: does the layout search pick what the papers found best?

Each experiment is a search (``simulator.experiments.search.run_search``, the
``clustersim search`` command) over the layouts a paper compared, on the
paper's model, cluster and batch; every layout that fits is simulated, and the
study checks that the paper's best layout is ranked first or within 3 % of
the first (issue 16).

- Narayanan et al., SC21 (arXiv:2104.04473), 64 A100 (8 DGX A100):
  Fig. 13, tensor against pipeline parallelism, GPT 162.2B (32 layers, h 20480,
  128 heads), batch 32 and 128: best (t, p) = (8, 8); Fig. 14, pipeline against
  data parallelism, GPT 5.9B (32 layers, h 3840, 32 heads), batch 32, 128 and
  512: best p = 2 (the smallest that fits); Fig. 15, tensor against data
  parallelism, the same 5.9B: best t = 2; Fig. 16, micro-batch size at (t, p)
  = (8, 8), GPT 91B, batch 128 and 512: best micro-batch 2.
- Korthikanti et al., MLSys 2023 (arXiv:2205.05198), Tables 3 and 5: 22B, 175B,
  530B and 1T on 8-512 A100; best: selective recomputation with sequence
  parallelism (against full recomputation, and none where it fits).

Assumptions the papers do not state: fp16 (SC21) or bf16 (Korthikanti), no
fused attention (2021-22 Megatron), full recomputation and the plain 1F1B
schedule in SC21's Figs. 13-16, micro-batch 1 except Fig. 16; the 91B model's
shape (72 layers of h 10240, 80 heads: 91.1B with the embedding); sequence
parallelism wherever tp > 1 (the search's rule; it does not change a step's
communication volume). Tensor parallelism beyond a server (SC21's t = 16 and
32) is not a valid layout for the search, so those bars of SC21's figures
have no counterpart here.

    python scripts/studies/layout_search.py [--quick]
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import yaml
from common import OKABE_ITO, options, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.experiments.search import run_search

NAME = "layout_search"
WITHIN = 0.03  # the test: the paper's best within 3 % of the search's first
A100_PEAK = 312e12  # dense fp16/bf16 FLOP/s (the model FLOPs per GPU in the figure)

SC21 = "Narayanan et al. SC21"
KORTHIKANTI = "Korthikanti et al. 2023"
GPT_162B = {"layers": 32, "hidden": 20480, "heads": 128, "vocab": 51200}
GPT_5_9B = {"layers": 32, "hidden": 3840, "heads": 32, "vocab": 51200}
GPT_91B = {"layers": 72, "hidden": 10240, "heads": 80, "vocab": 51200}
KORTHIKANTI_MODELS = {  # layers, hidden, heads, pp, virtual stages, batch, micro-batch
    "22B": (48, 6144, 64, 1, 1, 4, 4), "175B": (96, 12288, 96, 8, 3, 64, 1),
    "530B": (105, 20480, 128, 35, 3, 280, 1), "1T": (128, 25600, 160, 64, 2, 512, 1)}


def scenario(name: str, gpus: int, model: dict, batch: int, precision: str) -> dict:
    return {"name": name, "seed": 0, "cluster": {"preset": "dgx-a100", "nodes": gpus // 8},
            "model": model, "training": {"seq_len": 2048, "global_batch": batch,
                                         "micro_batch": 1, "precision": precision,
                                         "flash_attention": False}}


def experiments(quick: bool) -> list[dict]:
    """Each search: its figure, batch, base scenario, space and the paper's best
    (the layout fields it fixes)."""
    full1 = {"recompute": ["full"], "zero": [0], "schedule": ["1f1b"], "cp": [1]}
    if quick:
        model = {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 51200}
        return [dict(figure="Fig. 14 (quick)", paper=SC21, batch=16,
                     base=scenario("quick", 8, model, 16, "fp16"),
                     space={**full1, "tp": [1], "pp": [2, 4], "mbs": [1]}, best={"pp": 2})]
    out = []
    for batch in (32, 128):
        out.append(dict(figure="Fig. 13: tp vs pp, 162B", paper=SC21, batch=batch,
                        base=scenario("sc21-fig13", 64, GPT_162B, batch, "fp16"),
                        space={**full1, "tp": [2, 4, 8, 16, 32], "pp": [2, 4, 8, 16, 32],
                               "mbs": [1]}, best={"tp": 8, "pp": 8}))
    for batch in (32, 128, 512):
        out.append(dict(figure="Fig. 14: pp vs dp, 5.9B", paper=SC21, batch=batch,
                        base=scenario("sc21-fig14", 64, GPT_5_9B, batch, "fp16"),
                        space={**full1, "tp": [1], "pp": [1, 2, 4, 8, 16, 32], "mbs": [1]},
                        best={"pp": 2}))
    for batch in (32, 128, 512):
        out.append(dict(figure="Fig. 15: tp vs dp, 5.9B", paper=SC21, batch=batch,
                        base=scenario("sc21-fig15", 64, GPT_5_9B, batch, "fp16"),
                        space={**full1, "tp": [1, 2, 4, 8, 16, 32], "pp": [1], "mbs": [1]},
                        best={"tp": 2}))
    for batch in (128, 512):
        out.append(dict(figure="Fig. 16: micro-batch, 91B", paper=SC21, batch=batch,
                        base=scenario("sc21-fig16", 64, GPT_91B, batch, "fp16"),
                        space={**full1, "tp": [8], "pp": [8], "mbs": [1, 2, 4, 8]},
                        best={"mbs": 2}))
    for size, (layers, hidden, heads, pp, v, batch, micro) in KORTHIKANTI_MODELS.items():
        schedule = {"schedule": ["interleaved"], "virtual_stages": [v]} if pp > 1 else {
            "schedule": ["1f1b"]}
        out.append(dict(figure="Korthikanti: recompute", paper=KORTHIKANTI, batch=batch,
                        series=size, x="recompute",
                        base=scenario(f"korthikanti-{size}", 8 * pp,
                                      {"layers": layers, "hidden": hidden, "heads": heads,
                                       "vocab": 51200}, batch, "bf16"),
                        space={"tp": [8], "pp": [pp], "cp": [1], "mbs": [micro], "zero": [0],
                               "recompute": ["none", "selective", "full"], **schedule},
                        best={"recompute": "selective"}))
    return out


def search(args, case: dict) -> pd.DataFrame:
    """The case's search (resumable in ``--runs``), its table with the paper's best
    marked and the study's columns."""
    folder = Path(args.runs) / NAME / f"{case['base']['name']}-b{case['batch']}"
    folder.mkdir(parents=True, exist_ok=True)
    base = folder / "base.yaml"
    base.write_text(yaml.safe_dump(case["base"], sort_keys=False))
    table, refused = run_search(base, case["space"], folder / "search", top=16,
                                workers=args.workers)
    refused_rows = pd.DataFrame([{"layout": layout.label, "status": "refused", "why": why,
                                  **{k: getattr(layout, k) for k in case["best"]}}
                                 for layout, why in refused.items()])
    table = pd.concat([table, refused_rows], ignore_index=True)
    table["published_best"] = np.logical_and.reduce(
        [table[k] == v for k, v in case["best"].items()])
    table["model_tflops_per_gpu"] = table["mfu"] * A100_PEAK / 1e12
    table["x"] = (table["recompute"] if case.get("x") == "recompute" else
                  table["layout"].map(_short))
    table.insert(0, "series", case.get("series", f"batch {case['batch']}"))
    table.insert(0, "batch", case["batch"])
    table.insert(0, "figure", case["figure"])
    table.insert(0, "paper", case["paper"])
    return table


def verdict(table: pd.DataFrame) -> dict:
    """Where the paper's best landed: its rank among the simulated layouts and its
    iteration time's excess over the first's."""
    sim = table[table["status"] == "simulated"].sort_values("iteration_time_s")
    first = sim.iloc[0]
    mine = sim[sim["published_best"]]
    if mine.empty:
        status = table.loc[table["published_best"], "status"]
        where = status.iloc[0] if len(status) else "not in the space"
        return {"search_first": first["layout"], "published_rank": None, "gap_pct": None,
                "ok": False, "note": f"the paper's best: {where}"}
    rank = int(np.flatnonzero(sim["published_best"].to_numpy())[0]) + 1
    gap = 100 * (mine["iteration_time_s"].iloc[0] / first["iteration_time_s"] - 1)
    return {"search_first": first["layout"], "published_rank": rank, "gap_pct": gap,
            "ok": gap <= 100 * WITHIN, "note": ""}


def figure(table: pd.DataFrame, verdicts: pd.DataFrame):
    """A panel per experiment: model TFLOP/s per GPU of each simulated layout, a
    bar per batch (or model), the paper's best outlined, the search's first starred."""
    panels = list(dict.fromkeys(table["figure"]))
    cols = min(3, len(panels))
    rows = -(-len(panels) // cols)
    fig = Figure(figsize=(5.2 * cols, 3.7 * rows), layout="constrained")
    FigureCanvasAgg(fig)
    for k, name in enumerate(panels):
        ax = fig.add_subplot(rows, cols, k + 1)
        part = table[(table["figure"] == name) & (table["status"] == "simulated")]
        series = list(dict.fromkeys(part["series"]))
        xs = list(dict.fromkeys(part.sort_values("model_tflops_per_gpu", ascending=False)["x"]))
        width = 0.8 / len(series)
        for j, label in enumerate(series):
            mine = part[part["series"] == label].set_index("x")
            x = np.arange(len(xs)) + (j - (len(series) - 1) / 2) * width
            values = np.array([mine["model_tflops_per_gpu"].get(v, np.nan) for v in xs])
            edges = ["black" if v in mine.index and mine.loc[v, "published_best"] else "none"
                     for v in xs]
            ax.bar(x, values, width, color=OKABE_ITO[j % len(OKABE_ITO)], edgecolor=edges,
                   linewidth=1.6, label=label)
            best = int(np.nanargmax(values))
            ax.plot(x[best], values[best] + 6, marker="*", color="black", markersize=8)
        ax.set_xticks(np.arange(len(xs)))
        ax.set_xticklabels(xs, rotation=25 if len(xs) > 3 else 0, ha="right" if len(xs) > 3
                           else "center", fontsize=7)
        ax.set_ylabel("model TFLOP/s per GPU")
        ax.set_ylim(0, part["model_tflops_per_gpu"].max() * 1.15)
        mine = verdicts[verdicts["figure"] == name]
        ax.set_title(f"{name}\npaper's best first or within 3 %: {int(mine['ok'].sum())} of "
                     f"{len(mine)}", fontsize=9)
        ax.legend(fontsize=7, loc="lower left", framealpha=0.9)
    fig.suptitle("Layout search against the papers (outlined: the paper's best; star: the "
                 "search's first)", fontsize=10)
    return fig


def _short(label: str) -> str:
    """A layout's label without the fields every bar of a panel shares."""
    keep = [p for p in label.split() if not p.startswith(("1f1b", "zero", "full"))]
    return " ".join(keep)


def main() -> None:
    args = options(__doc__)
    cases = experiments(args.quick)
    tables, verdicts = [], []
    for case in cases:
        table = search(args, case)
        tables.append(table)
        verdicts.append({"paper": case["paper"], "figure": case["figure"],
                         "series": table["series"].iloc[0], **verdict(table)})
    table, verdicts = pd.concat(tables, ignore_index=True), pd.DataFrame(verdicts)
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(verdicts.to_string(index=False))
    print(f"paper's best first or within 3 %: {int(verdicts['ok'].sum())} of {len(verdicts)}")
    columns = ["paper", "figure", "batch", "series", "rank", "layout", "status", "published_best",
               "iteration_time_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib",
               "exposed_comm_s", "bubble_s", "estimate_s", "estimate_error_pct", "why"]
    write(args, NAME, table[columns], figure(table, verdicts))
    stem = f"{NAME}-quick" if args.quick else NAME
    verdicts.to_csv(Path(args.out) / f"{stem}-verdicts.csv", index=False, float_format="%.4g")


if __name__ == "__main__":
    main()
