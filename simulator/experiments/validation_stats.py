"""The validation set's error statistics: mean absolute and mean signed error
(positive: simulated faster or higher than measured) per group and per half,
the gap between the halves, and the groups that have only one half.

Pure functions of the per-case table that ``validate.run_cases`` makes
(columns ``tags``, comma-separated, ``basis``: fit or check, and
``error_pct``, the signed error) or of the cases themselves.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

import pandas as pd

HALVES = ("fit", "check")


def summarise(errors: Sequence[float]) -> tuple[int, float | None, float | None]:
    """(cases, mean absolute error, mean signed error) of signed errors in
    percent; no means of no cases.

    >>> summarise([-5.0, 15.0])
    (2, 10.0, 5.0)
    """
    errors = [float(e) for e in errors]
    if not errors:
        return 0, None, None
    return (len(errors), sum(abs(e) for e in errors) / len(errors),
            sum(errors) / len(errors))


def _groups(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """("all", the whole table), then each tag and its rows, tags sorted."""
    tags = table["tags"].str.split(",")
    names = sorted({t for row in tags for t in row})
    return [("all", table), *[(t, table[tags.map(lambda row, t=t: t in row)]) for t in names]]


def _nan(value: float | None) -> float:
    return math.nan if value is None else value


def by_half(table: pd.DataFrame) -> pd.DataFrame:
    """Per group ("all" first, then each tag): cases, and per half its cases,
    mean absolute and mean signed error (%); the gap, check minus fit, of each
    (percentage points; NaN where a half has no cases)."""
    rows = []
    for group, part in _groups(table):
        row: dict[str, object] = {"group": group, "cases": len(part)}
        for half in HALVES:
            n, mae, signed = summarise(list(part.loc[part["basis"] == half, "error_pct"]))
            row.update({f"{half}_cases": n, f"{half}_mae": _nan(mae),
                        f"{half}_signed": _nan(signed)})
        row["gap_mae"] = row["check_mae"] - row["fit_mae"]
        row["gap_signed"] = row["check_signed"] - row["fit_signed"]
        rows.append(row)
    return pd.DataFrame(rows)


def one_sided_groups(cases: Iterable, minimum: int = 4) -> list[str]:
    """The tags of at least ``minimum`` cases whose cases are all in one half."""
    halves: dict[str, list[str]] = {}
    for case in cases:
        for tag in case.tags:
            halves.setdefault(tag, []).append(case.basis)
    return sorted(t for t, h in halves.items() if len(h) >= minimum and len(set(h)) == 1)
