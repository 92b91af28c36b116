"""Study 13: what a rack-scale NVLink domain buys: GB200 NVL72 racks against the
same GPUs in 8-GPU servers.

The same two models on 2, 4 and 8 racks (the dense model: 2 and 4; its
searches take the longest) of 72 GB200 GPUs (NVLink 5 across the rack, a
ConnectX-7 400 Gb/s per GPU between racks) and on as many B200 GPUs
in DGX B200 servers (NVLink 5 inside each 8-GPU server, 8 x 400 Gb/s between):
a Qwen3-235B-A22B-like MoE (94 layers in the real model, 96 here so that
pipeline stages divide them; 128 experts of 1536, top 8) and a Llama 3
405B-like dense model. For each, ``clustersim search`` finds the fastest
layout (tp within the NVLink domain, up to 4 for the MoE and 32 for the
dense model: a rack's 72 GPUs or a server's 8; pp among the divisors of the
layers up to 18; ep 8 to 64 for the MoE on both systems, across servers
where it must)
with micro-batch 1, selective or full recompute, 1F1B or interleaved (2 or 3
chunks), ZeRO-1, the top 2 estimates simulated; sequence 4096, 1,152
sequences a step, bf16. The GB200 and the B200 are timed by the same
roofline (H100's GEMM efficiencies, cuDNN's attention figure) and differ in
peak (2.5 against 2.25 PFLOP/s) and memory (186 against 180 GB), so the
difference is mostly the fabric's. Reported: the best layout, its iteration
time, MFU and exposed communication. Writes nvlink_domain.csv and .png.

    python scripts/studies/nvlink_domain.py [--quick]
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml
from common import OKABE_ITO, options, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.experiments.search import run_search

NAME = "nvlink_domain"
QWEN3_235B_LIKE = {"layers": 96, "hidden": 4096, "heads": 64, "kv_heads": 4,
                   "ffn_hidden": 12288, "vocab": 151936, "mlp": "swiglu",
                   "tied_embeddings": False, "experts": 128, "top_k": 8,
                   "expert_ffn_hidden": 1536, "head_size": 128}
MODELS = {"MoE (Qwen3-235B-like)": QWEN3_235B_LIKE, "dense (Llama 3 405B-like)":
          {"preset": "llama3-405b"}}
SYSTEMS = {"GB200 NVL72": ("gb200-nvl72", 18), "DGX B200": ("dgx-b200", 9)}  # trays a rack


def design(quick: bool) -> tuple[dict, dict, dict, int, int]:
    """(racks per model, models, search space per model, sequence, global batch)."""
    common = {"mbs": [1], "recompute": ["selective", "full"], "zero": [1],
              "schedule": ["1f1b", "interleaved"], "virtual_stages": [2, 3]}
    spaces = {"MoE (Qwen3-235B-like)": {"tp": [1, 2, 4], "pp": [2, 3, 4, 6, 8, 12, 16],
                                        "ep": [8, 16, 32, 64], **common},
              "dense (Llama 3 405B-like)": {"tp": [2, 4, 8, 16, 32],
                                            "pp": [1, 2, 3, 6, 7, 9, 14, 18], **common}}
    if quick:
        small = {**QWEN3_235B_LIKE, "layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4,
                 "ffn_hidden": 2048, "vocab": 8192, "experts": 16, "expert_ffn_hidden": 256}
        models = {"MoE": small, "dense": {"layers": 4, "hidden": 1024, "heads": 16,
                                          "vocab": 8192}}
        space = {"tp": [1, 4], "pp": [1], "mbs": [1], "ep": [1, 8]}
        return {"MoE": [1], "dense": [1]}, models, {"MoE": space, "dense": space}, 1024, 72
    racks = {"MoE (Qwen3-235B-like)": [2, 4, 8], "dense (Llama 3 405B-like)": [2, 4]}
    return racks, MODELS, spaces, 4096, 1152


def base(system: str, racks: int, model: dict, seq: int, batch: int) -> dict:
    preset, per_rack = SYSTEMS[system]
    return {"name": f"{NAME}-{preset}-{racks}", "seed": 0,
            "cluster": {"preset": preset, "nodes": per_rack * racks},
            "model": dict(model),
            "training": {"seq_len": seq, "global_batch": batch, "micro_batch": 1,
                         "precision": "bf16", "recompute": "selective"},
            "parallelism": {"tp": 1, "pp": 1, "zero": 1}}


def best(args, label: str, scenario: dict, space: dict, gpus: int) -> dict:
    """The search's fastest simulated layout (resumable in ``--runs``)."""
    folder = Path(args.runs) / NAME / f"{scenario['name']}-{label.split()[0].lower()}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "base.yaml"
    path.write_text(yaml.safe_dump(scenario, sort_keys=False))
    space = {**space, **({} if scenario["model"].get("experts") else {"ep": [1]})}
    table, _ = run_search(path, space, folder / "search", top=2, workers=args.workers)
    simulated = table[table["status"] == "simulated"].sort_values("iteration_time_s")
    if simulated.empty:
        return {"layout": "none fits", "iteration_time_s": float("nan")}
    row = simulated.iloc[0]
    return {"layout": row["layout"], "tp": row["tp"], "pp": row["pp"], "ep": row["ep"],
            "iteration_time_s": row["iteration_time_s"], "mfu": row["mfu"],
            "exposed_comm_s": row["exposed_comm_s"], "bubble_s": row["bubble_s"],
            "tokens_per_s_per_gpu": row["tokens_per_s"] / gpus}


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(13, 7.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(table["model"].unique()), squeeze=False)
    for col, (model, part) in enumerate(table.groupby("model", sort=False)):
        for n, (system, rows) in enumerate(part.groupby("system", sort=False)):
            style = dict(color=OKABE_ITO[n], marker="o", label=system)
            axes[0][col].plot(rows["gpus"], rows["tokens_per_s_per_gpu"], **style)
            axes[1][col].plot(rows["gpus"], rows["exposed_comm_s"] / rows["iteration_time_s"]
                              * 100, **style)
            for row in rows.itertuples():
                axes[0][col].annotate(row.layout.replace(" selective", "").replace(
                    " zero1", ""), (row.gpus, row.tokens_per_s_per_gpu), fontsize=6,
                    xytext=(3, -10 if n else 4), textcoords="offset points",
                    color=OKABE_ITO[n])
        axes[0][col].set_title(f"{model}: tokens/s per GPU (best layout found)", fontsize=10)
        axes[1][col].set_title(f"{model}: exposed communication (% of the iteration)",
                               fontsize=10)
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("GPUs")
            ax.grid(alpha=0.3)
            ax.set_ylim(bottom=0)
    axes[0][0].legend(frameon=False, fontsize=8)
    fig.suptitle("An NVL72 rack's NVLink domain against 8-GPU servers (same GPU count, "
                 "searched layouts)", fontsize=11)
    return fig


def main() -> None:
    args = options(__doc__)
    racks_list, models, spaces, seq, batch = design(args.quick)
    rows = []
    for model, shape in models.items():
        for system in SYSTEMS:
            for racks in racks_list[model]:
                scenario = base(system, racks, shape, seq, batch)
                rows.append({"model": model, "system": system, "racks": racks,
                             "gpus": 72 * racks,
                             **best(args, model, scenario, spaces[model], 72 * racks)})
    table = pd.DataFrame(rows)
    write(args, NAME, table, figure(table))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
