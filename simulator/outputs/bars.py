"""Many bars drawn fast: intervals merged where a figure could not tell them
apart, and drawn as one compound path (the Gantt charts' lanes)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.patches import PathPatch
from matplotlib.path import Path as Outline

RECTANGLE_CODES = np.array([Outline.MOVETO, Outline.LINETO, Outline.LINETO, Outline.LINETO,
                            Outline.CLOSEPOLY], dtype=Outline.code_type)


def merge_close(start: np.ndarray, end: np.ndarray, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """Intervals ``[start, end)`` merged where they overlap or are at most ``gap``
    apart, in start order: what a figure shows when ``gap`` is below a pixel.

    >>> merge_close(np.array([0.0, 1.05, 3.0]), np.array([1.0, 2.0, 4.0]), 0.1)
    (array([0., 3.]), array([2., 4.]))
    """
    if len(start) == 0:
        return start, end
    order = np.argsort(start, kind="stable")
    s, e = np.asarray(start, dtype=float)[order], np.asarray(end, dtype=float)[order]
    reach = np.maximum.accumulate(e)
    first = np.r_[True, s[1:] > reach[:-1] + gap]
    at = np.flatnonzero(first)
    return s[at], np.maximum.reduceat(e, at)


def bars(part: pd.DataFrame, scale: float, gap: float) -> tuple[np.ndarray, np.ndarray]:
    """(x, width) arrays of a lane's merged intervals."""
    s, e = merge_close(part["start"].to_numpy(), part["end"].to_numpy(), gap)
    return s * scale, (e - s) * scale


def rectangles(ax: Axes, bars: tuple[np.ndarray, np.ndarray], y: float, height: float,
                **style) -> None:
    """Bars ``(x, width)`` from ``y`` to ``y + height`` as one compound path built
    from arrays (``broken_barh`` converts units bar by bar, and a collection makes
    a path per bar: seconds for the hundreds of thousands of bars of a large
    run; the bars do not overlap, so one filled path draws the same). The caller
    sets the limits."""
    x, w = bars
    if len(x) == 0:
        return
    verts = np.empty((len(x), 5, 2))
    verts[:, (0, 1, 4), 0] = x[:, None]
    verts[:, (2, 3), 0] = (x + w)[:, None]
    verts[:, (0, 3, 4), 1] = y
    verts[:, (1, 2), 1] = y + height
    codes = np.tile(RECTANGLE_CODES, len(x))
    ax.add_artist(PathPatch(Outline(verts.reshape(-1, 2), codes), snap=True, **style))
