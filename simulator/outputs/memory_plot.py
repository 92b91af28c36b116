"""Memory over time: one line per pipeline stage (its first simulated rank);
more than ``LEGEND_LINES`` lines are coloured along a scale instead of named
one by one in a legend.

Each line is parameters, gradients and optimizer states (held all iteration)
plus the activations, gathered parameters and buffers allocated and freed by
the ops as they ran; the dashed line is the GPU's memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure

from simulator.outputs.style import FORMATS, OKABE_ITO, save, time_unit

GIB = 2.0**30
LEGEND_LINES = 10  # more lines than this share a colour scale (a legend would crowd out the plot)
SCALE = colormaps["viridis"]  # perceptually uniform and colour-blind safe, for ordered lines


def _colour_scale(fig: Figure, ax, labels: list[str]) -> None:
    """A colour bar naming the first and last line (pipeline stages, in order)."""
    bar = fig.colorbar(ScalarMappable(Normalize(0, len(labels) - 1), SCALE), ax=ax,
                       ticks=[0, len(labels) - 1], pad=0.01)
    bar.ax.set_yticklabels([labels[0], labels[-1]], fontsize=8)
    bar.set_label(f"{len(labels)} lines, in order", fontsize=8)


def plot_memory(lines: dict[str, tuple[np.ndarray, np.ndarray]], path: str | Path,
                gpu_memory: float, title: str = "") -> Path:
    """``lines``: label -> (times in s, bytes after each time); steps are drawn post-wise."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"memory plot format {fmt!r} is not one of {', '.join(FORMATS)}")
    end = max(float(t[-1]) for t, _ in lines.values()) if lines else 1.0
    unit, scale = time_unit(end)
    fig = Figure(figsize=(9, 4.5), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    many = len(lines) > LEGEND_LINES  # a deep pipeline: a colour scale, not a legend entry each
    for n, (label, (times, totals)) in enumerate(lines.items()):
        colour = (SCALE(n / max(1, len(lines) - 1)) if many else OKABE_ITO[n % len(OKABE_ITO)])
        ax.step(times * scale, totals / GIB, where="post", label=None if many else label,
                color=colour, linewidth=1.0 if many else 1.4)
    if many:
        _colour_scale(fig, ax, list(lines))
    peak = max((float(np.max(v)) for _, v in lines.values()), default=0.0) / GIB
    capacity = gpu_memory / GIB
    if peak > 0.5 * capacity:  # near or over capacity: show the limit
        ax.axhline(capacity, color="#D55E00", linestyle="--", linewidth=1,
                   label=f"GPU memory ({capacity:.0f} GiB)")
        ax.set_ylim(0, max(peak, capacity) * 1.08)
    else:  # far below: zoom on the data and say where the limit is
        ax.set_ylim(0, peak * 1.25 or 1.0)  # (a trace without memory events: 0 to 1 GiB)
        ax.plot([], [], " ", label=f"GPU memory {capacity:.0f} GiB (off scale)")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory (GiB)")
    ax.set_title(f"{title}: memory per rank over one iteration")
    ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.14) if many else (1.01, 1.0),
              frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)
