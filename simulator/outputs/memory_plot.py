"""Memory over time: one line per pipeline stage (its first simulated rank).

Each line is parameters, gradients and optimizer states (held all iteration)
plus the activations, gathered parameters and buffers allocated and freed by
the ops as they ran; the dashed line is the GPU's memory.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.style import FORMATS, OKABE_ITO, save, time_unit

GIB = 2.0**30


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
    for n, (label, (times, totals)) in enumerate(lines.items()):
        ax.step(times * scale, totals / GIB, where="post", label=label,
                color=OKABE_ITO[n % len(OKABE_ITO)], linewidth=1.4)
    peak = max((float(np.max(v)) for _, v in lines.values()), default=0.0) / GIB
    capacity = gpu_memory / GIB
    if peak > 0.5 * capacity:  # near or over capacity: show the limit
        ax.axhline(capacity, color="#D55E00", linestyle="--", linewidth=1,
                   label=f"GPU memory ({capacity:.0f} GiB)")
        ax.set_ylim(0, max(peak, capacity) * 1.08)
    else:  # far below: zoom on the data and say where the limit is
        ax.set_ylim(0, peak * 1.25)
        ax.plot([], [], " ", label=f"GPU memory {capacity:.0f} GiB (off scale)")
    ax.set_xlabel(f"time ({unit})")
    ax.set_ylabel("memory (GiB)")
    ax.set_title(f"{title}: memory per rank over one iteration")
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False, fontsize=8)
    ax.grid(alpha=0.3)
    return save(fig, path)
