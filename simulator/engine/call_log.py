"""The communication log as the engine writes it: one row per collective call or
message, in the order they end, with blocks of rows kept as one entry.

A gang logs many rows at once that differ only in their times and call number:
holding every group of an exclusive dimension (a pipeline stage's class holds
a hundred tensor-parallel groups at 16,384 GPUs), one row per group for each
of its calls, each ending its start plus a duration fixed per group; sending a
message group (a class's pipeline messages: 1,536 per call at 12,288 GPUs),
one row per message, each with its own end. ``CallLog.block`` keeps such rows
as one entry (the fixed fields once, then the call number, start and ends)
and ``frame`` builds the table with array operations, so neither the engine
nor the table pays a Python tuple per row. Row numbers are the same as if
every row had been appended: ``len`` counts rows, not entries.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import chain

import numpy as np
import pandas as pd

# each row field's type, in row order: text as categories, counts, times
ROW_DTYPES = ("category", "int64", "int64", "category", "category", "int64", "int64",
              "category", "category", "int64", "float64", "float64", "float64")


class CallLog:
    """Rows ``(group, group_index, seq, collective, name, ranks, bytes, algorithm,
    protocol, channels, first_arrival, start, end)`` and blocks of them."""

    def __init__(self) -> None:
        self._rows: list[tuple] = []  # explicit rows
        self._row_at: list[int] = []  # each explicit row's row number
        self._blocks: list[tuple] = []  # (first row, template, seq, start, ends or None)
        self._templates: list[tuple[list[tuple], np.ndarray | None]] = []
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

    def block(self, heads: list[tuple], seq: int, start: float,
              durations: list[float] | None = None, ends: Sequence[float] | None = None
              ) -> None:
        """Rows ``(group, group_index, seq, *rest, start, start, end)`` for each
        ``(group, group_index, *rest)`` of ``heads``, as one entry; each row ends
        at ``start`` plus its ``durations`` (fixed per ``heads``) or at its
        ``ends``. ``heads`` is kept by reference: pass the same list for the same
        rows; so is ``ends`` (turned into numbers with the rest in ``frame``): it
        must not change afterwards."""
        template = self._template_of.get(id(heads))
        if template is None:
            template = self._template_of[id(heads)] = len(self._templates)
            self._templates.append((heads, None if durations is None else
                                    np.asarray(durations, dtype=float)))
        self._blocks.append((self._count, template, seq, start,
                             ends))
        self._count += len(heads)

    def frame(self, columns: Sequence[str]) -> pd.DataFrame:
        """Every row, in row order, as a table with ``columns``: each column is
        filled in place (explicit rows at their row numbers, each block's rows
        from its template), text through codes, so a log of millions of rows is
        built without a Python object per row."""
        explicit = pd.DataFrame(self._rows, columns=list(columns))
        if not self._count:  # no communication at all: the same columns, typed
            return explicit.astype(dict(zip(columns, ROW_DTYPES, strict=True)))
        if not self._blocks:
            for name in explicit.columns:  # text as categories, as the block path makes it
                if pd.api.types.is_string_dtype(explicit[name]):
                    explicit[name] = explicit[name].astype("category")
            return explicit
        at = np.asarray(self._row_at, dtype=np.int64)
        fields = list(zip(*self._blocks, strict=True))  # the blocks' fields, column by column
        first, template = np.array(fields[0], np.int64), np.array(fields[1], np.int64)
        seqs, starts, ends = np.array(fields[2], np.int64), np.array(fields[3], float), fields[4]
        del fields
        blocks = []  # per template: (rows, heads, its blocks' indices)
        for t, (heads, _) in enumerate(self._templates):
            mine = np.flatnonzero(template == t)
            rows = (first[mine][:, None] + np.arange(len(heads))).ravel()
            blocks.append((rows, heads, mine))
        data = {}
        for c, name in enumerate(columns):
            if c == 2:  # seq: the block's
                data[name] = self._per_block(explicit[name], at, blocks, seqs)
            elif c >= len(columns) - 3:  # first_arrival, start, end
                data[name] = self._times(explicit[name], at, blocks, starts,
                                         ends if c == len(columns) - 1 else None)
            else:
                column = c if c < 2 else c - 1  # heads leave seq out
                data[name] = _fill(self._count, explicit[name], at,
                                   [(rows, [h[column] for h in heads])
                                    for rows, heads, _ in blocks])
        return pd.DataFrame(data, copy=False)  # no consolidation: columns stay as built

    def _per_block(self, explicit: pd.Series, at: np.ndarray, blocks: list,
                   values: np.ndarray) -> np.ndarray:
        """A column holding one value per block (``values``), repeated over its rows."""
        out = np.empty(self._count, dtype=np.result_type(
            *([explicit.dtype] if len(explicit) else []), values.dtype))
        out[at] = explicit.to_numpy()
        for rows, heads, mine in blocks:
            out[rows] = np.repeat(values[mine], len(heads))
        return out

    def _times(self, explicit: pd.Series, at: np.ndarray, blocks: list, starts: np.ndarray,
               ends: tuple | None) -> np.ndarray:
        """A time column: each block's start, or with ``ends`` (each block's own
        ends, or None where its template has durations) its rows' ends."""
        out = np.empty(self._count)
        out[at] = explicit.to_numpy(dtype=float)
        for (rows, heads, mine), (_, durations) in zip(blocks, self._templates,
                                                         strict=True):
            begin = starts[mine]
            if ends is None:
                out[rows] = np.repeat(begin, len(heads))
            elif durations is not None:
                out[rows] = np.repeat(begin, len(heads)) + np.tile(durations, len(mine))
            else:
                out[rows] = np.fromiter(chain.from_iterable(ends[b] for b in mine.tolist()),
                                        float, count=len(rows))
        return out


