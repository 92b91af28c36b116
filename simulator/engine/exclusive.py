"""Plug-in: collectives on links no other traffic can use run without the network.

When no other group's traffic can touch a dimension's links while a call runs
(``link_sharing`` checks that statically: tensor parallelism filling each
server with no proxy routing through other GPUs, context parallelism inside
servers; with data-parallel groups sharing the servers, every call but those
a reduction may overlap, ``alone_calls``), and a gang (``gangs``) is a whole
group of that dimension, the group's call ends exactly at its isolated time
plus latency once the gang arrives: nothing can slow it. It is then settled
like a compute kernel, at a known future time, without the network; with
``batching`` the compute planner runs it inline, so a stage's forward or
backward is one event. The calls a reduction may overlap run on the network
(the stream then has a process).

Contract: ``tests/test_parallelism.py::test_exclusive_tensor_parallel_links_give_the_same_timeline``
(every span's end equals the full run's, with a quarter of the events),
``tests/test_engine_plugins.py::test_context_parallel_pipelines_run_alone_until_their_reductions``.
"""

from __future__ import annotations

from bisect import bisect_left

from simulator.base.ir import PHASE_NAME, Op, OpKind
from simulator.engine.batching import depended_on
from simulator.engine.gangs import Gangs
from simulator.engine.link_sharing import alone_calls


