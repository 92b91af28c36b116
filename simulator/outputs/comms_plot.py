"""The communication size histogram as a figure (``clustersim comms --plot``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.base.units import format_bytes
from simulator.outputs.style import OKABE_ITO, save


def plot_histogram(table: pd.DataFrame, path: str | Path, title: str = "") -> Path:
    """Message counts per power-of-two size bin, one bar series per dimension."""
    pivot = table.pivot_table(index="from_bytes", columns="dimension", values="calls",
                              aggfunc="sum", fill_value=0).sort_index()
    fig = Figure(figsize=(8, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    width = 0.8 / max(1, len(pivot.columns))
    x = np.arange(len(pivot.index))
    for n, dimension in enumerate(pivot.columns):
        ax.bar(x + n * width, pivot[dimension].to_numpy(), width=width, label=dimension,
               color=OKABE_ITO[n % len(OKABE_ITO)])
    ax.set_xticks(x + width * (len(pivot.columns) - 1) / 2,
                  [format_bytes(v).replace(".00", "") for v in pivot.index], rotation=45,
                  ha="right", fontsize=7)
    ax.set_yscale("log")
    ax.set_xlabel("message size (bin from)")
    ax.set_ylabel("calls")
    ax.set_title(f"{title}: messages per size and dimension" if title else
                 "messages per size and dimension")
    if len(pivot.columns):
        ax.legend(frameon=False)
    else:
        ax.text(0.5, 0.5, "no communication", transform=ax.transAxes, ha="center")
    return save(fig, path)
