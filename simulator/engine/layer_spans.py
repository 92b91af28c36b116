"""Plug-in: one compute span per run of kernels of one layer, phase and micro-batch.

For very large runs (``simulation.span_detail: layer``): a *segment* is a run
of consecutive compute ops of one (phase, micro-batch, layer) of which only
the first has dependencies, so a segment always runs back to back once it
starts. It is planned from the stream's duration prefix sums in O(1) and
recorded as one span named ``layer <n>``; adjacent segments of the same layer
merge. Ops inside a segment that others wait for, or that free or allocate
memory, still get their exact end times.

Contract: ``tests/test_parallelism.py::test_layer_span_detail_keeps_the_timeline``
(iteration time, compute, exposed communication, bubble and peak memory equal
the kernel-level run's).
"""

from __future__ import annotations

from itertools import accumulate

from simulator.base.ir import COMPUTE_STREAM, Op, OpKind
from simulator.engine.batching import BatchedCompute
from simulator.engine.records import SimulationError

Segment = tuple[int, list[tuple[int, int]], float]  # (end position, [(position, op)], bytes)


def segments(ops: tuple[Op, ...], compute: list[int], watched: list[bool]
             ) -> dict[int, Segment]:
    """Runs of compute-stream ops that can be planned at once: consecutive compute
    ops of one layer, phase and micro-batch of which only the first has
    dependencies. Keyed by the run's first stream position: (end position,
    [(position, op index)] of ops others wait on or with memory events, bytes)."""
    out: dict[int, Segment] = {}
    pos = 0
    while pos < len(compute):
        first = ops[compute[pos]]
        if first.kind is not OpKind.COMPUTE:
            pos += 1
            continue
        key = (first.phase, first.microbatch, first.layer)
        stop = pos + 1
        while stop < len(compute):
            op = ops[compute[stop]]
            if op.kind is not OpKind.COMPUTE or op.deps or (op.phase, op.microbatch,
                                                             op.layer) != key:
                break
            stop += 1
        marks = [(q, compute[q]) for q in range(pos, stop) if watched[compute[q]]]
        out[pos] = (stop, marks, sum(ops[compute[q]].bytes for q in range(pos, stop)))
        pos = stop
    return out


class LayerSpans(BatchedCompute):
    """Plans whole segments and records one span per layer, phase and micro-batch."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._clocks:  # its plans add durations up; a throttled clock does not
            raise SimulationError("layer spans cannot run GPUs whose speed changes over time "
                                  "(cluster.throttle)")
        self._segments: dict[int, dict[int, Segment]] = {}  # per op tuple
        self._cum: dict[int, list[float]] = {}  # per rank: compute duration prefix sums

    def _prepare_rank(self, rank: int, durations: list[float]) -> None:
        super()._prepare_rank(rank, durations)
        ops, streams = self.program.ops[rank], self._streams[rank]
        if id(ops) not in self._segments:
            self._segments[id(ops)] = segments(ops, streams.get(COMPUTE_STREAM, []),
                                               self.watched[id(ops)])
        if COMPUTE_STREAM in streams:
            self._cum[rank] = list(accumulate(
                (durations[i] for i in streams[COMPUTE_STREAM]), initial=0.0))

    def _compute(self, rank: int, indices: list[int], pos: int,
                 durations: list[float], at: float | None = None) -> tuple[int, float]:
        ops, t = self.program.ops[rank], self.env.now if at is None else at
        phases, segs, cum = self.phases[id(ops)], self._segments[id(ops)], self._cum[rank]
        merged: list | None = None  # the open layer-level span
        while pos < len(indices):
            i = indices[pos]
            op = ops[i]
            if op.deps:
                start = self.ready_at(rank, op, t)
                if start is None:
                    break
                t = start
            stop, marks, nbytes = segs[pos]
            for q, k in marks:
                self._finish(rank, k, t + cum[q + 1] - cum[pos])
            end = t + cum[stop] - cum[pos]
            if merged and merged[5] == t and merged[6:9] == [phases[i], op.microbatch,
                                                             op.layer]:
                merged[5], merged[9] = end, merged[9] + nbytes
            else:
                if merged:
                    self.spans.append(tuple(merged))
                merged = [rank, op.stream, "compute", f"layer {op.layer}", t, end,
                          phases[i], op.microbatch, op.layer, nbytes, -1]
            t, pos = end, stop
        if merged:
            self.spans.append(tuple(merged))
        return pos, t
