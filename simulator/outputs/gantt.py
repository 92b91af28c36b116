"""Gantt chart of a run, for papers and for digging.

One row per rank: a compute lane (forward, backward and optimizer in distinct
colours, micro-batch numbers written on blocks wide enough to hold them) and,
below it, one sub-lane per communication stream present (tensor, context, data
and pipeline parallel, coloured by stream). Waiting for peers in a collective
is vermillion with hatching; a pipeline stage waiting for its neighbour (the
bubble) is grey, in its lane and shading the idle compute lane, so the two
stay apart in print. A host-bound kernel's wait for its launch, the leading
part of its bar, is the compute colour lightened (``launch_waits``). With ``streams=True`` every
(rank, stream) gets its own row instead.

Ranks whose timelines are identical (same spans, same times) share one row
labelled with their ranks, so a 1024-GPU run still gives a readable figure;
``ranks`` picks a subset, ``start``/``end`` a time window. A panel beside the
chart breaks each row's iteration into compute, exposed communication,
waiting, bubble and idle (``simulator.analysis.timeline``). Colours are the Okabe-Ito
colour-blind-safe palette; text stays text in PDF and SVG (TrueType fonts, no
paths). Uses matplotlib's object API (no pyplot state).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from simulator.analysis.timeline import rank_table
from simulator.base.ir import COMMUNICATION_STREAMS, EP_RDMA_STREAM, PACING, PP_STREAM
from simulator.outputs import launch_waits
from simulator.outputs.bars import bars, rectangles
from simulator.outputs.selection import spread
from simulator.outputs.style import save, time_unit

MAX_ROWS = 48
GROUP_ABOVE = 16  # more ranks than this: identical ranks share a row
STREAMS = COMMUNICATION_STREAMS  # communication sub-lanes, top to bottom
CATEGORIES = {  # label -> colour, in legend order
    "forward": "#56B4E9",
    "backward": "#0072B2",
    "optimizer": "#009E73",
    "TP communication": "#E69F00",
    "CP communication": "#000000",
    "EP communication": "#44AA99",  # Paul Tol's teal: Okabe-Ito's eight are taken
    "EP communication, RDMA hop": "#117733",  # Paul Tol's green: DeepEP between domains
    "DP communication": "#F0E442",
    "PP communication": "#CC79A7",
    "BG communication": "#882255",  # Paul Tol's wine: background traffic
    "host copies": "#999933",  # Paul Tol's olive: offloading's copies and host work
    "waiting for peers": "#D55E00",
    "pipeline bubble": "#BBBBBB",
}
HATCH = {"waiting for peers": "////"}
BREAKDOWN = {  # rank_table column -> (label, colour)
    "compute_s": ("compute", "#0072B2"),
    "exposed_comm_s": ("exposed comm.", "#E69F00"),
    "comm_wait_s": ("waiting", "#D55E00"),
    "bubble_s": ("bubble", "#BBBBBB"),
    "idle_s": ("idle", "#F2F2F2"),
}


def category(kind: str, phase: str, stream: str) -> str:
    """Legend category of a span."""
    if kind == "wait":
        return "pipeline bubble" if stream == PP_STREAM else "waiting for peers"
    if kind == "comm":
        if stream == EP_RDMA_STREAM:
            return "EP communication, RDMA hop"
        return f"{stream.upper()} communication" if stream in STREAMS else "DP communication"
    if kind == "copy":
        return "host copies"
    return phase if phase in CATEGORIES else "forward"


def categories(spans: pd.DataFrame) -> np.ndarray:
    """Every span's legend category (``category`` once per distinct kind, phase
    and stream)."""
    if len(spans) == 0:
        return np.array([], dtype=object)
    columns = ["kind", "phase", "stream"]
    codes = spans.groupby(columns, sort=False, observed=True).ngroup().to_numpy()
    first = np.unique(codes, return_index=True)[1]
    distinct = spans[columns].iloc[first].astype(str).itertuples(index=False, name=None)
    return np.array([category(*triple) for triple in distinct], dtype=object)[codes]


def rank_ranges(ranks: list[int]) -> str:
    """``[0, 1, 2, 3, 8]`` -> ``"0-3,8"``."""
    parts, first = [], None
    for n, rank in enumerate(ranks):
        if first is None:
            first = rank
        if n + 1 == len(ranks) or ranks[n + 1] != rank + 1:
            parts.append(str(first) if first == rank else f"{first}-{rank}")
            first = None
    return ",".join(parts)


def identical_ranks(spans: pd.DataFrame) -> list[list[int]]:
    """Ranks grouped by identical timelines (streams, kinds, phases, times to the
    nanosecond), each group sorted, groups ordered by their first rank."""
    key = pd.DataFrame({
        "stream": spans["stream"].astype(str), "kind": spans["kind"].astype(str),
        "phase": spans["phase"].astype(str), "mb": spans["microbatch"],
        "start": np.round(spans["start"].to_numpy() * 1e9).astype(np.int64),
        "end": np.round(spans["end"].to_numpy() * 1e9).astype(np.int64)})
    hashed = pd.util.hash_pandas_object(key, index=False).to_numpy()
    frame = pd.DataFrame({"rank": spans["rank"].to_numpy(), "h": hashed})
    frame["n"] = frame.groupby("rank").cumcount().to_numpy(np.uint64)
    frame["h"] = frame["h"] * (frame["n"] * np.uint64(2) + np.uint64(1))  # order matters
    signature = frame.groupby("rank").agg(h=("h", "sum"), count=("h", "size"))
    groups: dict[tuple, list[int]] = {}
    for rank, h, count in signature.itertuples():
        groups.setdefault((int(h), int(count)), []).append(int(rank))
    return sorted(groups.values(), key=lambda g: g[0])


@dataclass(frozen=True)
class Row:
    """One row of the chart: the ranks it stands for (the first is drawn) and,
    with one row per stream, its stream."""

    ranks: tuple[int, ...]
    stream: str | None = None

    @property
    def label(self) -> str:
        who = (f"rank {self.ranks[0]}" if len(self.ranks) == 1 else
               f"ranks {_shorten(rank_ranges(list(self.ranks)))} ({len(self.ranks)})")
        return who if self.stream is None else f"{who} {self.stream}"


def _shorten(text: str, limit: int = 22) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def choose_rows(spans: pd.DataFrame, ranks: list[int] | None = None,
                streams: bool = False, group: bool | None = None,
                limit: int = MAX_ROWS, classes: list[list[int]] | None = None
                ) -> tuple[list[Row], int]:
    """The rows to draw and how many rank rows there were before thinning.

    Identical ranks share a row when ``group`` (default: more than
    ``GROUP_ABOVE`` ranks and no explicit ``ranks``); more rows than ``limit``
    are thinned evenly, first and last kept.
    """
    frame = spans if ranks is None else spans[spans["rank"].isin(ranks)]
    if group is None:
        group = ranks is None and frame["rank"].nunique() > GROUP_ABOVE
    if classes is not None:  # a folded run: spans of each class's first rank only
        members = sorted((sorted(c) for c in classes), key=lambda c: c[0])
    elif group:
        members = identical_ranks(frame)
    else:
        members = [[int(r)] for r in sorted(frame["rank"].unique())]
    total = len(members)
    members = spread(members, limit)
    rows = [Row(tuple(m)) for m in members]
    if streams:
        present = ["compute"] + [s for s in STREAMS if (frame["stream"] == s).any()]
        rows = [Row(r.ranks, s) for r in rows for s in present]
    return rows, total


def _lanes(spans: pd.DataFrame, streams: bool) -> dict[str, tuple[float, float]]:
    """(offset, height) inside a row for the compute lane and each stream's lane."""
    if streams:
        return {s: (0.1, 0.8) for s in ("compute", *STREAMS)}
    present = [s for s in STREAMS if (spans["stream"] == s).any()]
    lanes = {"compute": (0.42, 0.4)}
    height = 0.4 / max(1, len(present))
    for n, stream in enumerate(present):
        lanes[stream] = (n * height, height * 0.9)
    return lanes


