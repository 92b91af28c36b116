"""Plug-in: a pipeline step's kernels and tensor-parallel calls replayed from a template.

A deep pipeline's program is thousands of steps (one forward or backward of
one micro-batch through one chunk), and the steps of one kind are the same ops
(``Program.steps``: equal keys). Once a step's first kernel can start, its
kernels and its calls on links no other traffic uses (``exclusive``) depend
only on each other and on ops that have already been planned: compute
durations do not depend on the network, and an exclusive call takes a fixed
time. So each kind is compiled once into a template (per op: its duration, the
covered ops it waits for, whether it waits for others), and every instance is
one replay: the planner's own maxima and sums, in the same order (so every end
equals the planner's to the last bit), without a call per op; its calls are
logged as the planner logs them, and its spans are one record (``SpanRuns``)
that the run's table expands with array operations. Instances of one kind whose
durations differ (stretched by overlapped NCCL kernels: ``compute.contention``)
get templates of their own.

A step is replayed only where the planner would plan all of it at once: the
exclusive stream is at the step's first call, and every op outside the step
that a covered op waits for has been planned (else the step is planned op by
op, as before). Processes already waiting for a covered op are woken at its
end, and its memory events are recorded, as ``Engine._finish`` does.

Contract: ``tests/test_engine_plugins.py::test_replayed_steps_give_the_reference_timeline``
(spans, log rows and memory events equal the reference engine's on pipelines
with and without interleaving, recomputation, sequence and data parallelism),
``test_steps_of_one_key_hold_the_same_ops`` (the builder's side) and the
symmetry tests.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from functools import partial

import numpy as np
import pandas as pd

from simulator.base.ir import COMPUTE_STREAM, PHASE_NAME, OpKind
from simulator.engine.exclusive import ExclusiveLinks
from simulator.engine.records import SimulationError


@dataclass(frozen=True)
class Template:
    """One step kind's covered ops, in program order, as the planner runs them."""

    index: int  # in SpanRuns.templates
    size: int  # ops in the step (an instance of another size is not this kind)
    kernels: int  # compute-stream positions it covers
    # per exclusive stream it covers ("lane"): (stream, op offset from the step's
    # first op of its first call there, its calls: consecutive on the stream)
    lanes: tuple[tuple[str, int, int], ...]
    # per covered op: (op offset, its lane or -1 for a kernel, duration, span
    # duration, slots of the covered ops it depends on, whether it depends on ops
    # outside them)
    ops: tuple[tuple[int, int, float, float, tuple[int, ...], bool], ...]
    offsets: tuple[int, ...]  # each covered op's offset from the step's first op
    last_kernel: int  # slot of the last kernel: the compute stream is free at its end
    memory: tuple[tuple[int, float, str], ...]  # (slot, bytes, category) at an op's end
    logged: tuple[tuple[int, list, list, int, int | None], ...]  # per call: slot, log block


@dataclass
class SpanRuns:
    """Spans of replayed steps: a (rank, template, micro-batch, first log row) record
    per step, every span's start and end in record order, and each template's
    other span columns (``call``: offset from the first row, -1 for kernels)."""

    templates: list[dict[str, list]]
    records: list[tuple[int, int, int, int]]
    starts: list[float]
    ends: list[float]


