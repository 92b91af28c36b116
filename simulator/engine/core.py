"""The SimPy engine: runs every rank's program over the fabric and records spans.

Each (rank, stream) pair is one SimPy process walking its ops in order, like a
CUDA stream. An op waits for its ``deps``; a compute op then occupies the
stream for its duration; a collective waits until every member of its group
has arrived (that wait is recorded as a ``wait`` span), then runs as flows on
the shared network (a ``comm`` span).

Compute durations do not depend on anything the network does, so a run of
compute ops whose dependencies are already settled is planned in one step and
costs one SimPy event, not one per kernel; a process on another stream that
depends on a kernel inside the run resumes at that kernel's planned end. The
trace is the same as with one event per kernel, with far fewer events.

Rank folding: given ``simulated`` ranks (one representative of ranks that run
identical programs), only those run; a collective starts when its simulated
members have arrived and still puts its whole group's flows on the fabric, so
the representatives see the same collective times as in the full run when the
groups they stand for use disjoint links (the symmetric layouts Megatron
uses); a test compares folded and full runs.

Gangs: a simulated rank may also *represent* mates that run its op tuple in
lockstep (a tensor-parallel group). At every collective or send it joins, on
behalf of each mate, the mate's own group too, so every group's flows run on
the network; it finishes when the last of those calls ends, and the mates'
spans are its spans. Exact for identical ranks; tests compare with full runs.

Exclusive dimensions: when no other traffic can touch a group's links (the
runner checks that statically, e.g. tensor parallelism filling each server),
a gang's call on that group ends exactly at its isolated time plus latency, so
it completes at a known future time, like a compute kernel, without going
through the network; tests compare with full runs.

Span detail ``layer`` records one compute span per run of kernels of the same
layer, phase and micro-batch instead of one per kernel (for very large runs).

The engine knows nothing of topologies or workloads: it gets a Program, the
GPU of each rank, compute durations, a Fabric and a collective lowering (a
function (collective, GPUs, bytes) -> Lowered, such as ``Collectives``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import numpy as np
import simpy

from simulator.base.ir import COMPUTE_STREAM, Collective, Op, OpKind, Program
from simulator.collectives.tuner import Lowered, execute
from simulator.network.fabric import Fabric
from simulator.network.flows import Network, succeed_at

Span = tuple  # (rank, stream, kind, name, start, end, phase, microbatch, layer, bytes, call)
SPAN_COLUMNS = ("rank", "stream", "kind", "name", "start", "end", "phase", "microbatch",
                "layer", "bytes", "call")  # call: row of the collectives log, -1 for compute
COLLECTIVE_COLUMNS = ("group", "group_index", "seq", "collective", "name", "ranks", "bytes",
                      "algorithm", "protocol", "channels", "first_arrival", "start", "end")


def segments(ops: tuple[Op, ...], compute: list[int], watched: list[bool]
             ) -> dict[int, tuple[int, list[tuple[int, int]], float]]:
    """Runs of compute-stream ops that can be planned at once: consecutive compute
    ops of one layer, phase and micro-batch of which only the first has
    dependencies. Keyed by the run's first stream position: (end position,
    [(position, op index)] of ops others wait on or with memory events, bytes)."""
    out: dict[int, tuple[int, list[tuple[int, int]], float]] = {}
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


class SimulationError(RuntimeError):
    """The program cannot finish (a collective some members never reach)."""


@dataclass
class _Call:
    """One collective call of one group, gathering its members."""

    op: Op
    members: tuple[int, ...]
    done: simpy.Event
    arrivals: dict[int, float] = field(default_factory=dict)
    expected: int = 0  # members that will arrive: the simulated ones
    start: float = 0.0
    end: float = 0.0
    row: int = -1  # its row in the collectives log, once finished


@dataclass
class _Message:
    """One point-to-point message, from the sender's send to the receiver's receive."""

    done: simpy.Event
    start: float | None = None
    end: float | None = None
    row: int = -1


@dataclass
class EngineResult:
    spans: list[Span]
    collectives: list[tuple]
    memory_events: list[list[tuple[float, float, str]]]  # per rank: (time, delta, category)
    events: int
    network_recomputes: int
    mate_calls: dict[int, dict[int, int]] = field(default_factory=dict)


class Engine:
    def __init__(self, program: Program, placement: Sequence[str],
                 durations: Callable[[int], np.ndarray], fabric: Fabric,
                 lowering: Callable[..., Lowered], batch_compute: bool = True,
                 simulated: Sequence[int] | None = None,
                 represents: dict[int, tuple[int, ...]] | None = None,
                 layer_spans: bool = False, exclusive: frozenset[str] = frozenset()) -> None:
        if len(placement) != program.ranks:
            raise SimulationError(f"{program.ranks} ranks but {len(placement)} GPUs placed")
        self.simulated = list(range(program.ranks)) if simulated is None else list(simulated)
        self._simulated = set(self.simulated)
        self._mates = {r: tuple(m) for r, m in (represents or {}).items()}
        for rep, mates in self._mates.items():
            if any(program.ops[m] is not program.ops[rep] for m in mates):
                raise SimulationError(f"rank {rep} cannot represent ranks with other programs")
        self._arriving = self._simulated | {m for ms in self._mates.values() for m in ms}
        self._layer_spans = layer_spans
        self._exclusive = exclusive
        self._cursor: dict[tuple[int, str], int] = {}  # next op position on each stream
        self._streams: dict[int, dict[str, list[int]]] = {}
        self._phases: dict[int, list[str]] = {}  # per op tuple: each op's phase name
        self._watched: dict[int, list[bool]] = {}  # per op tuple: has waiters or memory
        self._alone_cache: dict[tuple, tuple[float, str, tuple]] = {}
        self._send_plans: dict[tuple, list[tuple]] = {}
        self._inlinable: dict[int, list[tuple | None]] = {}
        self._segments: dict[int, dict[int, tuple[int, list, float]]] = {}
        self._cum: dict[int, list[float]] = {}  # per rank: compute stream duration prefix sums
        self.program, self.placement, self.fabric = program, placement, fabric
        self._durations, self._lower = durations, lowering
        self._batch = batch_compute  # False: one SimPy event per kernel (for tests)
        self.env = simpy.Environment()
        self.network = Network(self.env, fabric.capacity)
        self.done: list[list[float | None]] = [[None] * len(ops) for ops in program.ops]
        self._waiters: dict[tuple[int, int], list[simpy.Event]] = {}
        self._calls: dict[tuple[str, int, int], _Call] = {}
        self._messages: dict[tuple[str, int, int], _Message] = {}
        self._seq: list[dict] = [{} for _ in program.ops]  # per rank: call counters
        self._group_of = {dim: {r: g for g, ranks in enumerate(groups) for r in ranks}
                          for dim, groups in program.groups.items()}
        # Members of each group that arrive (simulated or represented), and the groups
        # of exclusive dimensions one simulated rank's gang fills on its own.
        self._expected = {(dim, g): sum(1 for r in ranks if r in self._arriving)
                          for dim, groups in program.groups.items()
                          for g, ranks in enumerate(groups)}
        self._covered = {(dim, g) for dim in exclusive for g, ranks in enumerate(
            program.groups.get(dim, ())) if any(
                set(ranks) == {r, *self._mates.get(r, ())} for r in ranks if r in self._simulated)}
        self.spans: list[Span] = []
        self.collectives: list[tuple] = []
        # gangs: mate rank -> {representative's log row: the mate's own row}
        self.mate_calls: dict[int, dict[int, int]] = {}
        self.memory_events: list[list[tuple[float, float, str]]] = [[] for _ in program.ops]

    def run(self) -> EngineResult:
        layouts: dict[int, tuple[dict, dict]] = {}  # per op tuple: streams, op -> position
        for rank in self.simulated:
            ops = self.program.ops[rank]
            if id(ops) not in layouts:
                streams: dict[str, list[int]] = {}
                where: dict[int, tuple[str, int]] = {}
                for i, op in enumerate(ops):
                    where[i] = (op.stream, len(streams.setdefault(op.stream, [])))
                    streams[op.stream].append(i)
                layouts[id(ops)] = (streams, where)
            streams, where = layouts[id(ops)]
            self._streams[rank] = streams
            durations = [float(x) for x in self._durations(rank)]
            if id(ops) not in self._phases:
                self._phases[id(ops)] = [op.phase.value for op in ops]
                depended = set(d for op in ops for d in op.deps)
                self._watched[id(ops)] = [i in depended or bool(op.mem)
                                          for i, op in enumerate(ops)]
                self._segments[id(ops)] = segments(ops, streams.get(COMPUTE_STREAM, []),
                                                   self._watched[id(ops)])
                self._inlinable[id(ops)] = self._inline_places(ops, streams, where)
            if self._layer_spans and COMPUTE_STREAM in streams:
                self._cum[rank] = list(accumulate(
                    (durations[i] for i in streams[COMPUTE_STREAM]), initial=0.0))
            for stream, indices in streams.items():
                self._cursor[(rank, stream)] = 0
                self.env.process(self._stream(rank, stream, indices, durations))
        events = 0
        try:
            while True:
                self.env.step()
                events += 1
        except simpy.core.EmptySchedule:
            pass
        self._check_finished()
        return EngineResult(self.spans, self.collectives, self.memory_events, events,
                            self.network.recomputes, self.mate_calls)

    def _inline_places(self, ops: tuple[Op, ...], streams: dict[str, list[int]],
                       where: dict[int, tuple[str, int]]) -> list[tuple | None]:
        """Per op: (stream, position, previous op on the stream) for collectives on
        exclusive dimensions, which may run inline; None for the rest."""
        out: list[tuple | None] = [None] * len(ops)
        for i, op in enumerate(ops):
            if op.kind is OpKind.COLLECTIVE and op.group in self._exclusive:
                stream, position = where[i]
                out[i] = (stream, position, streams[stream][position - 1] if position else None)
        return out

    def _stream(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        env, ops, done = self.env, self.program.ops[rank], self.done[rank]
        key = (rank, stream)
        while self._cursor[key] < len(indices):
            pos = self._cursor[key]
            i = indices[pos]
            op = ops[i]
            for d in op.deps:
                while done[d] is None and done[i] is None:
                    yield self._waiter(rank, d)
                if done[i] is None and done[d] > env.now:
                    yield env.timeout(done[d] - env.now)
            if done[i] is not None:  # the compute planner ran it inline meanwhile
                self._cursor[key] = max(self._cursor[key], pos + 1)
                continue
            if op.kind is OpKind.COMPUTE:
                self._cursor[key], end = self._plan_compute(rank, indices, pos, durations)
                yield env.timeout(end - env.now)
            elif op.kind is OpKind.COLLECTIVE:
                self._cursor[key] = pos + 1
                yield from self._collective(rank, i, op)
            else:
                self._cursor[key] = pos + 1
                yield from self._p2p(rank, i, op)

    def _plan_compute(self, rank: int, indices: list[int], pos: int,
                      durations: list[float]) -> tuple[int, float]:
        """Plan consecutive ready compute ops from ``pos``; return next pos and end time.

        With layer spans a whole segment (``segments``) is planned at once from the
        duration prefix sums; otherwise one span per kernel.
        """
        ops, t, done = self.program.ops[rank], self.env.now, self.done[rank]
        phases, spans, watched = self._phases[id(ops)], self.spans, self._watched[id(ops)]
        segs = self._segments[id(ops)] if self._layer_spans else None
        merged: list | None = None  # the open layer-level span
        while pos < len(indices):
            i = indices[pos]
            op = ops[i]
            if all(done[d] is not None and done[d] <= t for d in op.deps):
                start = t
            else:
                start = self._ready_at(rank, op, t)
                if start is None:
                    break
            t = start
            if segs is None:
                end = t + durations[i]
                spans.append((rank, op.stream, "compute", op.name, t, end, phases[i],
                              op.microbatch, op.layer, op.bytes, -1))
                if watched[i]:
                    self._finish(rank, i, end)
                else:
                    done[i] = end
                t, pos = end, pos + 1
            else:
                stop, marks, nbytes = segs[pos]
                cum = self._cum[rank]
                for q, k in marks:
                    self._finish(rank, k, t + cum[q + 1] - cum[pos])
                end = t + cum[stop] - cum[pos]
                if merged and merged[5] == t and merged[6:9] == [phases[i], op.microbatch,
                                                                 op.layer]:
                    merged[5], merged[9] = end, merged[9] + nbytes
                else:
                    if merged:
                        spans.append(tuple(merged))
                    merged = [rank, op.stream, "compute", f"layer {op.layer}", t, end,
                              phases[i], op.microbatch, op.layer, nbytes, -1]
                t, pos = end, stop
            if not self._batch:
                break
        if merged:
            spans.append(tuple(merged))
        return pos, t

    def _ready_at(self, rank: int, op: Op, t: float) -> float | None:
        """When ``op`` can start if its stream is free at ``t``: None if a dependency's
        end is not known yet and cannot be worked out inline."""
        done, start = self.done[rank], t
        for d in op.deps:
            end = done[d] if done[d] is not None else self._inline(rank, d)
            if end is None:
                return None
            start = max(start, end)
        if start > t and not self._batch:
            return None  # one event per kernel: let the process wait
        return start

    def _inline(self, rank: int, op_index: int) -> float | None:
        """Run an exclusive-link collective now, at its planned time, if it is next on
        its stream, its inputs' ends are known, and this rank's gang is its whole
        group; return its end, or None. (A hot path: plain loops, no helpers.)"""
        ops = self.program.ops[rank]
        where = self._inlinable[id(ops)][op_index]
        if where is None:
            return None
        stream, position, previous = where
        key = (rank, stream)
        if self._cursor[key] != position:
            return None
        op, done = ops[op_index], self.done[rank]
        index = self._group_of[op.group][rank]
        if (op.group, index) not in self._covered:
            return None
        start = self.env.now
        for d in (*op.deps, previous) if previous is not None else op.deps:
            end = done[d]
            if end is None:
                return None
            if end > start:
                start = end
        self._cursor[key] = position + 1
        self._alone(rank, op_index, op, index, start)
        return done[op_index]

    def _waiter(self, rank: int, op_index: int) -> simpy.Event:
        event = self.env.event()
        self._waiters.setdefault((rank, op_index), []).append(event)
        return event

    def _finish(self, rank: int, op_index: int, end: float) -> None:
        """Record when an op ends (possibly in the future) and wake its waiters."""
        self.done[rank][op_index] = end
        mem = self.program.ops[rank][op_index].mem
        if mem:
            self.memory_events[rank].extend((end, delta, category) for delta, category in mem)
        if (rank, op_index) in self._waiters:
            delay = max(0.0, end - self.env.now)
            for event in self._waiters.pop((rank, op_index)):  # each wakes when the op ends
                succeed_at(self.env, event, delay)

    def _collective(self, rank: int, op_index: int, op: Op):
        index = self._group_of[op.group][rank]
        if (op.group, index) in self._covered:
            self._alone(rank, op_index, op, index, self.env.now)
            return
        groups: dict[int, list[int]] = {}  # group index -> this gang's members in it
        for r in (rank, *self._mates.get(rank, ())):
            groups.setdefault(self._group_of[op.group][r], []).append(r)
        calls = {g: self._join(members, op) for g, members in groups.items()}
        own = calls[index]
        arrival = self.env.now
        yield self._all([call.done for call in calls.values()])
        if own.start > arrival:
            self.spans.append((rank, op.stream, "wait", op.name, arrival, own.start,
                               op.phase.value, op.microbatch, op.layer, 0.0, own.row))
        self.spans.append((rank, op.stream, "comm", op.name, own.start, own.end,
                           op.phase.value, op.microbatch, op.layer, op.bytes, own.row))
        for g, members in groups.items():
            if g != index:  # mates in other groups: their own call's log row
                for mate in members:
                    self.mate_calls.setdefault(mate, {})[own.row] = calls[g].row
        self._finish(rank, op_index, max(c.end for c in calls.values()))

    def _all(self, events: list[simpy.Event]) -> simpy.Event:
        """One event for several: the event itself, or a condition on all of them."""
        return events[0] if len(events) == 1 else simpy.AllOf(self.env, events)

    def _alone(self, rank: int, op_index: int, op: Op, index: int, start: float) -> None:
        """A call on links no other traffic can use, with its whole group here at
        ``start``: it ends at its isolated time plus latency."""
        cache_key = (op.group, index, op.collective, op.bytes)
        cached = self._alone_cache.get(cache_key)
        if cached is None:
            members = self.program.groups[op.group][index]
            lowered = self._lower(op.collective, [self.placement[r] for r in members], op.bytes)
            duration = self.network.isolated(lowered.routes, lowered.sizes,
                                             lowered.key) + lowered.latency
            cached = self._alone_cache[cache_key] = (duration, op.collective.value, (
                len(members), op.bytes, lowered.algorithm.value, lowered.protocol.value,
                lowered.channels))
        duration, kind, row = cached
        end = start + duration
        self.spans.append((rank, op.stream, "comm", op.name, start, end,
                           self._phases[id(self.program.ops[rank])][op_index], op.microbatch,
                           op.layer, op.bytes, len(self.collectives)))
        self.collectives.append((op.group, index, -1, kind, op.name, *row, start, start, end))
        self._finish(rank, op_index, end)

    def _join(self, ranks: list[int], op: Op) -> _Call:
        """``ranks`` (members of one group: a rank, or a gang's members in it) arrive."""
        rank = ranks[0]
        group_index = self._group_of[op.group][rank]
        seq = self._seq[rank].get(op.group, 0)
        for r in ranks:
            self._seq[r][op.group] = seq + 1
        key = (op.group, group_index, seq)
        call = self._calls.get(key)
        if call is None:
            members = self.program.groups[op.group][group_index]
            call = self._calls[key] = _Call(op, members, self.env.event(),
                                            expected=self._expected[(op.group, group_index)])
        elif (call.op.collective, call.op.bytes) != (op.collective, op.bytes):
            raise SimulationError(
                f"rank {rank} calls {op.collective.value} of {op.bytes:.0f} B as {op.group} "
                f"collective #{seq}, but its group called {call.op.collective.value} of "
                f"{call.op.bytes:.0f} B")
        for r in ranks:
            call.arrivals[r] = self.env.now
        if len(call.arrivals) == call.expected:
            del self._calls[key]
            self._execute(call, key)
        return call

    def _execute(self, call: _Call, key: tuple[str, int, int]) -> None:
        """Run a call whose members are all there: its flows, then its latency."""
        call.start = self.env.now
        kind: Collective = call.op.collective
        gpus = [self.placement[r] for r in call.members]
        lowered = self._lower(kind, gpus, call.op.bytes)

        def finished(_event=None) -> None:
            call.end, call.row = self.env.now, len(self.collectives)
            self.collectives.append((*key, kind.value, call.op.name, len(call.members),
                                     call.op.bytes, lowered.algorithm.value,
                                     lowered.protocol.value, lowered.channels,
                                     min(call.arrivals.values()), call.start, call.end))
            call.done.succeed()

        if lowered.steps != 1:
            self.env.process(execute(self.network, lowered)).callbacks.append(finished)
            return
        self.network.transfer(lowered.routes, lowered.sizes, key=lowered.key,
                              then=lowered.latency).callbacks.append(finished)

    def _message(self, rank: int, op: Op) -> tuple[tuple[str, int, int], _Message]:
        """The message ``rank``'s next send or receive on ``op.group`` is part of."""
        pair_index = self._group_of[op.group][rank]
        counter = (op.group, op.kind)  # sends and receives are numbered apart
        seq = self._seq[rank].get(counter, 0)
        self._seq[rank][counter] = seq + 1
        key = (op.group, pair_index, seq)
        message = self._messages.get(key)
        if message is None:
            message = self._messages[key] = _Message(self.env.event())
        return key, message

    def _p2p(self, rank: int, op_index: int, op: Op):
        """Eager point-to-point: a send starts its transfer at once; a receive waits
        for it (``wait`` until the transfer starts, ``comm`` while it flows)."""
        arrival = self.env.now
        mine = [self._message(r, op) for r in (rank, *self._mates.get(rank, ()))]
        if op.kind is OpKind.SEND:
            self._send(mine, op)
        yield self._all([m.done for _, m in mine])
        key, message = mine[0]
        start = max(arrival, message.start)
        if op.kind is OpKind.RECV and start > arrival:
            self.spans.append((rank, op.stream, "wait", op.name, arrival, start,
                               op.phase.value, op.microbatch, op.layer, 0.0, message.row))
        if message.end > start:
            self.spans.append((rank, op.stream, "comm", op.name, start, message.end,
                               op.phase.value, op.microbatch, op.layer, op.bytes, message.row))
        for mate, (_, other) in zip(self._mates.get(rank, ()), mine[1:], strict=True):
            self.mate_calls.setdefault(mate, {})[message.row] = other.row
        self._finish(rank, op_index, max(arrival, *(m.end for _, m in mine)))
        if op.kind is OpKind.RECV:
            for other_key, _ in mine:
                del self._messages[other_key]

    def _send(self, messages: list[tuple[tuple[str, int, int], _Message]], op: Op) -> None:
        """Start a gang's messages now, batched per latency: one rate computation for
        the lot (the mates send in lockstep), each message ending with its own flows."""
        for latency, batch, calls, key in self._send_plan(op, [k[1] for k, _ in messages]):
            for i, lowered in batch:  # log each message before waking anyone
                message_key, message = messages[i]
                message.start = self.env.now
                message.done.callbacks.insert(0, self._arrived(message_key, message, lowered,
                                                               op))
            if len(batch) == 1:
                (routes, sizes), = calls
                self.network.transfer(routes, sizes, key=key, then=latency,
                                      done=messages[batch[0][0]][1].done)
            else:
                self.network.transfer_batch(calls, key=key, then=latency,
                                            events=[messages[i][1].done for i, _ in batch])

    def _send_plan(self, op: Op, pairs: list[int]) -> list[tuple]:
        """How a gang's sends on these pairs go out (cached): per latency, the
        messages (position, lowering), their flows and a shape key."""
        cache_key = (op.group, tuple(pairs), op.bytes)
        plan = self._send_plans.get(cache_key)
        if plan is None:
            batches: dict[float, list] = {}
            for i, pair_index in enumerate(pairs):
                pair = self.program.groups[op.group][pair_index]
                lowered = self._lower(Collective.SEND_RECV, [self.placement[pair[0]],
                                                             self.placement[pair[1]]], op.bytes)
                batches.setdefault(lowered.latency, []).append((i, lowered))
            plan = self._send_plans[cache_key] = [
                (latency, batch, [(lowered.routes, lowered.sizes) for _, lowered in batch],
                 batch[0][1].key if len(batch) == 1 else
                 ("batch", *(lowered.key for _, lowered in batch)))
                for latency, batch in batches.items()]
        return plan

    def _arrived(self, key: tuple, message: _Message, lowered: Lowered, op: Op) -> Callable:
        """The callback that logs a message when it arrives."""
        def arrived(_event=None) -> None:
            message.end, message.row = self.env.now, len(self.collectives)
            self.collectives.append((*key, "send_recv", op.name, 2, op.bytes,
                                     lowered.algorithm.value, lowered.protocol.value,
                                     lowered.channels, message.start, message.start,
                                     message.end))
        return arrived

    def _check_finished(self) -> None:
        for key, call in self._calls.items():
            missing = [r for r in call.members if r not in call.arrivals and r in self._simulated]
            raise SimulationError(
                f"deadlock: {key[0]} collective #{key[2]} ({call.op.name}) of group {key[1]} "
                f"waits for ranks {missing[:8]} that never call it")
        for key, message in self._messages.items():
            if message.start is None:
                raise SimulationError(f"deadlock: {key[0]} message #{key[2]} of pair {key[1]} "
                                      "is received but never sent")
        for rank in self.simulated:
            for stream, indices in self._streams[rank].items():
                if self._cursor[(rank, stream)] < len(indices):
                    raise SimulationError(f"rank {rank} did not finish its {stream} stream")