def _window(spans: pd.DataFrame, start: float | None, end: float | None) -> pd.DataFrame:
    """Spans overlapping [start, end), clipped to it."""
    lo = 0.0 if start is None else start
    hi = float(spans["end"].max()) if end is None else end
    frame = spans[(spans["end"] > lo) & (spans["start"] < hi)]
    return launch_waits.clip(frame, frame.assign(start=frame["start"].clip(lower=lo),
                                                 end=frame["end"].clip(upper=hi)))


def _blocks(part: pd.DataFrame) -> pd.DataFrame:
    """Consecutive compute spans of one phase and micro-batch merged into blocks
    (across the short gaps of tensor-parallel communication between them)."""
    if len(part) == 0:
        return pd.DataFrame({"start": [], "end": [], "phase": [], "mb": []})
    part = part.sort_values("start", kind="stable")
    phase = pd.factorize(part["phase"])[0]
    mb = part["microbatch"].to_numpy()
    at = np.flatnonzero(np.r_[True, (phase[1:] != phase[:-1]) | (mb[1:] != mb[:-1])])
    return pd.DataFrame({"start": np.minimum.reduceat(part["start"].to_numpy(), at),
                         "end": np.maximum.reduceat(part["end"].to_numpy(), at),
                         "phase": part["phase"].to_numpy()[at], "mb": mb[at]})


