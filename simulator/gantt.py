"""Gantt chart of a run: one row per rank, compute above, communication below.

Colours are the Okabe-Ito colour-blind-safe palette: forward, backward and
optimizer compute in blues and green, communication in orange, waiting for
peers in vermillion. The time axis picks seconds, milliseconds or
microseconds to suit the run. Uses matplotlib's object API (no pyplot state).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

FORMATS = ("png", "pdf", "svg")
MAX_RANKS = 64
CATEGORIES = {  # label -> colour, drawn in this order
    "forward": "#56B4E9",
    "backward": "#0072B2",
    "optimizer": "#009E73",
    "communication": "#E69F00",
    "waiting": "#D55E00",
}


def category(kind: str, phase: str) -> str:
    """Legend category of a span."""
    if kind == "comm":
        return "communication"
    if kind == "wait":
        return "waiting"
    return phase if phase in CATEGORIES else "forward"


def time_unit(span: float) -> tuple[str, float]:
    """(unit label, scale) so the axis numbers stay readable."""
    if span >= 2.0:
        return "s", 1.0
    if span >= 2e-3:
        return "ms", 1e3
    return "us", 1e6


def choose_ranks(ranks: np.ndarray, limit: int = MAX_RANKS) -> list[int]:
    """All ranks, or ``limit`` of them evenly spread (first and last included)."""
    unique = sorted(int(r) for r in np.unique(ranks))
    if len(unique) <= limit:
        return unique
    picks = np.linspace(0, len(unique) - 1, limit).round().astype(int)
    return [unique[i] for i in sorted(set(picks))]


def plot_gantt(spans: pd.DataFrame, path: str | Path, title: str = "",
               ranks: list[int] | None = None) -> Path:
    """Draw ``spans`` to ``path``; the format follows the suffix (png, pdf, svg)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"gantt format {fmt!r} is not one of {', '.join(FORMATS)}")
    shown = ranks if ranks is not None else choose_ranks(spans["rank"].to_numpy())
    unit, scale = time_unit(float(spans["end"].max()))
    height = min(0.5 * len(shown) + 1.6, 24.0)
    fig = Figure(figsize=(11, height), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    cats = [category(k, p) for k, p in zip(spans["kind"], spans["phase"], strict=True)]
    frame = spans.assign(category=cats)
    for row, rank in enumerate(shown):
        mine = frame[frame["rank"] == rank]
        for name, colour in CATEGORIES.items():
            part = mine[mine["category"] == name]
            if part.empty:
                continue
            lane = row + (0.0 if name in ("communication", "waiting") else 0.42)
            bars = list(zip(part["start"] * scale, (part["end"] - part["start"]) * scale,
                            strict=True))
            ax.broken_barh(bars, (lane, 0.4), facecolors=colour, linewidth=0)
    ax.set_yticks([row + 0.41 for row in range(len(shown))], [f"rank {r}" for r in shown])
    ax.set_ylim(-0.2, len(shown))
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, float(spans["end"].max()) * scale)
    total = spans["rank"].nunique()
    subtitle = "" if len(shown) == total else f" ({len(shown)} of {total} ranks shown)"
    ax.set_title(f"{title}{subtitle}  —  upper lane: compute, lower lane: communication")
    ax.legend(handles=[Patch(color=c, label=n) for n, c in CATEGORIES.items()],
              loc="upper center", bbox_to_anchor=(0.5, -0.08 if len(shown) > 8 else -0.2),
              ncol=len(CATEGORIES), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else None)
    return path