class Passes(ExclusiveLinks):
    """Replays the steps of a kind from their template."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if self._clocks:  # its plans add durations up; a throttled clock does not
            raise SimulationError("replayed passes cannot run GPUs whose speed changes over time "
                                  "(cluster.throttle)")
        self._step_at: dict[int, dict[int, tuple[int, int, object]]] = {}  # op tuple: pos ->
        self._templates: dict[tuple, Template | None] = {}  # (rank, key, first kernel,
        # its durations)
        self.span_runs = SpanRuns([], [], [], [])

    def run(self):
        result = super().run()
        if self.span_runs.records:  # (the records only: the engine is freed after the run)
            result.replayed = partial(expand, self.span_runs)
        result.steps_replayed = len(self.span_runs.records)
        return result

    def _prepare_rank(self, rank: int, durations: list[float]) -> None:
        super()._prepare_rank(rank, durations)
        ops = self.program.ops[rank]
        if id(ops) in self._step_at:
            return
        if not self.program.steps:  # a program without marked steps: nothing to replay
            self._step_at[id(ops)] = {}
            return
        compute = self._streams[rank].get(COMPUTE_STREAM, [])
        at: dict[int, tuple[int, int, object]] = {}
        for first, end, key in self.program.steps[rank]:
            pos = bisect_left(compute, first)
            if pos < len(compute) and compute[pos] < end:
                at[pos] = (first, end, key)
        self._step_at[id(ops)] = at

    def _compute(self, rank: int, indices: list[int], pos: int,
                 durations: list[float], at: float | None = None) -> tuple[int, float]:
        step = self._step_at[id(self.program.ops[rank])].get(pos)
        if step is not None:
            first, end, _ = step
            template = self._template(rank, step, indices, pos, durations)
            if template is not None and template.size == end - first:
                planned = self._replay(rank, template, first,
                                       self.env.now if at is None else at)
                if planned is not None:
                    return self._commit(rank, template, first, pos, *planned)
        return super()._compute(rank, indices, pos, durations, at)

    def _replay(self, rank: int, template: Template, first: int, t: float
              ) -> tuple[list[float], list[float], list[float]] | None:
        """Each covered op's start, span end and end, the step starting at ``t``,
        with the planner's arithmetic (the same floating-point operations in the
        same order); None when an op outside the step that one of them needs has
        not been planned yet, or the exclusive stream is not at the step's first
        call."""
        done, ops = self.done[rank], self.program.ops[rank]
        compute_free, free = t, []  # free: each lane's
        for stream, first_call, _ in template.lanes:
            _, position, previous, _ = self.inlinable[id(ops)][first + first_call]
            if self._cursor[(rank, stream)] != position:
                return None
            free.append(t)
            if previous is not None:
                if done[previous] is None:
                    return None
                if done[previous] > t:
                    free[-1] = done[previous]
        starts, shown, ends = [], [], []
        for offset, lane, duration, span, inner, outer in template.ops:
            start = compute_free if lane < 0 else free[lane]
            for slot in inner:
                if ends[slot] > start:
                    start = ends[slot]
            if outer:
                for d in ops[first + offset].deps:
                    end = done[d]
                    if end is None:
                        return None
                    if end > start:
                        start = end
            end = start + duration
            starts.append(start)
            ends.append(end)
            if lane >= 0:
                shown.append(start + span)
                free[lane] = end
            else:
                shown.append(end)
                compute_free = end
        return starts, shown, ends

    def _commit(self, rank: int, template: Template, first: int, pos: int,
                starts: list[float], shown: list[float], ends: list[float]
                ) -> tuple[int, float]:
        done, waiters, row = self.done[rank], self._waiters, len(self.collectives)
        for slot, block, durations, own, plan in template.logged:
            self.log_alone(rank, block, durations, own, plan, starts[slot])
        self.calls_alone += len(template.logged)
        for offset, end in zip(template.offsets, ends):  # noqa: B905 - equal by making
            i = first + offset
            done[i] = end
            if (rank, i) in waiters:  # a process waiting already (a later one sees the end)
                self._wake(rank, i, end)
        if template.memory:
            self.memory_events[rank].extend((ends[slot], delta, category)
                                            for slot, delta, category in template.memory)
        for stream, _, calls in template.lanes:
            self._cursor[(rank, stream)] += calls
        runs = self.span_runs
        runs.records.append((rank, template.index, self.program.ops[rank][
            first + template.ops[0][0]].microbatch, row))
        runs.starts.extend(starts)
        runs.ends.extend(shown)
        return pos + template.kernels, ends[template.last_kernel]

    def _template(self, rank: int, step: tuple, indices: list[int], pos: int,
                  durations: list[float]) -> Template | None:
        first, end, key = step  # (steps of one kind whose durations differ: own templates)
        if self.sharing(rank, first, end):  # (not cached: another instance may run alone)
            return None
        cache = (rank, key, indices[pos] - first, tuple(durations[first:end]))
        if cache not in self._templates:
            self._templates[cache] = self._make(rank, first, end, indices[pos], durations)
        return self._templates[cache]

    def _make(self, rank: int, first: int, end: int, kernel: int,
              durations: list[float]) -> Template | None:
        """The template of the step ``[first, end)`` whose first kernel is ``kernel``,
        or None when its ops cannot be replayed (a non-kernel op on the compute
        stream, a call that is not exclusive here, ranks of a gang out of step)."""
        ops = self.program.ops[rank]
        inlinable = self.inlinable[id(ops)]
        covered = []
        for i in range(kernel, end):
            op = ops[i]
            if op.stream == COMPUTE_STREAM:
                if op.kind is not OpKind.COMPUTE:
                    return None
                covered.append(i)
            elif inlinable[i] is not None:
                if (op.group, rank) not in self.covered:
                    return None
                covered.append(i)
        if {ops[i].microbatch for i in covered} != {ops[kernel].microbatch}:
            return None
        return self._build(rank, (first, end), covered, durations)

    def _build(self, rank: int, step: tuple[int, int], covered: list[int],
               durations: list[float]) -> Template | None:
        """The covered ops as instructions, their log blocks and span columns."""
        first, end = step
        ops, inlinable = self.program.ops[rank], self.inlinable[id(self.program.ops[rank])]
        slot = {i: n for n, i in enumerate(covered)}
        lanes: dict[str, list] = {}  # stream: [its lane, first call's offset, calls]
        program, logged, rows = [], [], 0  # rows: log rows of the calls so far
        columns: dict[str, list] = {name: [] for name in SPAN_FIELDS}
        for n, i in enumerate(covered):
            op = ops[i]
            inner = tuple(slot[d] for d in op.deps if d in slot)
            outer = n == 0 or len(inner) < len(op.deps)
            if op.kind is OpKind.COMPUTE:
                program.append((i - first, -1, durations[i], 0.0, inner, outer))
                _span(columns, op, "compute", -1)
                continue
            block, times, uniform, own, plan, longest = self.alone_block(rank, op)
            if not uniform:
                return None
            lane = lanes.setdefault(inlinable[i][0], [len(lanes), i - first, 0])
            lane[2] += 1
            program.append((i - first, lane[0], longest, times[own], inner, outer))
            _span(columns, op, "comm", rows + own)
            logged.append((n, block, times, own, plan))
            rows += len(block)
        if all(lane >= 0 for _, lane, *_ in program):
            return None
        self.span_runs.templates.append(columns)
        return Template(
            len(self.span_runs.templates) - 1, end - first,
            sum(1 for i in covered if ops[i].stream == COMPUTE_STREAM),
            tuple((stream, at, count) for stream, (_, at, count) in lanes.items()),
            tuple(program), tuple(i - first for i in covered),
            max(n for n, (_, lane, *_) in enumerate(program) if lane < 0),
            tuple((slot[i], delta, category) for i in covered
                  for delta, category in ops[i].mem), tuple(logged))


SPAN_FIELDS = ("stream", "kind", "name", "phase", "layer", "bytes", "call")
TEXT = ("stream", "kind", "name", "phase")


def _span(columns: dict[str, list], op, kind: str, call: int) -> None:
    for name, value in zip(SPAN_FIELDS, (op.stream, kind, op.name, PHASE_NAME[op.phase],
                                         op.layer, op.bytes, call), strict=True):
        columns[name].append(value)


def expand(runs: SpanRuns) -> dict[str, np.ndarray]:
    """The records' spans as columns (``SPAN_COLUMNS``), in record order; text
    columns as (codes, categories)."""
    if not runs.records:
        return {}
    sizes = np.array([len(t["call"]) for t in runs.templates], dtype=np.int64)
    offsets = np.concatenate(([0], np.cumsum(sizes)))
    ranks, which, micro, rows = (np.array(c, dtype=np.int64)
                                 for c in zip(*runs.records, strict=True))
    counts = sizes[which]
    record = np.repeat(np.arange(len(which)), counts)
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    at = offsets[which][record] + within
    flat = {name: np.concatenate([np.asarray(t[name], dtype=object if name in TEXT else None)
                                  for t in runs.templates]) for name in SPAN_FIELDS}
    text = {name: pd.factorize(flat[name]) for name in TEXT}  # codes of few distinct texts
    call = flat["call"][at]
    return {
        "rank": ranks[record], "start": np.array(runs.starts, dtype=float),
        "end": np.array(runs.ends, dtype=float), "microbatch": micro[record],
        "layer": flat["layer"][at], "bytes": flat["bytes"][at],
        "call": np.where(call >= 0, rows[record] + call, -1),
        **{name: (codes[at], categories) for name, (codes, categories) in text.items()},
    }
