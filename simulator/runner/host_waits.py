"""Each compute span's wait for its launch: the spans' ``host_wait_s`` column.

A host-bound kernel's span is its wait for the host's launch and then its own
time (``compute.host.race_waits``: the wait is ``max(0, r_i - g_{i-1})``, the
leading part of the span). The durations carry each op's wait
(``setup.durations_of``'s ``host_waits``, shared by the steps of one kind as the
durations are), and a stream runs its ops in order, so its compute spans by
start are its compute ops in program order (as ``contention.slowed`` reads
them): one span per op takes its op's wait. At ``simulation.span_detail:
layer`` a span holds a run of one layer pass's kernels; each layer pass's
waits are spread over its spans in proportion to their lengths (the total
kept). A wait is at most its span (jittered kernels, ``compute.jitter``, can
be shorter than the host's unjittered wait). Everything else (communication,
copies, kernels the host kept ahead of) is 0.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.base.ir import HOST_KERNELS, PHASE_NAME, OpKind, Program

COLUMN = "host_wait_s"


def attach(spans: pd.DataFrame, program: Program, durations: Callable) -> pd.DataFrame:
    """``spans`` (sorted by rank and start, as ``result.span_table`` makes them)
    with the ``host_wait_s`` column: seconds of each span spent waiting for its
    launch."""
    column = np.zeros(len(spans))
    waits_of = getattr(durations, "host_waits", None)
    if waits_of is not None and len(spans):
        ranks = spans["rank"].to_numpy()
        compute = (spans["kind"] == "compute").to_numpy()
        codes, names = pd.factorize(spans["stream"])  # (categories: no text compared)
        code = {str(name): n for n, name in enumerate(names)}
        cache: dict[int, dict[str, np.ndarray]] = {}
        for rank in np.unique(ranks).tolist():
            waits = waits_of(rank) if rank < program.ranks else None
            if waits is None or not waits.any():
                continue
            lo, hi = np.searchsorted(ranks, [rank, rank + 1])
            rows = lo + np.flatnonzero(compute[lo:hi])
            for stream, where in _kernels(program, rank, cache).items():
                mine = rows[codes[rows] == code.get(stream, -1)]
                column[mine] = _spread(spans, mine, program.ops[rank], where, waits[where])
    length = spans["end"].to_numpy() - spans["start"].to_numpy()
    return spans.assign(**{COLUMN: np.minimum(column, np.maximum(length, 0.0))})


def _kernels(program: Program, rank: int, cache: dict) -> dict[str, np.ndarray]:
    """Each stream's GPU kernels (ops whose spans are ``compute``), in program order."""
    ops = program.ops[rank]
    if id(ops) not in cache:
        streams: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            if op.kind is OpKind.COMPUTE and op.kernel not in HOST_KERNELS:
                streams.setdefault(op.stream, []).append(i)
        cache[id(ops)] = {s: np.asarray(v, dtype=np.int64) for s, v in streams.items()}
    return cache[id(ops)]


def _spread(spans: pd.DataFrame, rows: np.ndarray, ops, where: np.ndarray,
            waits: np.ndarray) -> np.ndarray:
    """The waits of one stream's kernels (``where``, in order) on its spans
    (``rows``, in start order): one each, or a layer pass's spread over its spans
    by length."""
    if len(rows) == len(where):
        return waits
    keys = pd.MultiIndex.from_arrays([
        spans["phase"].to_numpy()[rows].astype(str), spans["microbatch"].to_numpy()[rows],
        spans["layer"].to_numpy()[rows]])
    lengths = spans["end"].to_numpy()[rows] - spans["start"].to_numpy()[rows]
    total = pd.Series(waits).groupby(pd.MultiIndex.from_arrays([
        [PHASE_NAME[ops[i].phase] for i in where.tolist()],
        [ops[i].microbatch for i in where.tolist()], [ops[i].layer for i in where.tolist()]])
    ).sum()
    share = pd.Series(lengths).groupby(keys).transform("sum").to_numpy()
    owed = total.reindex(keys, fill_value=0.0).to_numpy()
    return np.where(share > 0, owed * lengths / np.where(share > 0, share, 1.0), 0.0)