def _label_blocks(ax: Axes, part: pd.DataFrame, y: float, scale: float, width: float) -> None:
    """Write F3 / B3 / opt on compute blocks wide enough to hold the text."""
    for block in _blocks(part).itertuples():
        if (block.end - block.start) * scale < width * 0.011:
            continue
        phase = str(block.phase)
        text = "opt" if phase == "optimizer" else f"{phase[:1].upper()}{block.mb}"
        if block.mb < 0 and phase != "optimizer":
            continue
        ax.text((block.start + block.end) / 2 * scale, y, text, ha="center", va="center",
                fontsize=5.5, color="white" if phase == "backward" else "black")


PIXEL_FRACTION = 1 / 6000  # gaps below this share of the window are below a pixel
HATCH_MIN = 1 / 400  # narrower blocks (a few pixels) are drawn solid: no hatch would show


def draw(ax: Axes, spans: pd.DataFrame, rows: list[Row], scale: float,
         labels: bool = True) -> set[str]:
    """Draw ``rows`` of ``spans`` (times multiplied by ``scale``) on ``ax``; return
    the legend categories used."""
    streams = any(r.stream is not None for r in rows)
    lanes = _lanes(spans, streams)
    width = float(spans["end"].max() - spans["start"].min()) * scale if len(spans) else 1.0
    gap = width / scale * PIXEL_FRACTION  # seconds: far below a pixel at the figure's width
    spans = spans.assign(cat=categories(spans))
    by_rank = dict(tuple(spans.groupby("rank", sort=False, observed=True)))
    used: set[str] = set()
    for y, row in enumerate(rows):
        frame = by_rank.get(row.ranks[0])
        if frame is None:
            continue
        if row.stream is not None:
            frame = frame[frame["stream"] == row.stream]
        for (stream, name), part in frame.groupby(["stream", "cat"], observed=True):
            offset, height = lanes.get(str(stream), lanes["compute"])
            x, w = bars(part, scale, gap)
            wide = w >= HATCH_MIN * width if name in HATCH else np.zeros(len(w), dtype=bool)
            if wide.any():  # a hatch shows only on blocks a few pixels wide: draw it there
                rectangles(ax, (x[wide], w[wide]), y + offset, height,
                            facecolor=CATEGORIES[name], hatch=HATCH[name],
                            edgecolor="white", linewidth=0)
            rectangles(ax, (x[~wide], w[~wide]), y + offset, height,
                        facecolor=CATEGORIES[name], linewidth=0)
            used.add(name)
        if launch_waits.draw(ax, frame, lanes, y, scale, gap, HATCH_MIN * width):
            used.add(launch_waits.LABEL)
        bubbles = frame[(frame["kind"] == "wait") & (frame["stream"] == PP_STREAM)]
        if not streams and len(bubbles):  # the bubble also shades the idle compute lane
            offset, height = lanes["compute"]
            rectangles(ax, bars(bubbles, scale, gap), y + offset, height,
                        facecolor=CATEGORIES["pipeline bubble"],
                        alpha=0.45, linewidth=0, zorder=0.5)
        compute = frame[frame["kind"] == "compute"]
        if labels and len(compute):
            offset, height = lanes["compute"]
            _label_blocks(ax, compute, y + offset + height / 2, scale, width)
    ax.set_yticks([n + 0.5 for n in range(len(rows))], [r.label for r in rows], fontsize=7)
    ax.set_ylim(-0.1, len(rows) + 0.1)
    ax.invert_yaxis()
    ax.grid(axis="x", alpha=0.3)
    return used


def draw_breakdown(ax: Axes, spans: pd.DataFrame, rows: list[Row], iteration: float) -> None:
    """Stacked bars of each row's time categories, as shares of the iteration."""
    table = rank_table(spans[spans["rank"].isin({r.ranks[0] for r in rows})], iteration)
    table = table.set_index("rank")
    for y, row in enumerate(rows):
        if row.stream not in (None, "compute"):
            continue  # one bar per rank
        left = 0.0
        for column, (label, colour) in BREAKDOWN.items():
            share = float(table.at[row.ranks[0], column]) / iteration if iteration else 0.0
            ax.barh(y + 0.5, share, left=left, height=0.6, color=colour,
                    edgecolor="#999999" if column == "idle_s" else colour, linewidth=0.3,
                    label=label if y == 0 else None)
            left += share
    ax.set_xlim(0, 1)
    ax.set_xticks([0, 0.5, 1], ["0", "50", "100 %"], fontsize=7)
    ax.set_xlabel("share of iteration", fontsize=7)
    ax.set_title("time breakdown", fontsize=8)
    ax.figure.legend(*ax.get_legend_handles_labels(), loc="outside upper right", fontsize=6,
                     frameon=False, ncol=5, title="breakdown", title_fontsize=6)