class ExclusiveLinks(Gangs):
    """Gangs whose calls on exclusive dimensions are settled at their isolated time."""

    def __init__(self, *args, exclusive: frozenset[str], late: frozenset[str] = frozenset(),
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._exclusive, self._late = exclusive, late
        self.covered = {(dim, rep): gang for dim in exclusive for rep in self.ranks
                         if rep in self._group_of.get(dim, ())  # (other jobs' ranks are not)
                         and (gang := self._whole_groups(rep, dim))}
        self._alone_cache: dict[tuple, tuple[float, str, tuple]] = {}
        self._alone_blocks: dict[tuple, tuple] = {}
        # per op tuple, per op of an exclusive stream: (stream, position, the stream's
        # previous op, whether it may run alone: no late call may overlap it)
        self.inlinable: dict[int, list[tuple | None]] = {}
        self._awaited: dict[tuple[int, str], bool] = {}  # (op tuple, stream): all awaited
        self._lazy: set[tuple[int, str]] = set()  # (rank, stream) settled without a process
        self._shared: dict[int, list[int]] = {}  # per op tuple: calls a late call may overlap
        self.calls_alone = 0  # settled at their isolated time (the summary's calls_alone)

    def run(self):
        result = super().run()
        result.calls_alone = self.calls_alone
        return result

    def _whole_groups(self, rep: int, dim: str) -> list[tuple[int, tuple[int, ...]]]:
        """The ``dim`` groups of ``rep``'s gang (index, members), if the gang holds
        every member of each (else [])."""
        held, _, _ = self.gang_groups(rep, dim)
        groups = [(g, tuple(self.program.groups[dim][g])) for g in held]
        return groups if all(len(held[g]) == len(m) for g, m in groups) else []

    def _prepare_rank(self, rank: int, durations: list[float]) -> None:
        super()._prepare_rank(rank, durations)
        ops = self.program.ops[rank]
        if id(ops) not in self.inlinable:
            out: list[tuple | None] = [None] * len(ops)
            depended = depended_on(ops)
            shared = self._shared[id(ops)] = alone_calls(ops, self._exclusive, self._late)
            overlapped = set(shared)
            for stream, indices in self._streams[rank].items():
                if all(ops[i].kind is OpKind.COLLECTIVE and ops[i].group in self._exclusive
                       for i in indices):  # a stream of exclusive calls only (tp's)
                    for position, i in enumerate(indices):
                        out[i] = (stream, position, indices[position - 1] if position else None,
                                  i not in overlapped)
                    self._awaited[(id(ops), stream)] = all(i in depended for i in indices)
            self.inlinable[id(ops)] = out

    def _process(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        ops = self.program.ops[rank]
        if self.inlinable[id(ops)][indices[0]] is not None:
            # a stream of exclusive calls (all or none of a stream's ops are inlinable)
            where = self.inlinable[id(ops)]
            if self._awaited[(id(ops), stream)] and all(where[i][3] for i in indices) and all(
                    (g, rank) in self.covered for g in {ops[i].group for i in indices}):
                self._lazy.add((rank, stream))
                return self.no_process()
            return self._settling_stream(rank, stream, indices, durations)
        return super()._process(rank, stream, indices, durations)

    @staticmethod
    def no_process():
        """A stream whose calls are settled when needed (``_settle_when_ready``)."""
        yield from ()

    def _waiter(self, rank: int, op_index: int):
        """Waiting for a lazily settled call: settle it as soon as its inputs end."""
        event = super()._waiter(rank, op_index)
        where = self.inlinable.get(id(self.program.ops[rank]), ())
        if where and where[op_index] is not None and (rank, where[op_index][0]) in self._lazy:
            self._settle_when_ready(rank, op_index)
        return event

    def _settle_when_ready(self, rank: int, op_index: int) -> None:
        """Settle the calls of ``op_index``'s stream up to it, in order, each at the
        time its inputs and its predecessor have ended: at once where those ends
        are known, else when the first unknown one ends. Every call on such a
        stream is awaited by some op (``_awaited``), so each is settled when it
        first matters, at the time the reference stream would have run it,
        without a process waking for every call."""
        ops, done = self.program.ops[rank], self.done[rank]
        stream, position, _, _ = self.inlinable[id(ops)][op_index]
        indices = self._streams[rank][stream]
        while done[op_index] is None:
            i = indices[self._cursor[(rank, stream)]]
            if self.settle(rank, i, floor=0.0) is None:  # when its inputs end, even past
                previous = self.inlinable[id(ops)][i][2]
                blocker = next(d for d in (*ops[i].deps, previous)
                               if d is not None and done[d] is None)
                self._waiter(rank, blocker).callbacks.append(
                    lambda _e: self._settle_when_ready(rank, op_index))
                return

    def _settling_stream(self, rank: int, stream: str, indices: list[int],
                         durations: list[float]):
        """The reference stream loop for a stream of exclusive calls, skipping those
        the compute planner has settled inline meanwhile (their end is known
        before the stream reaches them)."""
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
            if done[i] is not None:  # settled inline meanwhile
                self._cursor[key] = max(self._cursor[key], pos + 1)
                continue
            self._cursor[key] = pos + 1
            yield from self._collective(rank, i, op)

    def sharing(self, rank: int, first: int, end: int) -> bool:
        """Whether a late call may share links with a call in ``[first, end)``."""
        shared = self._shared[id(self.program.ops[rank])]
        if not shared:
            return False
        at = bisect_left(shared, first)
        return at < len(shared) and shared[at] < end

    def _collective(self, rank: int, op_index: int, op: Op):
        if (op.group, rank) in self.covered and self.inlinable[id(
                self.program.ops[rank])][op_index][3]:
            self._alone(rank, op_index, op, self.env.now)
            return
        yield from super()._collective(rank, op_index, op)

    def settle(self, rank: int, op_index: int, floor: float | None = None) -> float | None:
        """Run an exclusive-link collective now, at its planned time, if it is next on
        its stream, its inputs' ends are known, and this rank's gang is its whole
        group; return its end, or None. (A hot path: plain loops, no helpers.)"""
        ops = self.program.ops[rank]
        where = self.inlinable[id(ops)][op_index]
        if where is None:
            return None
        stream, position, previous, alone = where
        key = (rank, stream)
        if self._cursor[key] != position or not alone:
            return None
        op, done = ops[op_index], self.done[rank]
        if (op.group, rank) not in self.covered:
            return None
        start = self.env.now if floor is None else floor
        for d in (*op.deps, previous) if previous is not None else op.deps:
            end = done[d]
            if end is None:
                return None
            if end > start:
                start = end
        self._cursor[key] = position + 1
        self._alone(rank, op_index, op, start)
        return done[op_index]

    def _alone(self, rank: int, op_index: int, op: Op, start: float) -> None:
        """A call of every group of ``rank``'s gang on links no other traffic can use,
        each group whole here at ``start``: each ends at its isolated time plus
        latency. Each group's call is logged; the gang is in lockstep when all end
        together."""
        block, durations, uniform, own, plan, longest = self.alone_block(rank, op)
        self.calls_alone += 1
        row = self.log_alone(rank, block, durations, own, plan, start)
        self.spans.append((rank, op.stream, "comm", op.name, start, start + durations[own],
                           PHASE_NAME[op.phase], op.microbatch, op.layer, op.bytes, row))
        if not uniform:
            self.check_lockstep(rank, op, [(members, start + d) for (_, members), d in
                                            zip(self.covered[(op.group, rank)], durations,
                                                strict=True)])
        self._finish(rank, op_index, start + longest)

    def log_alone(self, rank: int, block: list, durations: list[float], own: int,
                   plan: int | None, start: float) -> int:
        """Log the calls of ``_alone_block``'s ``block`` starting at ``start``; the
        row of ``rank``'s own group's call."""
        row = len(self.collectives) + own
        self.collectives.block(block, -1, start, durations=durations)
        if plan is not None:  # the calls are a block: one entry for every mate
            self.mate_blocks.setdefault(rank, {})[row] = plan
        return row

    def alone_block(self, rank: int, op: Op) -> tuple:
        """The log rows (but their times) and durations of the calls of ``rank``'s
        gang's whole groups for ``op``, whether all durations are equal (then the
        gang is in lockstep by construction), the position of ``rank``'s own group,
        its mates' block plan and the longest duration. Cached per call kind: a
        large gang holds a hundred groups, and a stage makes thousands of calls."""
        key = (op.group, rank, op.name, id(op.collective), op.bytes)
        cached = self._alone_blocks.get(key)
        if cached is None:
            block, durations = [], []
            for index, members in self.covered[(op.group, rank)]:
                duration, kind, row = self._alone_call(op, index, members)
                block.append((op.group, index, kind, op.name, *row))  # no seq, no times
                durations.append(duration)
            _, own, plan = self.gang_groups(rank, op.group)
            cached = self._alone_blocks[key] = (block, durations, len(set(durations)) == 1,
                                                own, plan, max(durations))
        return cached

    def _alone_call(self, op: Op, index: int, members: tuple[int, ...]) -> tuple:
        """(isolated duration + latency, collective, log fields) of one group's call."""
        cache_key = (op.group, index, op.collective, op.bytes)
        cached = self._alone_cache.get(cache_key)
        if cached is None:
            lowered = self._lower(op.collective, [self.placement[r] for r in members], op.bytes)
            duration = self.network.isolated(lowered.routes, lowered.sizes,
                                             lowered.key) + lowered.latency
            cached = self._alone_cache[cache_key] = (duration, op.collective.value, (
                len(members), op.bytes, lowered.algorithm.value, lowered.protocol.value,
                lowered.channels))
        return cached
