"""Compute slowed by overlapped NCCL kernels, solved as a fixed point over runs.

The slow-down (``simulator.compute.contention``) depends on when compute and
NCCL kernels overlap, and changes it. No engine plug-in has to know: every
pass is an ordinary run whose compute durations are the previous pass's
stretched by the NCCL time each op overlapped on its GPU. When a pass gives
back the durations it ran with, its timeline is the exact solution (every op
is as long as the contention it saw in that same timeline). Each pass settles
the ops one step further along every dependency chain, so the passes approach
the fixed point rather than reach it: ``solve`` stops when a pass moves the
iteration time by less than ``SETTLED`` of itself (or it is exact), or after
``passes`` runs, and says which. Where the iteration time swings back (a
longer pass, then a shorter one: stretched kernels that shift which ops
overlap, as in interleaved pipelines), the next pass runs halfway between the
two passes' durations (under-relaxation), which damps the swing; passes that
approach monotonically are left as they are. Where the slow-down could not move the
iteration time by that much to begin with (few kernels overlap NCCL), the run
without it stands, and says so.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.analysis.critical_path import critical_path
from simulator.analysis.timeline import merge
from simulator.base.ir import OpKind, Program
from simulator.compute.contention import COMM_KINDS, NOT_NCCL, stretched
from simulator.engine.records import SimulationError

CONVERGED_S = 1e-9  # a pass whose durations move by less than this is the fixed point
SETTLED = 5e-3  # a pass that moves the iteration time by less than this: the last


@dataclass
class Contention:
    """How a run's contention was solved."""

    factor: float
    passes: int = 1
    residual_s: float = 0.0  # largest duration change another pass would make
    moved: float = 0.0  # what the last pass moved the iteration time by (the first: could)
    path: pd.DataFrame | None = None  # the last run's critical path
    added_s: dict[int, float] | None = None  # per rank: compute time added by it
    events: int = 0  # simulation events of every pass

    def note(self) -> str:
        if self.factor == 1.0:
            return "off (overlap_slowdown 1)"
        head = f"x{self.factor:g} while NCCL runs; "
        if self.residual_s <= CONVERGED_S:
            return head + f"{self.passes} pass{'es' * (self.passes > 1)}, exact (a fixed point)"
        if self.passes == 1:
            return head + (f"not applied: it would add at most {self.moved:.2%} to the "
                           f"iteration time (under {SETTLED:.1%})")
        state = "settled" if self.moved < SETTLED else "NOT settled"
        return head + (f"{self.passes} passes, {state}: the last moved the iteration time "
                       f"by {self.moved:.2%}")


def _compute_ops(program: Program, rank: int, cache: dict
                 ) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """The indices of ``rank``'s compute ops, per stream, in program order, and of
    its ops that are no kernel (``kernel`` None: background traffic's pacing, a
    fixed time NCCL does not slow)."""
    ops = program.ops[rank]
    if id(ops) not in cache:
        streams: dict[str, list[int]] = {}
        for i, op in enumerate(ops):
            if op.kind is OpKind.COMPUTE:
                streams.setdefault(op.stream, []).append(i)
        fixed = [i for i, op in enumerate(ops) if op.kind is OpKind.COMPUTE and op.kernel is None]
        cache[id(ops)] = ({s: np.asarray(v) for s, v in streams.items()},
                          np.asarray(fixed, dtype=int))
    return cache[id(ops)]


def op_starts(span_starts: np.ndarray, span_ends: np.ndarray,
              durations: np.ndarray) -> np.ndarray | None:
    """When each of a stream's ops started, from its compute spans in time order and
    the durations it ran with: one span per op, or (``simulation.span_detail:
    layer``) one per run of ops that ran back to back; None if they do not add up."""
    if len(span_starts) == len(durations):
        return span_starts
    before = np.concatenate(([0.0], np.cumsum(durations)))  # work before each op
    starts, first = np.empty(len(durations)), 0
    for start, end in zip(span_starts.tolist(), span_ends.tolist(), strict=True):
        if first >= len(durations):
            return None
        reach = before[first] + (end - start) + 1e-9 * (1.0 + abs(end))
        stop = max(first + 1, int(np.searchsorted(before, reach, side="right")) - 1)
        starts[first:stop] = start + (before[first:stop] - before[first])
        first = stop
    return starts if first == len(durations) else None


