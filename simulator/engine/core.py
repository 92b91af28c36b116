"""The reference engine: the model's rules, one SimPy event per kernel, no modes.

Each (rank, stream) pair is one SimPy process walking its ops in order, like a
CUDA stream. An op first waits for its ``deps`` (ops of other streams of the
same rank). Then:

- a compute op occupies its stream for its duration (one ``compute`` span),
  or, on a GPU whose speed changes over time, until its clock says its work is
  done (``clocks``: ``compute.throttle``);
- the fabric may change at given times (``changes``: a part fails or degrades
  during the iteration): flows in flight go on at the new capacities;
- a collective joins the n-th call of its group (NCCL requires every member to
  call a group's collectives in the same order); the call starts when the last
  member arrives (the wait is a ``wait`` span), then runs as the lowering's
  flows on the shared network plus its latency (a ``comm`` span);
- a send starts its transfer at once (eager, as Megatron's batched isend); the
  matching receive (the n-th of the pair) waits for it: ``wait`` until the
  transfer starts, ``comm`` while it flows.

The loop is SimPy's own (``Environment.step`` until the schedule is empty), as
in SimPy's ``core.py``. The recorders are plain lists: spans, the
communication log (one row per call or message, in the order they end) and
memory events ((time, delta, category) per rank, applied at an op's end).

Speed-ups are subclasses in their own modules (``batching``, ``layer_spans``,
``passes``, ``pipeline_streams``, ``folding``, ``gangs``, ``call_groups``,
``exclusive``) that override the hooks below; each has an equivalence test
against this class as its contract. ``HOOKS``: ``_process`` (the generator run
for a stream), ``_compute`` (plan compute ops from a stream position),
``_collective`` and ``_p2p`` (generators for one op), ``_waiter`` (the event an
op's dependants wait on), ``_prepare_rank`` (a rank's plan before it runs),
``_arriving`` (the ranks calls wait for), ``_expander`` and ``_inexact``.
``PLUGIN_API``: the core's state and helpers a plug-in may use besides
(``tests/test_architecture.py`` checks that plug-ins use nothing else of the
core's, and no other plug-in's protected names: what one offers another is
public, e.g. ``Gangs.check_lockstep``).

The engine knows nothing of topologies or workloads: it gets a Program, the
GPU of each rank, compute durations, a Fabric and a collective lowering (a
function (collective, GPUs, bytes) -> Lowered, such as ``Collectives``).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

import numpy as np
import simpy

from simulator.base.ir import HOST_KERNELS, PHASE_NAME, Collective, Op, OpKind, Program
from simulator.collectives.tuner import Lowered, execute
from simulator.engine.call_log import CallLog
from simulator.engine.records import (
    Call,
    EngineResult,
    Message,
    SimulationError,
    Span,
)
from simulator.network.fabric import Fabric
from simulator.network.flows import Network, succeed_at

STREAM_OF = attrgetter("stream")
HOOKS = frozenset({"_process", "_compute", "_collective", "_p2p", "_waiter", "_prepare_rank",
                   "_arriving", "_expander", "_inexact"})
PLUGIN_API = frozenset({
    # state: GPU clocks, each stream's next op and ops, waiters, call counters, each
    # rank's group index per dimension, messages in flight, the collective lowering
    "_clocks", "_cursor", "_streams", "_waiters", "_seq", "_group_of", "_messages", "_lower",
    # helpers: wait for all, an arrival's callback, an op's end, a call's join, a message,
    # a span's record, a stream's generator, waking an op's waiters
    "_all", "_arrived", "_finish", "_join", "_message", "_record", "_stream", "_wake",
})
ROUNDING = 1e-12  # seconds: shorter waits and transfers are floating-point rounding (no
# kernel or message of the model lasts a picosecond)


class Engine:
    """Runs every rank's program over the fabric and records what happened."""

    def __init__(self, program: Program, placement: Sequence[str],
                 durations: Callable[[int], np.ndarray], fabric: Fabric,
                 lowering: Callable[..., Lowered],
                 clocks: Mapping[int, Callable[[float, float], float]] | None = None,
                 changes: Sequence[tuple[float, Fabric, Callable[..., Lowered]]] = ()) -> None:
        if len(placement) != program.ranks:
            raise SimulationError(f"{program.ranks} ranks but {len(placement)} GPUs placed")
        self.program, self.placement, self.fabric = program, placement, fabric
        self._durations, self._lower = durations, lowering
        # per rank whose GPU's speed changes over time: (start, work) -> end
        self._clocks: Mapping[int, Callable[[float, float], float]] = clocks or {}
        self._changes = changes  # (time, the fabric from then on, its lowering)
        self.ranks: list[int] = list(range(program.ranks))  # ranks whose programs run
        self.env = simpy.Environment()
        self.network = Network(self.env, fabric.capacity)
        self.done: list[list[float | None]] = []  # per running rank: each op's end (run)
        self._cursor: dict[tuple[int, str], int] = {}  # next op position on each stream
        self._streams: dict[int, dict[str, list[int]]] = {}
        self._waiters: dict[tuple[int, int], list[simpy.Event]] = {}
        self._calls: dict[tuple[str, int, int], Call] = {}
        self._messages: dict[tuple[str, int, int], Message] = {}
        self._seq: list[dict] = [{} for _ in program.ops]  # per rank: call counters
        self._group_of = {dim: {r: g for g, ranks in enumerate(groups) for r in ranks}
                          for dim, groups in program.groups.items()}
        self._expected: dict[tuple[str, int], int] = {}
        self.spans: list[Span] = []
        self.collectives = CallLog()
        self.memory_events: list[list[tuple[float, float, str]]] = [[] for _ in program.ops]

    def run(self) -> EngineResult:
        self._expected = self._expected_arrivals()
        running = set(self.ranks)
        self.done = [[None] * len(ops) if r in running else []  # ranks that run only
                     for r, ops in enumerate(self.program.ops)]
        layouts: dict[int, dict[str, list[int]]] = {}  # per op tuple: stream -> op indices
        for rank in self.ranks:
            ops = self.program.ops[rank]
            if id(ops) not in layouts:
                streams: defaultdict[str, list[int]] = defaultdict(list)
                for i, stream in enumerate(map(STREAM_OF, ops)):
                    streams[stream].append(i)
                layouts[id(ops)] = dict(streams)
            self._streams[rank] = layouts[id(ops)]
            durations = np.asarray(self._durations(rank), dtype=float).tolist()
            self._prepare_rank(rank, durations)
            for stream, indices in self._streams[rank].items():
                self._cursor[(rank, stream)] = 0
                self.env.process(self._process(rank, stream, indices, durations))
        for at, fabric, lowering in self._changes:
            self.env.timeout(at).callbacks.append(
                lambda _event, f=fabric, low=lowering: self._change(f, low))
        events = 0
        try:
            while True:
                self.env.step()
                events += 1
        except simpy.core.EmptySchedule:
            pass
        self._check_finished()
        return EngineResult(self.spans, self.collectives, self.memory_events, events,
                            self.network.recomputes, self.ranks, self._expander(),
                            self._inexact())

    def _change(self, fabric: Fabric, lowering: Callable[..., Lowered]) -> None:
        """The fabric changes now (a part fails, degrades or recovers): flows in
        flight continue at the new capacities (around failed parts), calls from
        now on are lowered on the new fabric."""
        self.fabric, self._lower = fabric, lowering
        self.network.change(fabric.capacity, fabric.reroute)

    # -- hooks -------------------------------------------------------------------

    def _arriving(self) -> set[int] | None:
        """The ranks that arrive at calls (running, or stood for by one that runs);
        None: every rank."""
        return None

    def _expected_arrivals(self) -> dict[tuple[str, int], int]:
        """Per (dimension, group index): how many members a call waits for."""
        arriving = self._arriving()
        return {(dim, g): len(ranks) if arriving is None else
                sum(1 for r in ranks if r in arriving)
                for dim, groups in self.program.groups.items() for g, ranks in enumerate(groups)}

    def _prepare_rank(self, rank: int, durations: list[float]) -> None:
        """Called once per running rank before its streams start."""

    def _process(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        """The generator that runs one stream."""
        return self._stream(rank, stream, indices, durations)

    def _compute(self, rank: int, indices: list[int], pos: int,
                 durations: list[float], at: float | None = None) -> tuple[int, float]:
        """Run the compute op at stream position ``pos`` now, or at ``at`` (a plug-in
        that plans a stream ahead; its inputs are there): return the next position
        and when the stream is free again."""
        i, clock = indices[pos], self._clocks.get(rank)
        op = self.program.ops[rank][i]
        host = op.kernel in HOST_KERNELS  # a copy engine's or the CPU's: no GPU clock
        t = self.env.now if at is None else at
        end = t + durations[i] if clock is None or host else clock(t, durations[i])
        self.spans.append((rank, op.stream, "copy" if host else "compute", op.name, t, end,
                           PHASE_NAME[op.phase], op.microbatch, op.layer, op.bytes, -1))
        self._finish(rank, i, end)
        return pos + 1, end

    def _inexact(self) -> str | None:
        """For plug-ins whose exactness rests on a condition checked during the run:
        why this run may differ from the reference's, or None."""
        return None

    def _expander(self) -> Callable | None:
        """For plug-ins that run fewer ranks than they stand for: a function
        (spans DataFrame, node of each rank) -> every rank's spans. It must not
        hold the engine, which is freed after the run."""
        return None

    # -- the model's rules ---------------------------------------------------------

    def _stream(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        env, ops, done = self.env, self.program.ops[rank], self.done[rank]
        key = (rank, stream)
        while self._cursor[key] < len(indices):
            pos = self._cursor[key]
            i = indices[pos]
            op = ops[i]
            for d in op.deps:
                while done[d] is None:
                    yield self._waiter(rank, d)
                if done[d] > env.now:
                    yield env.timeout(done[d] - env.now)
            if op.kind is OpKind.COMPUTE:
                self._cursor[key], end = self._compute(rank, indices, pos, durations)
                yield env.timeout(end - env.now)
            elif op.kind is OpKind.COLLECTIVE:
                self._cursor[key] = pos + 1
                yield from self._collective(rank, i, op)
            else:
                self._cursor[key] = pos + 1
                yield from self._p2p(rank, i, op)

    def _waiter(self, rank: int, op_index: int) -> simpy.Event:
        event = self.env.event()
        self._waiters.setdefault((rank, op_index), []).append(event)
        return event

    def _finish(self, rank: int, op_index: int, end: float) -> None:
        """Record when an op ends (possibly in the future) and wake its waiters then."""
        self.done[rank][op_index] = end
        mem = self.program.ops[rank][op_index].mem
        if mem:
            self.memory_events[rank].extend((end, delta, category) for delta, category in mem)
        if (rank, op_index) in self._waiters:
            self._wake(rank, op_index, end)

    def _wake(self, rank: int, op_index: int, end: float) -> None:
        """Wake the processes waiting for an op at its end (now or later)."""
        delay = max(0.0, end - self.env.now)
        for event in self._waiters.pop((rank, op_index)):
            succeed_at(self.env, event, delay)

    def _all(self, events: list[simpy.Event]) -> simpy.Event:
        """One event for several: the event itself, or a condition on all of them."""
        return events[0] if len(events) == 1 else simpy.AllOf(self.env, events)

    def _record(self, rank: int, op: Op, arrival: float, start: float, end: float,
                row: int) -> None:
        """A communication op's spans: waiting from arrival to start, then moving data
        (a span shorter than ``ROUNDING`` is the rounding of two paths to one
        time, which engines that replay steps add in another order: none)."""
        if start > arrival + ROUNDING:
            self.spans.append((rank, op.stream, "wait", op.name, arrival, start,
                               PHASE_NAME[op.phase], op.microbatch, op.layer, 0.0, row))
        if end > start + ROUNDING or op.kind is OpKind.COLLECTIVE:
            self.spans.append((rank, op.stream, "comm", op.name, start, end,
                               PHASE_NAME[op.phase], op.microbatch, op.layer, op.bytes, row))

    def _collective(self, rank: int, op_index: int, op: Op):
        arrival = self.env.now
        call = self._join([rank], op)
        yield call.done
        self._record(rank, op, arrival, call.start, call.end, call.row)
        self._finish(rank, op_index, call.end)

    def _join(self, ranks: list[int], op: Op) -> Call:
        """``ranks`` (members of one group: a rank, or several that run in lockstep and
        always arrive together, whose calls the first one's counter numbers) arrive
        at their group's next call."""
        rank = ranks[0]
        group_index = self._group_of[op.group][rank]
        seq = self._seq[rank].get(op.group, 0)
        self._seq[rank][op.group] = seq + 1
        key = (op.group, group_index, seq)
        call = self._calls.get(key)
        if call is None:
            members = self.program.groups[op.group][group_index]
            call = self._calls[key] = Call(op, members, self.env.event(),
                                           expected=self._expected[(op.group, group_index)])
        elif (call.op.collective, call.op.bytes) != (op.collective, op.bytes):
            raise SimulationError(
                f"rank {rank} calls {op.collective.value} of {op.bytes:.0f} B as {op.group} "
                f"collective #{seq}, but its group called {call.op.collective.value} of "
                f"{call.op.bytes:.0f} B")
        call.arrivals.update(dict.fromkeys(ranks, self.env.now))
        if len(call.arrivals) == call.expected:
            del self._calls[key]
            self._execute(call, key)
        return call

    def _execute(self, call: Call, key: tuple[str, int, int]) -> None:
        """Run a call whose members are all there: its flows, then its latency."""
        call.start = self.env.now
        kind: Collective = call.op.collective
        lowered = self._lower(kind, [self.placement[r] for r in call.members], call.op.bytes)

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

    def _message(self, rank: int, op: Op, pairs=None, make=Message) -> tuple[tuple, Message]:
        """The message ``rank``'s next send or receive on ``op.group`` is part of
        (plug-ins: on ``pairs`` instead of its own pair, a ``make`` instead of a
        Message: a gang's message group)."""
        pairs = self._group_of[op.group][rank] if pairs is None else pairs
        counter = (op.group, op.kind)  # sends and receives are numbered apart
        seq = self._seq[rank].get(counter, 0)
        self._seq[rank][counter] = seq + 1
        key = (op.group, pairs, seq)
        message = self._messages.get(key)
        if message is None:
            message = self._messages[key] = make(self.env.event())
        return key, message

    def _p2p(self, rank: int, op_index: int, op: Op):
        arrival = self.env.now
        key, message = self._message(rank, op)
        if op.kind is OpKind.SEND:
            pair = self.program.groups[op.group][key[1]]
            lowered = self._lower(Collective.SEND_RECV, [self.placement[pair[0]],
                                                         self.placement[pair[1]]], op.bytes)
            message.start = self.env.now
            message.done.callbacks.insert(0, self._arrived(key, message, lowered, op))
            self.network.transfer(lowered.routes, lowered.sizes, key=lowered.key,
                                  then=lowered.latency, done=message.done)
        yield message.done
        self._record(rank, op, arrival if op.kind is OpKind.RECV else max(arrival, message.start),
                     max(arrival, message.start), message.end, message.row)
        self._finish(rank, op_index, max(arrival, message.end))
        if op.kind is OpKind.RECV:
            del self._messages[key]

    def _arrived(self, key: tuple, message: Message, lowered: Lowered, op: Op) -> Callable:
        """The callback that logs a message when it arrives (before anyone wakes)."""
        def arrived(_event=None) -> None:
            message.end, message.row = self.env.now, len(self.collectives)
            self.collectives.append((*key, "send_recv", op.name, 2, op.bytes,
                                     lowered.algorithm.value, lowered.protocol.value,
                                     lowered.channels, message.start, message.start,
                                     message.end))
        return arrived

    def _check_finished(self) -> None:
        running = set(self.ranks)
        for key, call in self._calls.items():
            missing = [r for r in call.members if r not in call.arrivals and r in running]
            raise SimulationError(
                f"deadlock: {key[0]} collective #{key[2]} ({call.op.name}) of group {key[1]} "
                f"waits for ranks {missing[:8]} that never call it")
        for key, message in self._messages.items():
            if message.start is None:
                raise SimulationError(f"deadlock: {key[0]} message #{key[2]} of pair {key[1]} "
                                      "is received but never sent")
        for rank in self.ranks:
            for stream, indices in self._streams[rank].items():
                if self._cursor[(rank, stream)] < len(indices):
                    raise SimulationError(f"rank {rank} did not finish its {stream} stream")
