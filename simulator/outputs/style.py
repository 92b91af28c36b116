"""The look every figure shares: the palette, the formats, saving with text as text.

Colours are the Okabe-Ito colour-blind-safe palette (Okabe & Ito, *Color
Universal Design*, 2008); PDF and SVG keep text as text (TrueType fonts, no
paths) so a paper's fonts and search work; files carry no dates, so the same
run writes the same bytes.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # matplotlib loads when a figure is drawn, not with every command
    from matplotlib.figure import Figure

FORMATS = ("png", "pdf", "svg")
OKABE_ITO = ("#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442",
             "#000000")  # the colour-blind-safe palette every figure uses
TEXT_AS_TEXT = {"pdf.fonttype": 42, "ps.fonttype": 42, "svg.fonttype": "none"}


def time_unit(span: float) -> tuple[str, float]:
    """(unit label, scale) so the axis numbers stay readable."""
    if span >= 2.0:
        return "s", 1.0
    if span >= 2e-3:
        return "ms", 1e3
    return "us", 1e6


def save(fig: Figure, path: str | Path) -> Path:
    """Write ``fig``; the format follows the suffix (png, pdf or svg), text as text."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower()
    if fmt not in FORMATS:
        raise ValueError(f"figure format {fmt!r} is not one of {', '.join(FORMATS)}")
    import matplotlib

    with matplotlib.rc_context(TEXT_AS_TEXT), warnings.catch_warnings():
        # a name in a script the font lacks (CJK with DejaVu Sans) is drawn as boxes,
        # not a warning per glyph on every run
        warnings.filterwarnings("ignore", message=r"Glyph \d+ .* missing from font")
        fig.savefig(path, format=fmt, dpi=150,
                    metadata={"Date": None} if fmt == "svg" else
                    {"CreationDate": None} if fmt == "pdf" else None)
    return path
