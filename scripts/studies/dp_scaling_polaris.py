"""Study 5: a low-bandwidth system (Polaris-like: 4 A100-40GB and 2 NICs per
node) against a DGX A100 cluster (8 A100-80GB, 8 NICs per node).

(a) data-parallel weak scaling of GPT-3 1.3B from 8 to 512 GPUs: compute
versus exposed communication per iteration; (b) ZeRO-1/2/3 over six model
sizes on 64 GPUs: throughput, and which do not fit; (c) three TP/PP
combinations for GPT-3 6.7B on 64 GPUs. One rank per pipeline stage is
simulated (``simulation.fold_ranks``: data-parallel peers are identical).
Writes dp_scaling_polaris.csv (a ``part`` column) and .png.

    python scripts/studies/dp_scaling_polaris.py [--quick]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "dp_scaling_polaris"
SYSTEMS = {"polaris": 4, "dgx-a100": 8}  # preset -> GPUs per node
MODELS = ["gpt3-350m", "gpt3-760m", "gpt3-1.3b", "gpt3-2.7b", "gpt3-6.7b", "gpt3-13b"]
COMBOS = [(4, 1, 16), (1, 4, 16), (4, 4, 4)]  # (tp, pp, dp)


def base(system: str, nodes: int) -> dict:
    return {
        "name": f"{NAME}-{system}", "seed": 0,
        "cluster": {"preset": system, "nodes": nodes},
        "model": {"preset": "gpt3-1.3b"},
        "training": {"seq_len": 2048, "global_batch": 64, "micro_batch": 1},
        "parallelism": {"dp": nodes * SYSTEMS[system]},
        "simulation": {"fold_ranks": True, "span_detail": "layer"},
    }


def scaling(args, system: str) -> pd.DataFrame:
    gpus = [8, 32] if args.quick else [8, 32, 128, 512]
    per_node = SYSTEMS[system]
    zipped = {"cluster.nodes": [g // per_node for g in gpus], "parallelism.dp": gpus,
              "training.global_batch": [4 * g for g in gpus]}  # 4 micro-batches per rank
    table = run_design(args, f"{NAME}-scaling-{system}", base(system, 2), {}, zipped)
    return table.assign(part="a: DP scaling", system=system)


def zero(args, system: str) -> pd.DataFrame:
    nodes = (16 if args.quick else 64) // SYSTEMS[system]
    grid = {"parallelism.zero": [1, 3] if args.quick else [1, 2, 3],
            "model.preset": MODELS[:2] if args.quick else MODELS}
    table = run_design(args, f"{NAME}-zero-{system}", base(system, nodes), grid)
    return table.assign(part="b: ZeRO", system=system)


def combos(args, system: str) -> pd.DataFrame:
    nodes = 64 // SYSTEMS[system]
    scenario = base(system, nodes)
    scenario["model"]["preset"] = "gpt3-1.3b" if args.quick else "gpt3-6.7b"
    chosen = COMBOS[:1] if args.quick else COMBOS
    zipped = {"parallelism.tp": [c[0] for c in chosen], "parallelism.pp": [c[1] for c in chosen],
              "parallelism.dp": [c[2] for c in chosen]}
    table = run_design(args, f"{NAME}-combos-{system}", scenario, {}, zipped)
    return table.assign(part="c: TP/PP", system=system)


def _scaling_panel(ax, table: pd.DataFrame) -> None:
    for n, (system, part) in enumerate(table.groupby("system", sort=False)):
        part = part.sort_values("gpus")
        ax.plot(part["gpus"], part["compute_s"], marker="o", color=OKABE_ITO[n],
                label=f"{system} compute")
        ax.plot(part["gpus"], part["exposed_comm_s"], marker="s", linestyle="--",
                color=OKABE_ITO[n], label=f"{system} exposed comm.")
    ax.set_xscale("log", base=2)
    ticks = sorted(set(table["gpus"]))
    ax.set_xticks(ticks, [str(int(t)) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("GPUs")
    ax.set_ylabel("seconds per iteration")
    ax.set_title("(a) GPT-3 1.3B data-parallel weak scaling")


def _zero_panel(ax, table: pd.DataFrame) -> None:
    for n, ((system, stage), part) in enumerate(table.groupby(["system", "parallelism.zero"],
                                                              sort=False)):
        part = part.set_index("model.preset").loc[[m for m in MODELS if m in
                                                   set(part["model.preset"])]]
        x = np.arange(len(part))
        ax.plot(x, part["model_tflops_per_gpu"], marker="osD"[int(stage) - 1],
                color=OKABE_ITO[n % 8], linestyle="-" if system == "polaris" else ":",
                label=f"{system} ZeRO-{int(stage)}", markerfacecolor="none")
        oom = part["oom"].to_numpy(bool)
        ax.scatter(x[oom], part["model_tflops_per_gpu"].to_numpy()[oom], marker="x", s=60,
                   color="black", zorder=3)
        ax.set_xticks(x, [m.removeprefix("gpt3-") for m in part.index])
    ax.set_xlabel("GPT-3 model (x: does not fit)")
    ax.set_ylabel("model TFLOP/s per GPU")
    ax.set_title("(b) ZeRO stages on 64 GPUs")


def _combo_panel(ax, table: pd.DataFrame) -> None:
    labels = [f"tp{t:.0f} pp{p:.0f} dp{d:.0f}" for t, p, d in zip(table["parallelism.tp"],
                                                      table["parallelism.pp"],
                                                      table["parallelism.dp"], strict=True)]
    table = table.assign(label=labels)
    combos_seen = list(dict.fromkeys(labels))
    for n, (system, part) in enumerate(table.groupby("system", sort=False)):
        part = part.set_index("label").loc[combos_seen]
        ax.bar(np.arange(len(part)) + n * 0.4 - 0.2, part["model_tflops_per_gpu"], width=0.4,
               color=OKABE_ITO[n], label=system)
    ax.set_xticks(range(len(combos_seen)), combos_seen)
    ax.set_ylabel("model TFLOP/s per GPU")
    ax.set_title("(c) GPT-3 6.7B, TP/PP on 64 GPUs")


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(15, 4.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    _scaling_panel(axes[0], table[table["part"].str.startswith("a")])
    _zero_panel(axes[1], table[table["part"].str.startswith("b")])
    _combo_panel(axes[2], table[table["part"].str.startswith("c")])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=7)
    fig.suptitle("Polaris-like (4 A100-40GB, 2 NICs per node) vs DGX A100 (8 A100-80GB, "
                 "8 NICs per node)")
    return fig


def main() -> None:
    args = options(__doc__)
    parts = [f(args, system) for f in (scaling, zero, combos) for system in SYSTEMS]
    table = pd.concat(parts, ignore_index=True)
    columns = ["part", "system", "gpus", "model.preset", "parallelism.zero", "parallelism.tp",
               "parallelism.pp", "parallelism.dp", "iteration_time_s", "compute_s",
               "exposed_comm_s", "model_tflops_per_gpu", "mfu", "peak_memory_gib", "oom"]
    write(args, NAME, table[columns], figure(table))
    print(table[columns].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