def _fill(count: int, explicit: pd.Series, at: np.ndarray,
          blocks: list[tuple[np.ndarray, list]]) -> np.ndarray | pd.api.extensions.ExtensionArray:
    """One column of ``count`` rows: the explicit rows' values at ``at``, and at
    each block's ``rows`` its template's values over and over; text as a
    categorical (categories in text order), built from codes: a log of millions
    of rows holds a few dozen distinct texts."""
    if any(isinstance(v, str) for _, heads in blocks for v in heads[:1]):
        own, distinct = pd.factorize(explicit)  # the explicit rows' few distinct texts
        names, (mine, *theirs) = shared_categories(distinct, *(h for _, h in blocks))
        codes = np.empty(count, dtype=np.int32)
        codes[at] = mine[own]
        for (rows, heads), where in zip(blocks, theirs, strict=True):
            codes[rows] = np.tile(where, len(rows) // len(heads))
        return pd.Categorical.from_codes(codes, categories=names.astype("str"))
    values = [np.asarray(heads) for _, heads in blocks]
    dtype = np.result_type(*([explicit.dtype] if len(explicit) else []), *values)
    out = np.empty(count, dtype=dtype)
    out[at] = explicit.to_numpy()
    for (rows, _), v in zip(blocks, values, strict=True):
        out[rows] = np.tile(v, len(rows) // len(v))
    return out


def shared_categories(*texts: Sequence) -> tuple[pd.Index, list[np.ndarray]]:
    """The sorted union of several lists of distinct texts (as ``pd.Categorical``
    orders text), and each list's positions in it: the codes to give each part
    of a categorical column built from parts.

    >>> names, where = shared_categories(["b", "a"], ["c", "a"])
    >>> list(names), [w.tolist() for w in where]
    (['a', 'b', 'c'], [[1, 0], [2, 0]])
    """
    lists = [np.asarray(t, dtype=object) for t in texts]
    names = pd.Index(sorted(set().union(*(t.tolist() for t in lists))), dtype=object)
    return names, [names.get_indexer(t).astype(np.int32) for t in lists]
