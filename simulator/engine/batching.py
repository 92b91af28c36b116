"""Plug-in: a run of ready compute ops costs one SimPy event, not one per kernel.

Compute durations do not depend on anything the network does, so when a
stream reaches a compute op, every following compute op whose dependencies'
ends are already known can be planned at once: each gets its span and end
time, and the stream sleeps once until the last ends. A process on another
stream that depends on a kernel inside the run resumes at that kernel's
planned end (``Engine._finish`` wakes waiters at an op's end, even a future
one). The trace is the reference engine's, with far fewer events.

Contract: ``tests/test_engine.py::test_batched_compute_planning_matches_one_event_per_kernel``
(the same span table as ``Engine``). When compute starts to depend on
concurrent communication (overlap interference), planning must stop at
communication boundaries.
"""

from __future__ import annotations

from collections.abc import Sequence
from itertools import chain
from operator import attrgetter

from simulator.base.ir import HOST_KERNELS, PHASE_NAME, Op
from simulator.engine.core import Engine

PHASE_OF, MEMORY_OF, DEPS_OF = attrgetter("phase"), attrgetter("mem"), attrgetter("deps")


def depended_on(ops: Sequence[Op]) -> set[int]:
    """The ops of a program that some op of it waits for."""
    return set(chain.from_iterable(map(DEPS_OF, ops)))


class BatchedCompute(Engine):
    """Plans consecutive ready compute ops in one step."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.phases: dict[int, list[str]] = {}  # per op tuple: each op's phase name
        self.watched: dict[int, list[bool]] = {}  # per op tuple: has waiters or memory

    def _prepare_rank(self, rank: int, durations: list[float]) -> None:
        super()._prepare_rank(rank, durations)
        ops = self.program.ops[rank]
        if id(ops) not in self.phases:
            self.phases[id(ops)] = list(map(PHASE_NAME.__getitem__, map(PHASE_OF, ops)))
            watched = [False] * len(ops)
            for i in depended_on(ops):
                watched[i] = True
            for i, mem in enumerate(map(MEMORY_OF, ops)):
                if mem:
                    watched[i] = True
            self.watched[id(ops)] = watched

    def _compute(self, rank: int, indices: list[int], pos: int,
                 durations: list[float], at: float | None = None) -> tuple[int, float]:
        """Plan compute ops from ``pos`` (now, or from ``at``) while their inputs'
        ends are known (a hot path: plain loops, no helpers); return the next
        position and the end."""
        ops, done = self.program.ops[rank], self.done[rank]
        t = self.env.now if at is None else at
        phases, spans, watched = self.phases[id(ops)], self.spans, self.watched[id(ops)]
        count, clock = len(indices), self._clocks.get(rank)
        kind = "compute"  # (a stream holds kernels, or only host copies: the offload stream)
        if pos < count and ops[indices[pos]].kernel in HOST_KERNELS:
            kind, clock = "copy", None  # copy engines and the CPU: no GPU clock
        while pos < count:
            i = indices[pos]
            op = ops[i]
            if op.deps:
                start = self.ready_at(rank, op, t)
                if start is None:
                    return pos, t
                t = start
            end = t + durations[i] if clock is None else clock(t, durations[i])
            spans.append((rank, op.stream, kind, op.name, t, end, phases[i],
                          op.microbatch, op.layer, op.bytes, -1))
            if watched[i]:
                self._finish(rank, i, end)
            else:
                done[i] = end
            t, pos = end, pos + 1
        return pos, t

    def ready_at(self, rank: int, op: Op, t: float) -> float | None:
        """When ``op`` can start if its stream is free at ``t``: None if a
        dependency's end is not known yet and no plug-in can settle it now."""
        done, start = self.done[rank], t
        for d in op.deps:  # a plain loop, no max(): a hot path
            end = done[d]
            if end is None:
                end = self.settle(rank, d)
                if end is None:
                    return None
            if end > start:
                start = end
        return start

    def settle(self, rank: int, op_index: int) -> float | None:
        """Fix the end of a not-yet-run op of another stream now, if a plug-in can
        (``exclusive``: a collective on links nobody else uses); else None."""
        return None
