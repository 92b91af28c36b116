"""Study 3: pipeline partitioning, even versus uneven stage layouts.

GPT-3 2.7B (32 layers) in a 4-stage 1F1B pipeline with data parallelism 2 on
one DGX A100 (global batch 64). The first stage also holds the embedding and
the last one the logits and the loss; moving layers off them trades memory
and compute between stages. For each layout: the peak memory of every stage
(1F1B keeps more micro-batches in flight on early stages), the compute time
of every stage (the slowest sets the pace) and the iteration time. Writes
pipeline_partition.csv and .png.

    python scripts/studies/pipeline_partition.py [--quick]
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "pipeline_partition"


def design(quick: bool) -> tuple[dict, dict]:
    base = {
        "name": NAME, "seed": 0,
        "cluster": {"preset": "dgx-a100", "nodes": 1},
        "model": {"preset": "gpt3-350m" if quick else "gpt3-2.7b"},
        "training": {"seq_len": 2048, "global_batch": 16 if quick else 64, "micro_batch": 1},
        "parallelism": {"pp": 4, "dp": 2, "schedule": "1f1b"},
        "simulation": {"span_detail": "layer"},
    }
    layouts = ([[6, 6, 6, 6], [5, 7, 7, 5]] if quick else
               [[8, 8, 8, 8], [7, 8, 8, 9], [9, 8, 8, 7], [8, 9, 9, 6], [7, 9, 9, 7],
                [10, 8, 7, 7]])
    return base, {"parallelism.stage_layers": layouts}


def per_stage(table: pd.DataFrame) -> pd.DataFrame:
    """One row per (layout, stage)."""
    rows = []
    for row in table.to_dict("records"):
        layout = json.loads(row["parallelism.stage_layers"])
        memory = json.loads(row["peak_memory_gib_by_stage"])
        compute = json.loads(row["compute_s_by_stage"])
        for stage, (layers, gib, seconds) in enumerate(zip(layout, memory, compute,
                                                           strict=True)):
            rows.append({"layout": str(layout), "stage": stage, "layers": layers,
                         "peak_memory_gib": gib, "compute_s": seconds,
                         "iteration_time_s": row["iteration_time_s"]})
    return pd.DataFrame(rows)


def figure(stages: pd.DataFrame):
    layouts = list(dict.fromkeys(stages["layout"]))
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    width = 0.8 / len(layouts)
    for n, layout in enumerate(layouts):
        part = stages[stages["layout"] == layout]
        x = part["stage"].to_numpy() + n * width - 0.4 + width / 2
        for ax, column in zip(axes[:2], ("peak_memory_gib", "compute_s"), strict=True):
            ax.bar(x, part[column], width=width, color=OKABE_ITO[n % 8], label=layout)
        axes[2].bar(n, part["iteration_time_s"].iloc[0], color=OKABE_ITO[n % 8])
    for ax, label in zip(axes[:2], ("peak memory (GiB)", "compute per iteration (s)"),
                         strict=True):
        ax.set_xticks(range(4), [f"stage {s}" for s in range(4)])
        ax.set_ylabel(label)
        ax.grid(axis="y", alpha=0.3)
    axes[1].set_ylim(bottom=float(np.min(stages["compute_s"])) * 0.8)
    axes[0].set_title("peak memory per stage")
    axes[1].set_title("compute per stage (slowest sets the pace)")
    axes[2].set_xticks(range(len(layouts)), layouts, rotation=30, ha="right", fontsize=7)
    axes[2].set_ylim(bottom=float(stages["iteration_time_s"].min()) * 0.95)
    axes[2].set_ylabel("iteration time (s)")
    axes[2].set_title("iteration time")
    axes[0].legend(title="layers per stage", fontsize=7, frameon=False)
    fig.suptitle("1F1B pipeline partitioning: even and uneven stage layouts")
    return fig


def main() -> None:
    args = options(__doc__)
    base, zipped = design(args.quick)
    table = run_design(args, NAME, base, {}, zipped)
    stages = per_stage(table)
    write(args, NAME, stages, figure(stages))
    print(stages.round(3).to_string(index=False))


if __name__ == "__main__":
    main()
