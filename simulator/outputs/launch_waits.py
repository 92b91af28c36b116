"""The Gantt's host-bound parts: each kernel's wait for its launch, drawn as
the leading part of its compute bar, the compute colour lightened and hatched
where wide enough to show it (spans' ``host_wait_s``: ``runner.host_waits``;
absent from run directories written before it: nothing drawn)."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.colors import to_rgb
from matplotlib.patches import Patch

from simulator.outputs.bars import bars, rectangles

LABEL = "host-bound (waiting for launch)"  # the legend's entry
COLUMN = "host_wait_s"
LIGHTEN = {"facecolor": (1.0, 1.0, 1.0, 0.55), "linewidth": 0}  # over the compute colour
HATCH = {"hatch": "xxxx", "edgecolor": (0.3, 0.3, 0.3, 0.6)}


def clip(frame: pd.DataFrame, clipped: pd.DataFrame) -> pd.DataFrame:
    """``clipped`` (``frame``'s spans clipped to a window) with each launch wait
    the part of ``[start, start + host_wait_s)`` inside the window."""
    if COLUMN not in frame.columns:
        return clipped
    lead = np.minimum(frame["start"] + frame[COLUMN], clipped["end"])
    return clipped.assign(**{COLUMN: np.maximum(lead - clipped["start"], 0.0)})


def leading(frame: pd.DataFrame) -> pd.DataFrame:
    """The leading parts of ``frame``'s host-bound kernels: ``[start, start +
    host_wait_s)`` per kernel that waited for its launch, with its stream.

    >>> s = pd.DataFrame({"stream": "compute", "kind": "compute", "start": [0.0, 5.0],
    ...                   "end": [3.0, 6.0], "host_wait_s": [2.0, 0.0]})
    >>> leading(s)[["start", "end"]].values.tolist()
    [[0.0, 2.0]]
    """
    if COLUMN not in frame.columns:
        return pd.DataFrame({"stream": [], "start": [], "end": []})
    waits = frame[(frame[COLUMN].to_numpy() > 0) & (frame["kind"] == "compute").to_numpy()]
    return pd.DataFrame({"stream": waits["stream"], "start": waits["start"],
                         "end": np.minimum(waits["start"] + waits[COLUMN], waits["end"])})


def draw(ax: Axes, frame: pd.DataFrame, lanes: dict, y: float, scale: float,
         gap: float, wide_from: float) -> bool:
    """Lighten one row's launch waits over their compute bars, merged below a
    pixel (``gap``) as the bars are, hatched where at least ``wide_from`` wide
    (in drawn units); whether there were any."""
    waits = leading(frame)
    for stream, part in waits.groupby("stream", observed=True):
        offset, height = lanes.get(str(stream), lanes["compute"])
        x, w = bars(part, scale, gap)
        wide = w >= wide_from
        rectangles(ax, (x[~wide], w[~wide]), y + offset, height, zorder=1.5, **LIGHTEN)
        rectangles(ax, (x[wide], w[wide]), y + offset, height, zorder=1.5, **LIGHTEN, **HATCH)
    return len(waits) > 0


def handle(compute: str) -> Patch:
    """The legend's patch: the ``compute`` colour lightened as drawn, hatched."""
    alpha = LIGHTEN["facecolor"][3]
    shade = tuple((1 - alpha) * c + alpha for c in to_rgb(compute))
    return Patch(facecolor=shade, label=LABEL, **HATCH)