def slowed(spans: pd.DataFrame, program: Program, used: Callable[[int], np.ndarray],
           work: Callable[[int], np.ndarray], factor: float,
           cache: dict) -> dict[int, np.ndarray] | None:
    """Per rank in ``spans`` (a run with the ``used`` durations): its ops'
    durations (``work``: alone) stretched by the NCCL kernels its timeline
    overlaps them with. A stream runs its ops in order, so its compute spans by
    start hold its compute ops in program order; None when they do not."""
    out: dict[int, np.ndarray] = {}
    for rank, frame in spans.groupby("rank", sort=True):
        comm = frame[frame["kind"].isin(COMM_KINDS) & ~frame["name"].isin(NOT_NCCL)]
        begins, ends = merge(comm["start"].to_numpy(), comm["end"].to_numpy())
        alone, ran = np.asarray(work(rank), dtype=float), np.asarray(used(rank), dtype=float)
        durations = alone.copy()
        indices, fixed = _compute_ops(program, int(rank), cache)
        for stream, part in frame[frame["kind"] == "compute"].groupby(
                "stream", observed=True, sort=False):
            where = indices.get(stream, np.empty(0, dtype=int))
            order = np.lexsort((part["end"].to_numpy(), part["start"].to_numpy()))
            starts = op_starts(part["start"].to_numpy()[order], part["end"].to_numpy()[order],
                               ran[where])
            if starts is None:
                return None
            durations[where] = stretched(starts, alone[where], begins, ends, factor)
        durations[fixed] = alone[fixed]
        out[int(rank)] = durations
    return out


def solve(run: Callable, spans_of: Callable, program: Program,
          work: Callable[[int], np.ndarray], factor: float, passes: int,
          lengths: Callable[[pd.DataFrame], np.ndarray] | None = None):
    """Run (``run(durations) -> result``, ``spans_of(result) -> spans``) until the
    durations are a fixed point, a pass moves the iteration time by less than
    ``SETTLED`` of itself, or ``passes`` runs were made: (the last result, its
    spans, a Contention). The first pass runs without the slow-down; a second is
    made only if it could move the iteration time by ``SETTLED`` or more
    (``_most_added``). ``lengths(spans)``: the iteration times to settle (several
    jobs: each one's; default: the run's), the most any moves is what counts.
    """
    state = Contention(factor)
    lengths = lengths or _length
    durations, cache, before, step = work, {}, None, 0.0
    while True:
        result = run(durations)
        state.events += result.events
        spans = spans_of(result)
        if factor == 1.0:
            return result, spans, state
        new = slowed(spans, program, durations, work, factor, cache)
        if new is None:
            raise SimulationError("overlap slow-down: a stream's compute spans do not "
                                  "match its ops")
        length = lengths(spans)
        _measure(state, new, durations, program, length, before)
        if (state.residual_s <= CONVERGED_S or state.moved < SETTLED
                or state.passes >= passes):
            state.added_s = {r: float(np.sum(durations(r)) - np.sum(work(r))) for r in new}
            state.path = critical_path(spans)  # (the summary's, computed once)
            return result, spans, state
        if before is not None and np.any((length - before) * step < 0):  # swings back: relax
            new = relaxed(new, durations)
        if before is not None:
            step = length - before
        state.passes, before = state.passes + 1, length
        durations = _lookup(new, work)


def _measure(state: Contention, new: dict[int, np.ndarray], durations: Callable,
             program: Program, length: np.ndarray, before: np.ndarray | None) -> None:
    """Note on ``state`` what the pass that asks for ``new`` durations moved the
    iteration times by (the first pass: a bound, ``_most_added``: every kernel
    only gets longer) and the largest duration change another pass would make."""
    moved = _most_added(new, durations, program) if before is None else np.abs(
        length - before)
    state.moved = float(np.max(np.divide(moved, length, out=np.zeros(len(length)),
                                         where=length > 0)))
    state.residual_s = max((float(np.max(np.abs(d - durations(r)), initial=0.0))
                            for r, d in new.items()), default=0.0)


def _length(spans: pd.DataFrame) -> np.ndarray:
    return np.array([float(spans["end"].max()) if len(spans) else 0.0])


def relaxed(new: dict[int, np.ndarray], durations: Callable) -> dict[int, np.ndarray]:
    """Halfway between the durations a pass ran with and those it asks for.

    >>> relaxed({0: np.array([2.0, 4.0])}, lambda r: np.array([1.0, 1.0]))[0].tolist()
    [1.5, 2.5]
    """
    return {r: 0.5 * (d + durations(r)) for r, d in new.items()}


def _most_added(new: dict[int, np.ndarray], durations: Callable, program: Program) -> float:
    """What the stretched kernels could add to the iteration time: per pipeline
    stage, the most any of its ranks' kernels get longer, summed over stages. A
    chain of kernels and calls crosses the stages, and within a stage its ranks
    run the same kernels at the same times (exactly so without jitter: it is the
    same for a run by symmetry and a full one), so the chain cannot gain more."""
    most: dict[int, float] = {}
    for rank, stretched_ in new.items():
        stage = program.stage[rank] if program.stage else 0
        added = float(np.sum(stretched_ - durations(rank)))
        most[stage] = max(most.get(stage, 0.0), added)
    return sum(most.values())


def _lookup(table: dict[int, np.ndarray], fallback: Callable) -> Callable:
    return lambda rank: table[rank] if rank in table else fallback(rank)
