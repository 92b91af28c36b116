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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def union_length(starts: np.ndarray, ends: np.ndarray) -> float:
    """Total length covered by the intervals [starts[i], ends[i]).

    >>> union_length(np.array([0.0, 1.0, 5.0]), np.array([2.0, 3.0, 6.0]))
    4.0
    """
    if len(starts) == 0:
        return 0.0
    order = np.argsort(starts, kind="stable")
    s, e = starts[order], ends[order]
    reach = np.maximum.accumulate(e)
    new = np.ones(len(s), dtype=bool)
    new[1:] = s[1:] > reach[:-1]
    first = np.flatnonzero(new)
    last = np.append(first[1:] - 1, len(s) - 1)
    return float((reach[last] - s[first]).sum())


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
