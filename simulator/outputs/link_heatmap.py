"""Link utilisation over time as a heat map: one row per link, the busiest
first, one column per time bin; the colour is the share of the link's
bandwidth in use (each call's bytes spread evenly over its run, as the trace's
counters). A link that failed or degraded during the run is measured against
what it could carry then, so a crawling degraded link shows as saturated."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.style import save, time_unit

SCALE = colormaps["viridis"]  # perceptually uniform and colour-blind safe


def plot_link_heatmap(use: np.ndarray, names: list[str], end: float, path: str | Path,
                      title: str = "") -> Path:
    """``use``: (links, bins) shares of each link's bandwidth in use over equal
    bins from 0 to ``end`` seconds; ``names``: one label per row."""
    unit, scale = time_unit(end)
    fig = Figure(figsize=(9.0, 1.2 + 0.28 * len(names)))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(np.clip(use, 0.0, 1.0), aspect="auto", cmap=SCALE, vmin=0.0, vmax=1.0,
                      interpolation="nearest", extent=(0.0, end * scale, len(names), 0))
    ax.set_yticks(np.arange(len(names)) + 0.5, labels=names, fontsize=7)
    ax.set_xlabel(f"time ({unit})")
    ax.set_title(title or "link utilisation", fontsize=10)
    bar = fig.colorbar(image, ax=ax, pad=0.01)
    bar.set_label("share of bandwidth in use", fontsize=8)
    fig.tight_layout()
    return save(fig, path)
