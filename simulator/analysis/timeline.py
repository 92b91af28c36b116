"""Timeline analysis: where each rank's time goes (pure functions on spans).

One definition, used by every output (see docs/design.md):

- compute busy C = union of compute spans; communication busy M = union of
  ``comm`` spans; waiting W = union of ``wait`` spans (in a collective, peers
  not yet there). A pipeline receive waiting for its neighbour stage is not
  in W: that wait is the pipeline bubble (``summary.rank_breakdown``).
- overlapped communication = |C ∩ M|; exposed communication = |M| - |C ∩ M|.
- communication waiting = |W \\ (C ∪ M)|: waiting that nothing else hides.
- bubble = time before the rank's last compute op ends when the rank neither
  computes, communicates nor waits.
- idle = the rest of the iteration (after the rank's last compute op).

So compute + exposed + waiting + bubble + idle = iteration time, for every rank.
All set measures come from ``union_length`` by inclusion-exclusion.

Interval sets are pairs (starts, ends) of arrays, half-open [start, end).
``merge``, ``intersect`` and ``subtract`` return disjoint sorted sets; the
table functions (``rank_table``, ``stream_table``) compute the same measures
for every rank and stream at once with one sort (``grouped_union_length``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from simulator.base.ir import PP_STREAM


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i]).

    >>> union_length(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    4.0
    """
    merged_starts, merged_ends = merge(np.asarray(starts, float), np.asarray(ends, float))
    return float((merged_ends - merged_starts).sum())


Intervals = tuple[np.ndarray, np.ndarray]


def merge(starts: np.ndarray, ends: np.ndarray) -> Intervals:
    """The union of intervals as disjoint sorted intervals (empty ones dropped).

    >>> merge(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    (array([0., 5.]), array([3., 6.]))
    """
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if len(starts) == 0:
        return np.zeros(0), np.zeros(0)
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return s[first], reach[last]


def intersect(a: Intervals, b: Intervals) -> Intervals:
    """Where both interval sets hold, as disjoint sorted intervals.

    >>> intersect((np.array([0.0, 4.0]), np.array([3.0, 8.0])), (np.array([2.0]), np.array([5.0])))
    (array([2., 4.]), array([3., 5.]))
    """
    (sa, ea), (sb, eb) = merge(*a), merge(*b)
    i = j = 0
    out_s, out_e = [], []
    while i < len(sa) and j < len(sb):
        lo, hi = max(sa[i], sb[j]), min(ea[i], eb[j])
        if lo < hi:
            out_s.append(lo)
            out_e.append(hi)
        if ea[i] < eb[j]:
            i += 1
        else:
            j += 1
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)


def subtract(a: Intervals, b: Intervals) -> Intervals:
    """Where ``a`` holds and ``b`` does not, as disjoint sorted intervals.

    >>> subtract((np.array([0.0]), np.array([10.0])), (np.array([2.0, 5.0]), np.array([3.0, 6.0])))
    (array([0., 3., 6.]), array([ 2.,  5., 10.]))
    """
    (sa, ea), (sb, eb) = merge(*a), merge(*b)
    out_s, out_e = [], []
    j = 0
    for start, end in zip(sa, ea, strict=True):
        cursor = start
        while j < len(sb) and eb[j] <= cursor:
            j += 1
        k = j
        while k < len(sb) and sb[k] < end:
            if sb[k] > cursor:
                out_s.append(cursor)
                out_e.append(sb[k])
            cursor = max(cursor, eb[k])
            k += 1
        if cursor < end:
            out_s.append(cursor)
            out_e.append(end)
    return np.array(out_s, dtype=float), np.array(out_e, dtype=float)


def length(intervals: Intervals) -> float:
    """Total length of an interval set (overlaps counted once)."""
    return union_length(*intervals)


