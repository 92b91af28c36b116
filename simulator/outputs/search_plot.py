"""The layout search's figure: throughput against peak memory per GPU, one point
per layout (simulated filled, estimated hollow, over the GPU's memory crossed),
the Pareto front of the simulated layouts (no other is faster with less
memory) drawn through them, and the chosen layout annotated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.style import OKABE_ITO, save


def pareto_front(memory: np.ndarray, throughput: np.ndarray) -> np.ndarray:
    """Mask of the points no other point beats on both: as fast or faster with
    at most as much memory, and strictly better on one.

    >>> pareto_front(np.array([1.0, 2.0, 3.0, 2.5]), np.array([1.0, 3.0, 2.0, 3.0])).tolist()
    [True, True, False, False]
    """
    keep = np.ones(len(memory), dtype=bool)
    for i in range(len(memory)):
        better = (memory <= memory[i]) & (throughput >= throughput[i]) & (
            (memory < memory[i]) | (throughput > throughput[i]))
        keep[i] = not better.any()
    return keep


def plot(table: pd.DataFrame, capacity_gib: float, path: str | Path, title: str = ""
         ) -> Path:
    """Draw ``table`` (``experiments.search.ranked``'s) to ``path``."""
    fig = Figure(figsize=(7.5, 4.8))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    groups = {status: table[table["status"] == status] for status in
              ("estimated", "does not fit", "simulated")}
    est = groups["estimated"]
    ax.scatter(est["peak_memory_gib"], est["estimate_tokens_per_s"], s=14,
               facecolors="none", edgecolors="#999999", linewidths=0.7,
               label=f"estimated ({len(est)})")
    big = groups["does not fit"]
    ax.scatter(big["peak_memory_gib"], big["estimate_tokens_per_s"], s=12, marker="x",
               color=OKABE_ITO[5], linewidths=0.7, alpha=0.6,
               label=f"does not fit ({len(big)})")
    sim = groups["simulated"]
    ax.scatter(sim["peak_memory_gib"], sim["tokens_per_s"], s=26, color=OKABE_ITO[0],
               zorder=3, label=f"simulated ({len(sim)})")
    if len(sim):
        front = sim[pareto_front(sim["peak_memory_gib"].to_numpy(),
                                 sim["tokens_per_s"].to_numpy())]
        front = front.sort_values("peak_memory_gib")
        ax.step(front["peak_memory_gib"], front["tokens_per_s"], where="post",
                color=OKABE_ITO[1], linewidth=1.6, zorder=2, label="Pareto front")
        best = sim.sort_values("iteration_time_s").iloc[0]
        ax.scatter([best["peak_memory_gib"]], [best["tokens_per_s"]], s=140, marker="*",
                   color=OKABE_ITO[2], edgecolors="black", linewidths=0.6, zorder=4,
                   label="chosen")
        ax.annotate(best["layout"], (best["peak_memory_gib"], best["tokens_per_s"]),
                    xytext=(8, -14), textcoords="offset points", fontsize=8)
    ax.axvline(capacity_gib, color="black", linestyle="--", linewidth=0.8)
    ax.text(capacity_gib, ax.get_ylim()[1], "GPU memory ", ha="right", va="top", fontsize=8)
    ax.set_xlabel("peak memory per GPU (GiB)")
    ax.set_ylabel("throughput (tokens/s)")
    ax.set_title(title or "Layouts: throughput against memory")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    fig.tight_layout()
    return save(fig, path)
