"""The communication log as the engine writes it: one row per collective call or
message, in the order they end, with blocks of rows kept as one entry.

A gang holding every group of an exclusive dimension (a pipeline stage's class
holds a hundred tensor-parallel groups at 16,384 GPUs) logs one row per group
for each of its calls: rows that differ only in their times, which are the
call's start plus a duration fixed per group. ``CallLog.block`` keeps those as
one entry (the rows' fixed fields, the durations, the start) and ``frame``
builds the table with array operations, so neither the engine nor the table
pays a Python tuple per row. Row numbers are the same as if every row had been
appended: ``len`` counts rows, not entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import pandas as pd


class CallLog:
    """Rows ``(group, group_index, seq, collective, name, ranks, bytes, algorithm,
    protocol, channels, first_arrival, start, end)`` and blocks of them."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []  # explicit rows
        self._row_at: list[int] = []  # each explicit row's row number
        self._blocks: list[tuple[int, int, float]] = []  # (first row, template, start)
        self._templates: list[tuple[list[tuple], list[float]]] = []
        self._template_of: dict[int, int] = {}  # id(heads) -> template
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, row: tuple) -> None:
        self._rows.append(row)
        self._row_at.append(self._count)
        self._count += 1

    def extend(self, rows: Iterable[tuple]) -> None:
        for row in rows:
            self.append(row)

    def block(self, heads: list[tuple], durations: list[float], start: float) -> None:
        """Rows ``head + (start, start, start + duration)``, one per head, as one
        entry; ``heads`` and ``durations`` are kept by reference (pass the same
        lists for the same block)."""
        template = self._template_of.get(id(heads))
        if template is None:
            template = self._template_of[id(heads)] = len(self._templates)
            self._templates.append((heads, durations))
        self._blocks.append((self._count, template, start))
        self._count += len(heads)

    def frame(self, columns: Sequence[str]) -> pd.DataFrame:
        """Every row, in row order, as a table with ``columns``."""
        parts = [pd.DataFrame(self._rows, columns=list(columns))]
        positions = [np.asarray(self._row_at, dtype=np.int64)]
        if self._blocks:
            first, template, start = (np.asarray(x) for x in zip(*self._blocks, strict=True))
            for t, (heads, durations) in enumerate(self._templates):
                at = np.flatnonzero(template == t)
                k, n = len(heads), len(at)
                part = pd.DataFrame(heads, columns=list(columns[:-3]))
                part = part.iloc[np.tile(np.arange(k), n)].reset_index(drop=True)
                begin = np.repeat(start[at].astype(float), k)
                part[columns[-3]] = begin
                part[columns[-2]] = begin
                part[columns[-1]] = begin + np.tile(np.asarray(durations, dtype=float), n)
                parts.append(part)
                positions.append((first[at][:, None] + np.arange(k)).ravel())
        if len(parts) == 1:
            return parts[0]
        table = pd.concat([p for p in parts if len(p)] or parts[:1], ignore_index=True)
        order = np.argsort(np.concatenate(positions), kind="stable")
        return table.iloc[order].reset_index(drop=True)
