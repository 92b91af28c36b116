"""Figures from a sweep's results table: lines (y against x, one line per hue)
or a heatmap (a metric over two keys), the figures papers show.

Values written with units (``"25 GB/s"``, ``"4 MB"``) are placed by their size
in SI units and labelled as written; failed cases are left out.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.base import units
from simulator.outputs.style import OKABE_ITO, save


def magnitude(value: object) -> float:
    """A sortable number for a table cell: the number itself, or a quantity with
    a unit in SI units; NaN when it is neither.

    >>> magnitude("25 GB/s"), magnitude(4), magnitude("ring")
    (25000000000.0, 4.0, nan)
    """
    if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool):
        return float(value)
    for dimension in units.Dimension:
        try:
            return units.parse_quantity(value, dimension)
        except units.UnitError:
            continue
    return float("nan")


def _ordered(values: pd.Series) -> list:
    """Distinct values, by magnitude when all have one, else as first seen."""
    distinct = list(dict.fromkeys(values.tolist()))
    sizes = [magnitude(v) for v in distinct]
    if all(s == s for s in sizes):
        return [v for _, v in sorted(zip(sizes, distinct, strict=True), key=lambda p: p[0])]
    return distinct


def check_columns(table: pd.DataFrame, columns: dict[str, str | None]) -> None:
    """A clear error for an option naming a column the table does not have."""
    for option, column in columns.items():
        if column is not None and column not in table.columns:
            close = [c for c in table.columns if column.split(".")[-1] in c][:5]
            hint = f" (did you mean {', '.join(close)}?)" if close else ""
            raise ValueError(f"{option}: no column {column!r} in the results{hint}")


INPUTS = ("seed", "cluster.", "model.", "training.", "parallelism.", "network.", "simulation.")


def _one_point_per_x(part: pd.DataFrame, x: str, hue: str | None) -> None:
    """A line needs one case per x: where several share an x, another swept key
    varies too, and a line through them would zig-zag between unrelated cases."""
    if not part[x].duplicated().any():
        return
    varying = [c for c in part.columns if c.startswith(INPUTS) and c not in (x, hue)
               and part[c].astype(str).nunique() > 1]
    which = f" ({', '.join(varying)} also varies)" if varying else ""
    raise ValueError(f"--x: several cases share one {x} in a line{which}; give --hue "
                     f"{varying[0] if varying else 'KEY'} for one line per value")


def line_figure(table: pd.DataFrame, x: str, y: str, hue: str | None = None,
                title: str = "") -> Figure:
    """``y`` against ``x``, one line per value of ``hue``."""
    ok = table[table["status"] == "ok"]
    xs = _ordered(ok[x])
    numeric = all(magnitude(v) == magnitude(v) for v in xs)
    position = {v: (magnitude(v) if numeric else n) for n, v in enumerate(xs)}
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    groups = [(None, ok)] if hue is None else [(h, ok[ok[hue] == h]) for h in _ordered(ok[hue])]
    for _, part in groups:
        _one_point_per_x(part, x, hue)
    for n, (label, part) in enumerate(groups):
        part = part.assign(_x=part[x].map(position)).sort_values("_x")
        ax.plot(part["_x"], part[y], marker="o", color=OKABE_ITO[n % len(OKABE_ITO)],
                label=None if label is None else f"{hue} = {label}")
    if numeric and len(xs) > 2 and max(position.values()) / max(min(position.values()),
                                                                 1e-300) > 50:
        ax.set_xscale("log")
    ax.set_xticks([position[v] for v in xs], [str(v) for v in xs])
    ax.minorticks_off()
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    if hue is not None:
        ax.legend(frameon=False)
    return fig


def heatmap_figure(table: pd.DataFrame, x: str, y: str, z: str, title: str = "") -> Figure:
    """``z`` over the grid of ``x`` and ``y`` values, each cell annotated."""
    ok = table[table["status"] == "ok"]
    xs, ys = _ordered(ok[x]), _ordered(ok[y])
    grid = np.full((len(ys), len(xs)), np.nan)
    for row in ok[[x, y, z]].itertuples(index=False):
        grid[ys.index(row[1]), xs.index(row[0])] = float(row[2])
    fig = Figure(figsize=(1.1 * len(xs) + 2.5, 0.6 * len(ys) + 1.8), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="viridis", aspect="auto", origin="lower")
    for (i, j), value in np.ndenumerate(grid):
        if value == value:
            ax.text(j, i, f"{value:.3g}", ha="center", va="center", fontsize=7,
                    color="white" if value < np.nanmean(grid) else "black")
    ax.set_xticks(range(len(xs)), [str(v) for v in xs])
    ax.set_yticks(range(len(ys)), [str(v) for v in ys])
    ax.set_xlabel(x)
    ax.set_ylabel(y)
    ax.set_title(title)
    fig.colorbar(image, ax=ax, label=z)
    return fig


def plot(table: pd.DataFrame, path: str | Path, x: str, y: str, hue: str | None = None,
         z: str | None = None, title: str = "") -> Path:
    """A line figure, or with ``z`` a heatmap of ``z`` over ``x`` and ``y``."""
    check_columns(table, {"--x": x, "--y": y, "--hue": hue, "--z": z})
    fig = heatmap_figure(table, x, y, z, title) if z else line_figure(table, x, y, hue, title)
    return save(fig, path)