def _legend(fig: Figure, used: set[str]) -> None:
    """The span categories, below the chart (outside the axes: nothing overlaps)."""
    handles = [Patch(facecolor=c, label=n, hatch=HATCH.get(n), edgecolor="white")
               for n, c in CATEGORIES.items() if n in used]
    if launch_waits.LABEL in used:
        handles.append(launch_waits.handle(CATEGORIES["forward"]))
    fig.legend(handles=handles, loc="outside lower center",
               ncol=min(5, max(1, len(handles))), frameon=False, fontsize=7)


def _title(title: str, rows: list[Row], total: int, ranks: int) -> str:
    shown = len({r.ranks for r in rows})
    grouped = sum(len(r.ranks) for r in {r.ranks: r for r in rows}.values())
    notes = []
    if grouped > shown:
        notes.append("identical ranks share a row")
    if shown < total:
        notes.append(f"{shown} of {total} rows shown")
    elif grouped < ranks:
        notes.append(f"{grouped} of {ranks} ranks shown")
    return f"{title} ({'; '.join(notes)})" if notes else title


def figure(spans: pd.DataFrame, title: str = "", ranks: list[int] | None = None,
           start: float | None = None, end: float | None = None, streams: bool = False,
           group: bool | None = None, breakdown: bool = True,
           classes: list[list[int]] | None = None) -> Figure:
    """The Gantt chart of ``spans`` as a matplotlib Figure (see the module doc);
    ``classes``: a folded run's ranks by class, when ``spans`` hold only the first
    rank of each (each class is one row)."""
    spans = spans[spans["name"] != PACING]  # (background traffic's waits: not work)
    iteration = float(spans["end"].max())
    rows, total = choose_rows(spans, ranks, streams, group, classes=classes)
    frame = _window(spans[spans["rank"].isin({r.ranks[0] for r in rows})], start, end)
    lo = 0.0 if start is None else start
    hi = iteration if end is None else end
    unit, scale = time_unit(hi - lo)
    fig = Figure(figsize=(12 if breakdown else 11, min(0.42 * len(rows) + 2.0, 30.0)),
                 layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(1, 2, width_ratios=(6, 1)) if breakdown else None
    ax = fig.add_subplot(grid[0, 0]) if grid is not None else fig.add_subplot()
    used = draw(ax, frame, rows, scale)
    ax.set_xlim(lo * scale, hi * scale)
    ax.set_xlabel(f"time ({unit})")
    ranks_in_run = (sum(map(len, classes)) if classes is not None
                    else spans["rank"].nunique())
    ax.set_title(_title(title, rows, total, ranks_in_run), fontsize=9)
    _legend(fig, used)
    if grid is not None:
        side = fig.add_subplot(grid[0, 1], sharey=ax)
        draw_breakdown(side, spans, rows, iteration)
        side.tick_params(axis="y", labelleft=False)
    return fig


def plot_gantt(spans: pd.DataFrame, path: str | Path, title: str = "", **options) -> Path:
    """Draw ``spans`` to ``path`` (png, pdf or svg); options as for ``figure``."""
    return save(figure(spans, title, **options), path)


def compare_figure(a: pd.DataFrame, b: pd.DataFrame, titles: tuple[str, str],
                   ranks: list[int] | None = None, start: float | None = None,
                   end: float | None = None,
                   classes: tuple[list[list[int]] | None, list[list[int]] | None] = (None, None)
                   ) -> Figure:
    """Two runs' Gantt charts stacked on one time axis; ``classes`` as for
    ``figure``, per run (a folded run's spans hold the first rank of each)."""
    hi = max(float(a["end"].max()), float(b["end"].max())) if end is None else end
    lo = 0.0 if start is None else start
    unit, scale = time_unit(hi - lo)
    picked = [choose_rows(s, ranks, limit=MAX_ROWS // 2, classes=c)
              for s, c in zip((a, b), classes, strict=True)]
    heights = [max(1, len(rows)) for rows, _ in picked]
    fig = Figure(figsize=(11, min(0.42 * sum(heights) + 3.0, 30.0)), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": heights})
    used: set[str] = set()
    for ax, spans, (rows, total), title, c in zip(axes, (a, b), picked, titles, classes,
                                                  strict=True):
        frame = _window(spans[spans["rank"].isin({r.ranks[0] for r in rows})], start, end)
        used |= draw(ax, frame, rows, scale)
        in_run = sum(map(len, c)) if c is not None else spans["rank"].nunique()
        ax.set_title(_title(f"{title}: {float(spans['end'].max()) * scale:.4g} {unit}",
                            rows, total, in_run), fontsize=9)
    axes[1].set_xlim(lo * scale, hi * scale)
    axes[1].set_xlabel(f"time ({unit})")
    _legend(fig, used)
    return fig
