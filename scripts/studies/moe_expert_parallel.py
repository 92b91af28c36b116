"""Study 8: expert parallelism: its all-to-all cost against token imbalance.

A DeepSeek-V2-Lite-shaped MoE (DeepSeek-AI 2024, config.json: 27 layers of
2048, the first dense, 64 routed experts of 1408 with top 6 and 2 shared;
multi-head latent attention modelled as standard attention) trained on 64
H100 (8 DGX H100) on a rail-optimized fabric (NCCL's PXN: traffic crosses
NVLink to the GPU on the destination's rail first), data parallel 64 with
ZeRO-1, sequence 4096, global batch 256. For each expert-parallel size (1 to
64) and routing (balanced; uniform; Zipf with skew 0.3 and 0.6, whose busiest
expert gets about 2.5x and 5.5x the mean expert's tokens): the iteration
time, the all-to-all time per iteration of one rank, the busiest EP rank's load
against the mean, and the peak memory. Then, with balanced routing, each
dispatcher (Megatron-Core's all-to-all; DeepEP, in two hops once EP leaves the
server) without and with the all-to-all overlap of Megatron-Core's combined
1F1B schedule (``parallelism.moe_overlap: 1f1b``): the iteration time and the
all-to-all time hidden under compute. Last, with a pipeline of 4 stages (DeepEP,
EP 8 and 16 inside each stage's 16 ranks): plain 1F1B, the combined 1F1B
schedule (interleaved, 2 chunks a stage) and DeepSeek's DualPipe
(``moe_overlap: dualpipe``). Writes moe_expert_parallel.csv and .png.

    python scripts/studies/moe_expert_parallel.py [--quick]
"""

from __future__ import annotations

import pandas as pd
from common import OKABE_ITO, options, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator import run

NAME = "moe_expert_parallel"
V2_LITE = {"layers": 27, "hidden": 2048, "heads": 16, "kv_heads": 16, "ffn_hidden": 10944,
           "vocab": 102400, "mlp": "swiglu", "tied_embeddings": False, "experts": 64,
           "top_k": 6, "expert_ffn_hidden": 1408, "shared_experts": 2,
           "first_dense_layers": 1}
ROUTINGS = {"balanced": ("balanced", 1.0), "uniform": ("uniform", 1.0),
            "zipf 0.3": ("zipf", 0.3), "zipf 0.6": ("zipf", 0.6)}
# (dispatcher, all-to-all overlap) with balanced routing; the first is the routings' own
MODES = (("alltoall", "none"), ("alltoall", "1f1b"), ("flex", "none"), ("flex", "1f1b"))
# with a pipeline: (label, parallelism keys), DeepEP and balanced routing
PIPELINES = (("plain 1F1B", {"moe_overlap": "none"}),
             ("combined 1F1B", {"moe_overlap": "1f1b", "schedule": "interleaved",
                                "virtual_stages": 2}),
             ("DualPipe", {"moe_overlap": "dualpipe"}))


def design(quick: bool) -> tuple[dict, list[int], dict]:
    model = dict(V2_LITE)
    nodes, batch = 8, 256
    eps = [1, 2, 4, 8, 16, 32, 64]
    routings = ROUTINGS
    if quick:
        model.update(layers=3, hidden=512, heads=8, kv_heads=8, ffn_hidden=1024, vocab=8192,
                     expert_ffn_hidden=256)
        nodes, batch, eps = 2, 32, [2, 16]
        routings = {k: ROUTINGS[k] for k in ("balanced", "zipf 0.6")}
    base = {"name": NAME, "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": nodes,
                        "fabric": {"type": "rail_optimized"}},
            "model": model,
            "training": {"seq_len": 4096 if not quick else 1024, "global_batch": batch,
                         "micro_batch": 1, "precision": "bf16", "recompute": "selective"},
            "parallelism": {"tp": 1, "pp": 1, "zero": 1}}
    return base, eps, routings


