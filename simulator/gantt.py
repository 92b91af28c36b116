"""Gantt chart of a run: one row per rank, compute above, communication below.

Each rank's row has a compute lane (forward, backward and optimizer in
distinct colours, so schedules can be told apart) and, below it, one sub-lane
per communication stream present in the run (tensor, context, data and
pipeline parallel, in that order), coloured by stream. Waiting for peers in a
collective is vermillion; a pipeline stage waiting for its neighbour (the
pipeline bubble) is grey. Colours are the Okabe-Ito colour-blind-safe palette;
the time axis picks seconds, milliseconds or microseconds to suit the run.
Uses matplotlib's object API (no pyplot state).
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
STREAMS = ("tp", "cp", "dp", "pp")  # communication sub-lanes, top to bottom
CATEGORIES = {  # label -> colour, in legend order
    "forward": "#56B4E9",
    "backward": "#0072B2",
    "optimizer": "#009E73",
    "TP communication": "#E69F00",
    "CP communication": "#000000",
    "DP communication": "#F0E442",
    "PP communication": "#CC79A7",
    "waiting for peers": "#D55E00",
    "pipeline bubble": "#BBBBBB",
}


def category(kind: str, phase: str, stream: str) -> str:
    """Legend category of a span."""
    if kind == "wait":
        return "pipeline bubble" if stream == "pp" else "waiting for peers"
    if kind == "comm":
        return f"{stream.upper()} communication" if stream in STREAMS else "DP communication"
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


def _lanes(spans: pd.DataFrame) -> dict[str, tuple[float, float]]:
    """(offset, height) inside a row for the compute lane and each stream's lane."""
    present = [s for s in STREAMS if (spans["stream"] == s).any()]
    lanes = {"compute": (0.42, 0.4)}
    height = 0.4 / max(1, len(present))
    for n, stream in enumerate(present):
        lanes[stream] = (n * height, height * 0.9)
    return lanes


def plot_gantt(spans: pd.DataFrame, path: str | Path, title: str = "",
               ranks: list[int] | None = None) -> Path:
    """Draw ``spans`` to ``path``; the format follows the suffix (png, pdf, svg)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"gantt format {fmt!r} is not one of {', '.join(FORMATS)}")
    shown = ranks if ranks is not None else choose_ranks(spans["rank"].to_numpy())
    unit, scale = time_unit(float(spans["end"].max()))
    fig = Figure(figsize=(11, min(0.5 * len(shown) + 1.8, 24.0)), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    frame = spans[spans["rank"].isin(shown)]
    frame = frame.assign(category=[category(k, p, s) for k, p, s in zip(
        frame["kind"], frame["phase"], frame["stream"], strict=True)])
    lanes = _lanes(frame)
    row_of = {r: n for n, r in enumerate(shown)}
    used = []
    for (rank, stream, name), part in frame.groupby(["rank", "stream", "category"], sort=True):
        offset, height = lanes.get("compute" if stream == "compute" else stream, lanes["compute"])
        bars = list(zip(part["start"] * scale, (part["end"] - part["start"]) * scale,
                        strict=True))
        ax.broken_barh(bars, (row_of[rank] + offset, height), facecolors=CATEGORIES[name],
                       linewidth=0)
        used.append(name)
    ax.set_yticks([n + 0.41 for n in range(len(shown))], [f"rank {r}" for r in shown])
    ax.set_ylim(-0.2, len(shown))
    ax.invert_yaxis()
    ax.set_xlabel(f"time ({unit})")
    ax.set_xlim(0, float(spans["end"].max()) * scale)
    total = spans["rank"].nunique()
    subtitle = "" if len(shown) == total else f" ({len(shown)} of {total} ranks shown)"
    streams = [s.upper() for s in STREAMS if s in lanes]
    ax.set_title(f"{title}{subtitle}\nupper lane: compute; lower lanes: "
                 f"{', '.join(streams) or 'no'} communication")
    handles = [Patch(color=c, label=n) for n, c in CATEGORIES.items() if n in set(used)]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.06 if len(shown) > 8
                                                                   else -0.18),
              ncol=min(5, len(handles)), frameon=False)
    ax.grid(axis="x", alpha=0.3)
    fig.savefig(path, format=fmt, dpi=150, metadata={"Date": None} if fmt == "svg" else None)
    return path