def grouped_union_length(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray,
                         count: int) -> np.ndarray:
    """``union_length`` of each group's intervals (groups 0..count-1) in one sort.

    Each group is shifted onto its own stretch of the time axis so that one
    running maximum serves them all.

    >>> grouped_union_length(np.array([0, 0, 1]), np.array([0.0, 1.0, 0.0]),
    ...                      np.array([2.0, 3.0, 1.0]), 3).tolist()
    [3.0, 1.0, 0.0]
    """
    keep = ends > starts
    groups, starts, ends = groups[keep], starts[keep], ends[keep]
    out = np.zeros(count)
    if len(starts) == 0:
        return out
    low = float(starts.min())
    shift = 2.0 * (float(ends.max()) - low) + 1.0
    s = (starts - low) + groups * shift
    e = (ends - low) + groups * shift
    order = np.argsort(s, kind="stable")
    s, e, g = s[order], e[order], groups[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return np.bincount(g[first], weights=reach[last] - s[first], minlength=count)


def grouped_union(groups: np.ndarray, starts: np.ndarray, ends: np.ndarray
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each group's intervals merged where they overlap or touch, as
    ``grouped_union_length`` joins them: (group, start, end) of the merged
    intervals, each start and end one of the inputs' own.

    >>> [a.tolist() for a in grouped_union(np.array([0, 0, 1, 0]),
    ...     np.array([0.0, 1.0, 0.0, 5.0]), np.array([1.0, 3.0, 2.0, 6.0]))]
    [[0, 0, 1], [0.0, 5.0, 0.0], [3.0, 6.0, 2.0]]
    """
    keep = ends > starts
    groups, starts, ends = groups[keep], starts[keep], ends[keep]
    if len(starts) == 0:
        return groups, starts, ends
    low = float(starts.min())
    shift = 2.0 * (float(ends.max()) - low) + 1.0
    order = np.argsort((starts - low) + groups * shift, kind="stable")
    groups, starts, ends = groups[order], starts[order], ends[order]
    s, e = (starts - low) + groups * shift, (ends - low) + groups * shift
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    return groups[first], starts[first], np.maximum.reduceat(ends, first)


def _cat(*sets: tuple[np.ndarray, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    return np.concatenate([s for s, _ in sets]), np.concatenate([e for _, e in sets])


def _clip(interval_set: tuple[np.ndarray, np.ndarray], limit: float):
    s, e = interval_set
    keep = s < limit
    return s[keep], np.minimum(e[keep], limit)


def breakdown(compute: tuple[np.ndarray, np.ndarray], comm: tuple[np.ndarray, np.ndarray],
              wait: tuple[np.ndarray, np.ndarray], iteration_time: float) -> dict[str, float]:
    """Exclusive time categories of one rank; each argument is (starts, ends)."""
    c, m = union_length(*compute), union_length(*comm)
    c_or_m = union_length(*_cat(compute, comm))
    busy = union_length(*_cat(compute, comm, wait))
    last_compute = float(compute[1].max()) if len(compute[1]) else 0.0
    clipped = [_clip(x, last_compute) for x in (compute, comm, wait)]
    bubble = last_compute - union_length(*_cat(*clipped))
    overlapped = c + m - c_or_m
    return {
        "compute_s": c,
        "comm_busy_s": m,
        "overlapped_comm_s": overlapped,
        "exposed_comm_s": m - overlapped,
        "comm_wait_s": busy - c_or_m,
        "comm_wait_total_s": union_length(*wait),
        "bubble_s": bubble,
        "idle_s": iteration_time - busy - bubble,
    }


def rank_intervals(kind: Sequence[str], start: np.ndarray, end: np.ndarray, wanted: str):
    mask = np.asarray(kind) == wanted
    return start[mask], end[mask]


PIPELINE_STREAM = PP_STREAM  # its waits are the pipeline bubble


def rank_table(spans: pd.DataFrame, iteration_time: float) -> pd.DataFrame:
    """``breakdown`` of every rank at once: one row per rank, the same keys.

    Waits on the pipeline stream (a stage waiting for its neighbour) are the
    pipeline bubble, not communication waiting, as in the summary.
    """
    ranks = np.sort(spans["rank"].unique())
    rank_of = np.searchsorted(ranks, spans["rank"].to_numpy())
    n = len(ranks)
    start, end = spans["start"].to_numpy(float), spans["end"].to_numpy(float)
    compute, comm = is_(spans, "kind", "compute"), is_(spans, "kind", "comm")
    wait = is_(spans, "kind", "wait") & ~is_(spans, "stream", PIPELINE_STREAM)

    def union(mask: np.ndarray, limit: np.ndarray | None = None) -> np.ndarray:
        stop = end[mask] if limit is None else np.minimum(end[mask], limit[rank_of[mask]])
        return grouped_union_length(rank_of[mask], start[mask], stop, n)

    c, m = union(compute), union(comm)
    c_or_m, busy = union(compute | comm), union(compute | comm | wait)
    last_compute = np.zeros(n)
    np.maximum.at(last_compute, rank_of[compute], end[compute])
    bubble = last_compute - union(compute | comm | wait, last_compute)
    overlapped = np.clip(c + m - c_or_m, 0.0, np.minimum(c, m))
    return pd.DataFrame({
        "rank": ranks, "compute_s": c, "comm_busy_s": m, "overlapped_comm_s": overlapped,
        "exposed_comm_s": m - overlapped, "comm_wait_s": busy - c_or_m,
        "comm_wait_total_s": union(wait), "bubble_s": bubble,
        "idle_s": iteration_time - busy - bubble,
    })


def stream_table(spans: pd.DataFrame) -> pd.DataFrame:
    """Per (rank, stream): ``busy_s`` (its compute or communication spans),
    ``overlapped_s`` (of that, the time the rank also computes; for the compute
    stream, the time it also communicates), ``exposed_s`` (busy minus
    overlapped, communication streams only) and ``wait_s`` (waiting on that
    stream: for peers in a collective, or on ``pp`` for the neighbour stage)."""
    keys, row = _rank_streams(spans)
    n = len(keys)
    start, end = spans["start"].to_numpy(float), spans["end"].to_numpy(float)
    waits = is_(spans, "kind", "wait")
    work = ~waits
    busy = grouped_union_length(row[work], start[work], end[work], n)
    wait = grouped_union_length(row[waits], start[waits], end[waits], n)
    # The other side of each row's overlap, copied into that row's group: a comm
    # row gets its rank's compute spans, the compute row its rank's comm spans.
    ranks = keys["rank"].to_numpy()
    is_compute_row = (keys["stream"] == "compute").to_numpy()
    comm_rows = np.flatnonzero(~is_compute_row)  # sorted by rank (keys are)
    rank_ids, rank_index = np.unique(ranks, return_inverse=True)
    compute_row = np.full(len(rank_ids), -1)
    compute_row[rank_index[is_compute_row]] = np.flatnonzero(is_compute_row)
    per_rank = np.bincount(rank_index[comm_rows], minlength=len(rank_ids))
    first = np.concatenate([[0], np.cumsum(per_rank)[:-1]])
    span_rank = np.searchsorted(rank_ids, spans["rank"].to_numpy())
    # Merged first (back-to-back kernels are one interval), then copied: far
    # fewer intervals than spans, the same unions.
    computing = is_(spans, "kind", "compute")
    cg, cs, ce = grouped_union(span_rank[computing], start[computing], end[computing])
    reps = per_rank[cg]
    copies = np.repeat(np.arange(len(cg)), reps)
    within = np.arange(len(copies)) - np.repeat(np.cumsum(reps) - reps, reps)
    to_comm = comm_rows[first[cg[copies]] + within]
    talking = work & ~computing
    tg, ts, te = grouped_union(span_rank[talking], start[talking], end[talking])
    has_compute = compute_row[tg] >= 0
    og = np.concatenate([to_comm, compute_row[tg[has_compute]]]).astype(np.int64)
    os_ = np.concatenate([cs[copies], ts[has_compute]])
    oe = np.concatenate([ce[copies], te[has_compute]])
    other = grouped_union_length(og, os_, oe, n)
    bg, bs, be = grouped_union(row[work], start[work], end[work])
    both = grouped_union_length(np.concatenate([bg, og]), np.concatenate([bs, os_]),
                                np.concatenate([be, oe]), n)
    overlapped = np.clip(busy + other - both, 0.0, np.minimum(busy, other))
    exposed = np.where(is_compute_row, 0.0, busy - overlapped)
    return keys.assign(busy_s=busy, overlapped_s=overlapped, exposed_s=exposed, wait_s=wait)


def is_(spans: pd.DataFrame, column: str, value: str) -> np.ndarray:
    """Which spans have ``value`` in a text column (categorical, Arrow or object):
    compared by pandas, without turning a million labels into Python strings."""
    return (spans[column] == value).to_numpy(dtype=bool)


def labels(column: pd.Series) -> np.ndarray:
    """A text column (categorical, Arrow or object) as an object array of Python
    strings, built from its distinct values (a million spans hold a handful)."""
    codes, names = _codes(column)
    return names[codes]


def _codes(column: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """A text column's codes and its distinct values as Python strings."""
    codes, names = pd.factorize(column, sort=False)
    return codes, np.array([str(x) for x in names], dtype=object)


def _rank_streams(spans: pd.DataFrame) -> tuple[pd.DataFrame, np.ndarray]:
    """The distinct (rank, stream) pairs sorted by rank then stream name, and the
    row of each span among them."""
    codes, names = _codes(spans["stream"])
    order = np.argsort(names, kind="stable")
    position = np.empty(len(names), dtype=np.int64)
    position[order] = np.arange(len(names))
    width = max(1, len(names))
    key = spans["rank"].to_numpy(np.int64) * width + position[codes]
    unique, row = np.unique(key, return_inverse=True)
    keys = pd.DataFrame({"rank": unique // width, "stream": names[order][unique % width]})
    return keys, row.reshape(-1)