def pipelined(base: dict, ep: int, label: str, keys: dict, quick: bool) -> dict:
    """One pipeline case: 4 stages (2 and a 4-layer model with --quick), the layers
    split as evenly as they go, DeepEP, balanced routing."""
    pp = 2 if quick else 4
    model = {**base["model"], "layers": 4} if quick else base["model"]
    layers = model["layers"]
    stages = [layers // pp + (1 if s < layers % pp else 0) for s in range(pp)]
    scenario = {**base, "model": model,
                "parallelism": {**base["parallelism"], "pp": pp, "stage_layers": stages,
                                **keys}}
    return {"pipeline": label, **case(scenario, ep, "balanced", 1.0, "flex",
                                      keys["moe_overlap"])}


def case(base: dict, ep: int, routing: str, skew: float, dispatcher: str = "alltoall",
         overlap: str = "none") -> dict:
    scenario = {**base, "model": {**base["model"], "routing": routing, "routing_skew": skew},
                "parallelism": {**base["parallelism"], "ep": ep,
                                "moe_token_dispatcher_type": dispatcher,
                                "moe_overlap": overlap}}
    result = run(scenario)
    s = result.summary
    comms = result.comms
    mine = comms[(comms["group"] == "ep") & (comms["group_index"] == 0)]
    return {"ep": ep, "pp": scenario["parallelism"].get("pp", 1),
            "dispatcher": dispatcher, "moe_overlap": overlap,
            "iteration_time_s": s["iteration_time_s"], "mfu": s["mfu"],
            "all_to_all_s": float((mine["end"] - mine["start"]).sum()) if len(mine)
            else float("nan"),  # (DeepEP's two hops: the exchanges' union below)
            "exchanges_s": s["moe_a2a_s"], "exchanges_hidden_s": s["moe_a2a_hidden_s"],
            "all_to_all_calls": len(mine),
            "rank_imbalance": s["moe_rank_imbalance"],
            "expert_imbalance": s["moe_expert_imbalance"],
            "peak_memory_gib": s["peak_memory_gib"], "oom": s["oom"]}


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(22, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 5)
    pipelines, table = table[table["pp"] > 1], table[table["pp"] == 1]
    plain = (table["dispatcher"] == "alltoall") & (table["moe_overlap"] == "none")
    for n, (label, part) in enumerate(table[plain].groupby("routing", sort=False)):
        style = dict(color=OKABE_ITO[n], marker="o", label=label)
        axes[0].plot(part["ep"], part["iteration_time_s"], **style)
        axes[1].plot(part["ep"], part["all_to_all_s"], **style)
        axes[2].plot(part["ep"], part["rank_imbalance"], **style)
    balanced = table[table["routing"] == "balanced"]
    for n, ((dispatcher, overlap), part) in enumerate(balanced.groupby(
            ["dispatcher", "moe_overlap"], sort=False)):
        axes[3].plot(part["ep"], part["iteration_time_s"], color=OKABE_ITO[n], marker="o",
                     ls="-" if overlap == "none" else "--",
                     label=f"{'DeepEP' if dispatcher == 'flex' else 'all-to-all'}"
                           f"{', 1F1B overlap' if overlap != 'none' else ''}")
    axes[3].legend(frameon=False, fontsize=8)
    _pipelines(axes[4], pipelines)
    titles = ("iteration time (s)", "one rank's all-to-alls per iteration (s)",
              "busiest EP rank's tokens / mean rank's",
              "balanced: dispatcher and overlap, iteration time (s)")
    for ax, title in zip(axes[:4], titles, strict=True):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("expert-parallel size")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    gpus_per_node = 8
    for ax in (axes[0], axes[1], axes[3]):
        ax.axvline(gpus_per_node, color="grey", lw=0.8, ls="--")
        ax.text(gpus_per_node * 1.05, ax.get_ylim()[1] * 0.95, "EP leaves the server",
                fontsize=7, va="top", color="grey")
    axes[0].legend(frameon=False, fontsize=8)
    fig.suptitle("Expert parallelism on 64 H100 (rail-optimized): all-to-all cost against "
                 "token imbalance", fontsize=11)
    return fig


def _pipelines(ax, table: pd.DataFrame) -> None:
    """Bars: each pipeline schedule's iteration time per EP size, the part of its
    exchanges hidden under compute hatched on top."""
    labels = [label for label, _ in PIPELINES]
    eps = sorted(table["ep"].unique())
    width = 0.8 / len(labels)
    for n, label in enumerate(labels):
        part = table[table["pipeline"] == label].set_index("ep").reindex(eps)
        x = [i + (n - (len(labels) - 1) / 2) * width for i in range(len(eps))]
        ax.bar(x, part["iteration_time_s"], width, color=OKABE_ITO[n], label=label)
        ax.bar(x, part["exchanges_hidden_s"], width, bottom=part["iteration_time_s"] -
               part["exchanges_hidden_s"], color="none", edgecolor="black", hatch="//",
               lw=0.5, label="exchanges under compute" if n == 0 else None)
    ax.set_xticks(range(len(eps)), [f"EP {ep}" for ep in eps])
    pp = int(table["pp"].iloc[0]) if len(table) else 0
    ax.set_title(f"pipeline of {pp} stages, DeepEP: iteration time (s)", fontsize=10)
    if len(table):
        ax.set_ylim(0, float(table["iteration_time_s"].max()) * 1.35)
    ax.legend(frameon=False, fontsize=8, ncol=2, loc="upper left")
    ax.grid(alpha=0.3, axis="y")


def main() -> None:
    args = options(__doc__)
    base, eps, routings = design(args.quick)
    rows = [{"routing": label, **case(base, ep, routing, skew)}
            for label, (routing, skew) in routings.items() for ep in eps]
    rows += [{"routing": "balanced", **case(base, ep, "balanced", 1.0, dispatcher, overlap)}
             for dispatcher, overlap in MODES[1:] for ep in eps if ep > 1]
    rows += [{"routing": "balanced", **pipelined(base, ep, label, keys, args.quick)}
             for label, keys in PIPELINES for ep in ([2] if args.quick else [8, 16])]
    table = pd.DataFrame(rows)
    plain = table[(table["routing"] == "balanced") & (table["dispatcher"] == "alltoall")
                  & (table["moe_overlap"] == "none") & (table["pp"] == 1)
                  ].set_index("ep")["iteration_time_s"]
    table["imbalance_cost_pct"] = (100 * (table["iteration_time_s"] /
                                          table["ep"].map(plain) - 1)).where(table["pp"] == 1)
    write(args, NAME, table, figure(table))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
