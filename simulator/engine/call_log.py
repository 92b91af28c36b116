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
        """Every row, in row order, as a table with ``columns``: each column is
        filled in place (explicit rows at their row numbers, each block's rows
        from its template), text through codes, so a log of millions of rows is
        built without a Python object per row."""
        explicit = pd.DataFrame(self._rows, columns=list(columns))
        if not self._blocks:
            return explicit
        at = np.asarray(self._row_at, dtype=np.int64)
        first, template, start = (np.asarray(x) for x in zip(*self._blocks, strict=True))
        blocks = []  # (rows, heads, durations, starts) per template
        for t, (heads, durations) in enumerate(self._templates):
            mine = np.flatnonzero(template == t)
            rows = (first[mine][:, None] + np.arange(len(heads))).ravel()
            blocks.append((rows, heads, np.asarray(durations, dtype=float),
                           start[mine].astype(float)))
        times = len(columns) - 3  # first_arrival, start, end: the block's start (+ d)
        data = {}
        for c, name in enumerate(columns):
            if c < times:
                data[name] = _fill(self._count, explicit[name], at,
                                   [(rows, [h[c] for h in heads]) for rows, heads, *_ in blocks])
                continue
            out = np.empty(self._count)
            out[at] = explicit[name].to_numpy(dtype=float)
            for rows, heads, durations, starts in blocks:
                out[rows] = np.repeat(starts, len(heads)) + (
                    np.tile(durations, len(starts)) if c == len(columns) - 1 else 0.0)
            data[name] = out
        return pd.DataFrame(data)


def _fill(count: int, explicit: pd.Series, at: np.ndarray,
          blocks: list[tuple[np.ndarray, list]]) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """One column of ``count`` rows: the explicit rows' values at ``at``, and at
    each block's ``rows`` its template's values over and over; text as the
    table's string type, built from codes."""
    if any(isinstance(v, str) for _, heads in blocks for v in heads[:1]):
        own, distinct = pd.factorize(explicit)  # the explicit rows' few distinct texts
        names = pd.Index(pd.unique(np.concatenate(
            [np.asarray(distinct, dtype=object), *[np.asarray(h, dtype=object)
                                                   for _, h in blocks]])))
        codes = np.empty(count, dtype=np.int32)
        codes[at] = names.get_indexer(np.asarray(distinct, dtype=object))[own]
        for rows, heads in blocks:
            codes[rows] = np.tile(names.get_indexer(np.asarray(heads, dtype=object)),
                                  len(rows) // len(heads))
        return pd.array(names.to_numpy(dtype=object), dtype="str").take(codes)
    values = [np.asarray(heads) for _, heads in blocks]
    dtype = np.result_type(*([explicit.dtype] if len(explicit) else []), *values)
    out = np.empty(count, dtype=dtype)
    out[at] = explicit.to_numpy()
    for (rows, _), v in zip(blocks, values, strict=True):
        out[rows] = np.tile(v, len(rows) // len(v))
    return out
