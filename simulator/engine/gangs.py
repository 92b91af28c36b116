"""Plug-in: one process runs a gang of ranks that execute one op tuple in lockstep.

A gang is a representative rank and its *mates*: ranks that run the same
program (by default every rank of a pipeline stage, ``program_classes``; or a
tensor-parallel group, ``tensor_parallel_gangs``). Only the representative
runs. At every collective or message it also joins, on behalf of each mate,
the mate's own group, so every group's flows run on the network and every call
is logged; it finishes when the last of those calls ends. The mates' spans are
the representative's, copied afterwards (``simulator.engine.folded``), each naming its own
call in the communication log.

Exactness is checked as the run goes: the mates' timelines equal the
representative's exactly when every op of a mate completes when the
representative's own does (a collective when its call ends; a send or receive
at the later of reaching it and its message's end); the mates then start every
op when it does, by induction (same program, same durations, same arrivals).
Where some end at another time (an asymmetric fabric), the run reports it
(``inexact``) and splits the gang's members by the ends they saw (``in_step``);
in strict mode the run then raises ``NotInLockstep`` carrying that split, so
the caller can run again with finer gangs (``runner.symmetry.refine``).

Contract: ``tests/test_parallelism.py::
test_tensor_parallel_gangs_give_the_same_timeline_for_every_rank`` and
``tests/test_symmetry.py`` (every rank's spans, the log and the calls each span
names equal the full run's).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import simpy

from simulator.base.ir import Collective, Op, OpKind, Program
from simulator.engine.core import Engine
from simulator.engine.folded import Folded
from simulator.engine.records import Message, NotInLockstep, SimulationError
from simulator.network.batches import BatchNetwork

LOCKSTEP_TOLERANCE = 1e-9  # relative: what the equivalence tests call equal


@dataclass
class MessageGroup:
    """The messages of one gang's send on each pair it holds, received by one gang:
    one event when the last has arrived; each message's own end and log row."""

    done: simpy.Event
    start: float | None = None
    ends: list[float] = field(default_factory=list)  # per pair, in pair order
    first_row: int = -1  # its messages' log rows follow on, in pair order
    spread: tuple[float, float] = (0.0, 0.0)  # the earliest and the latest end


def tensor_parallel_gangs(program: Program) -> dict[int, tuple[int, ...]]:
    """Each tensor-parallel group as a gang: first rank -> the others."""
    return {group[0]: tuple(group[1:]) for group in program.groups["tp"]}


class Gangs(Engine):
    """Runs each gang's representative; mates join their own calls through it."""

    def __init__(self, *args, represents: dict[int, tuple[int, ...]], strict: bool = False,
                 **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.mates = {r: tuple(m) for r, m in represents.items()}
        for rep, mates in self.mates.items():
            if any(self.program.ops[m] is not self.program.ops[rep] for m in mates):
                raise SimulationError(f"rank {rep} cannot represent ranks with other programs")
        self.ranks = sorted(self.mates)
        self.network = BatchNetwork(self.env, self.fabric.capacity)  # mates send in lockstep
        self._send_plans: dict[tuple, list[tuple]] = {}
        self.mate_calls: dict[int, dict[int, int]] = {}  # mate -> {rep's log row: its own}
        self.mate_blocks: dict[int, dict[int, int]] = {}  # rep -> {its row: plan} (folded)
        self.plans: list[dict[int, int]] = []  # mate -> offset of its row in a block
        self._plan_ids: dict[tuple, int] = {}
        self.divergence: str | None = None  # the first mate that ended apart, if any
        self._strict = strict  # raise NotInLockstep at the end if any gang diverged
        self._parts: dict[int, dict[int, int]] = {}  # rep -> member -> part, once split
        self._rep_of = {m: rep for rep, ms in self.mates.items() for m in (rep, *ms)}
        self._group_plans: dict[tuple, tuple | None] = {}
        self._gang_group_cache: dict[tuple[int, str], tuple] = {}
        self._group_heads: dict[tuple, list[tuple]] = {}  # a message group's log fields

    def _arriving(self) -> set[int]:
        return set(self.ranks) | {m for ms in self.mates.values() for m in ms}

    def _collective(self, rank: int, op_index: int, op: Op):
        index = self._group_of[op.group][rank]
        groups, _, plan = self.gang_groups(rank, op.group)
        calls = {g: self._join(members, op) for g, members in groups.items()}
        own = calls[index]
        arrival = self.env.now
        yield self._all([call.done for call in calls.values()])
        self._record(rank, op, arrival, own.start, own.end, own.row)
        self.check_lockstep(rank, op, [(members, calls[g].end)
                                        for g, members in groups.items()])
        rows = [call.row for call in calls.values()]
        if plan is not None and rows == list(range(rows[0], rows[0] + len(rows))):
            # logged as a block in the gang's group order: one entry for every mate
            self.mate_blocks.setdefault(rank, {})[own.row] = plan
        else:
            for g, members in groups.items():
                if g != index:  # mates in other groups: their own call's log row
                    for mate in members:
                        self.mate_calls.setdefault(mate, {})[own.row] = calls[g].row
        self._finish(rank, op_index, max(c.end for c in calls.values()))

    def gang_groups(self, rank: int, dim: str) -> tuple[dict[int, list[int]], int, int | None]:
        """The ``dim`` groups ``rank``'s gang has members in (group index -> those
        members, by group index), the position of ``rank``'s own group among them,
        and the block plan of its mates' rows when the groups' calls are logged
        consecutively in that order (None: one group). Cached."""
        key = (rank, dim)
        if key not in self._gang_group_cache:
            groups: dict[int, list[int]] = {}
            for r in (rank, *self.mates[rank]):
                groups.setdefault(self._group_of[dim][r], []).append(r)
            groups = dict(sorted(groups.items()))
            own = list(groups).index(self._group_of[dim][rank])
            plan = self._plan({m: k - own for k, g in enumerate(groups) for m in groups[g]
                               if m != rank}) if len(groups) > 1 else None
            self._gang_group_cache[key] = (groups, own, plan)
        return self._gang_group_cache[key]

    def _p2p(self, rank: int, op_index: int, op: Op):
        plan = self.group_plan(rank, op)
        if plan is None:
            yield from self._p2p_each(rank, op_index, op)
            return
        arrival = self.env.now
        order, positions, plan_id = plan
        key, group = self._message(rank, op, order, MessageGroup)
        if op.kind is OpKind.SEND:
            self.send_group(key, group, op)
        yield group.done
        own = positions[0]
        row = group.first_row + own
        start = max(arrival, group.start)
        self._record(rank, op, arrival if op.kind is OpKind.RECV else start, start,
                     group.ends[own], row)
        self.mate_blocks.setdefault(rank, {})[row] = plan_id  # the group's rows are a block
        early, late = group.spread
        if late - early > LOCKSTEP_TOLERANCE * max(late, 1e-6):
            self.check_lockstep(rank, op, [((r,), max(arrival, group.ends[at])) for r, at in
                                            zip((rank, *self.mates[rank]), positions,
                                                strict=True)])
        self._finish(rank, op_index, max(arrival, late))
        if op.kind is OpKind.RECV:
            del self._messages[key]

    def group_plan(self, rank: int, op: Op) -> tuple | None:
        """How ``rank``'s gang sends or receives on ``op.group`` as one message group:
        (its pairs in order, each member's position among them, the plan of its mates'
        rows), when the peers of those pairs are exactly one gang (then that gang
        receives, or sends, the same group); None otherwise (each message apart).
        Cached."""
        key = (rank, op.group, op.kind)
        if key not in self._group_plans:
            of, gang = self._group_of[op.group], (rank, *self.mates[rank])
            pairs = [of[r] for r in gang]
            side = 1 if op.kind is OpKind.SEND else 0
            peers = {self.program.groups[op.group][p][side] for p in pairs}
            rep = self._rep_of.get(min(peers))
            plan = None
            if rep is not None and peers == {rep, *self.mates[rep]}:
                order = tuple(sorted(pairs))
                at = {p: n for n, p in enumerate(order)}
                positions = [at[p] for p in pairs]
                plan = (order, positions, self._plan({m: n - positions[0] for m, n in zip(
                    gang[1:], positions[1:], strict=True)}))
            self._group_plans[key] = plan
        return self._group_plans[key]

    def _plan(self, offsets: dict[int, int]) -> int:
        """The id of a block plan (mate -> offset of its row from the representative's
        in a block of consecutive log rows), interned."""
        key = tuple(sorted((m, o) for m, o in offsets.items() if o))
        if key not in self._plan_ids:
            self._plan_ids[key] = len(self.plans)
            self.plans.append(dict(key))
        return self._plan_ids[key]

    def send_group(self, key: tuple, group: MessageGroup, op: Op) -> None:
        """Start a message group: per latency one batch of transfers whose parts write
        their ends down, one event for the lot; each message is logged (in pair
        order) before anyone wakes."""
        group.start = self.env.now
        plan = self._send_plan(op, list(key[1]))
        batches = [(batch, [0.0] * len(batch)) for _, batch, _, _ in plan]
        if len(plan) == 1:
            (latency, _, calls, shape), = plan
            self.network.transfer_group(calls, ("group", shape), batches[0][1], latency,
                                        done=group.done)
            group.done.callbacks.insert(0, lambda _e: self._log_group(key, group, op, batches))
            return
        events = [self.network.transfer_group(calls, ("group", shape), ends, latency)
                  for (latency, _, calls, shape), (_, ends) in zip(plan, batches, strict=True)]

        def logged(_event) -> None:
            self._log_group(key, group, op, batches)
            group.done.succeed()
        self._all(events).callbacks.append(logged)

    def _log_group(self, key: tuple, group: MessageGroup, op: Op, batches: list) -> None:
        dim, order, seq = key
        if len(batches) == 1:  # one batch, in pair order (``_send_plan``)
            group.ends = batches[0][1]
        else:
            group.ends = [0.0] * len(order)
            for batch, ends in batches:
                for (i, _), end in zip(batch, ends, strict=True):
                    group.ends[i] = end
        group.spread = (min(group.ends), max(group.ends))
        group.first_row = len(self.collectives)
        heads = self._group_heads.get((dim, order, op.name, op.bytes))
        if heads is None:  # the rows' fixed fields, once per kind of group
            lowerings = {i: lowered for batch, _ in batches for i, lowered in batch}
            heads = self._group_heads[(dim, order, op.name, op.bytes)] = [
                (dim, pair, "send_recv", op.name, 2, op.bytes, lowerings[i].algorithm.value,
                 lowerings[i].protocol.value, lowerings[i].channels)
                for i, pair in enumerate(order)]
        self.collectives.block(heads, seq, group.start, ends=group.ends)

    def _p2p_each(self, rank: int, op_index: int, op: Op):
        """A gang's sends or receives one message at a time (its peers are not one
        gang)."""
        arrival = self.env.now
        mine = [self._message(r, op) for r in (rank, *self.mates[rank])]
        if op.kind is OpKind.SEND:
            self._send(mine, op)
        yield self._all([m.done for _, m in mine])
        key, message = mine[0]
        start = max(arrival, message.start)
        self._record(rank, op, arrival if op.kind is OpKind.RECV else start, start,
                     message.end, message.row)
        for mate, (_, other) in zip(self.mates[rank], mine[1:], strict=True):
            self.mate_calls.setdefault(mate, {})[message.row] = other.row
        self.check_lockstep(rank, op, [((r,), max(arrival, m.end)) for r, (_, m) in zip(
            (rank, *self.mates[rank]), mine, strict=True)])
        self._finish(rank, op_index, max(arrival, *(m.end for _, m in mine)))
        if op.kind is OpKind.RECV:
            for other_key, _ in mine:
                del self._messages[other_key]

    def check_lockstep(self, rank: int, op: Op,
                        ends: list[tuple[Sequence[int], float]]) -> None:
        """Note an op that ends at different times for different members of a gang
        (``ends``: members and when the op completes for them: their call's end, or
        for a message the later of its arrival at the op and the message's end),
        and split the gang's members by when it ended for them. (A hot path: the
        members are looked at only when the ends differ.)"""
        if len(ends) < 2:
            return
        times = [end for _, end in ends]
        late, early = max(times), min(times)
        if late - early <= LOCKSTEP_TOLERANCE * max(late, 1e-6):
            return
        if self.divergence is None:
            self.divergence = (f"the ranks rank {rank} stands for end {op.name} "
                               f"({op.group}) {late - early:.3g} s apart")
        by_member = {m: end for members, end in ends for m in members}
        parts = self._parts.setdefault(rank, dict.fromkeys(by_member, 0))
        together = {m: i for i, group in enumerate(in_step(by_member)) for m in group}
        labels: dict[tuple[int, int], int] = {}
        for member in sorted(parts):
            parts[member] = labels.setdefault((parts[member], together[member]), len(labels))

    def run(self):
        """The run; in strict mode, ``NotInLockstep`` if any gang diverged, with every
        diverged gang split by the ends its members saw (a guess at the classes that
        stay in lockstep: the next run checks it)."""
        result = super().run()
        if self._strict and self.divergence is not None:
            split = []
            for parts in self._parts.values():
                groups: dict[int, list[int]] = {}
                for member in sorted(parts):
                    groups.setdefault(parts[member], []).append(member)
                split.extend(tuple(g) for g in groups.values())
            raise NotInLockstep(self.divergence, split)
        return result

    def _inexact(self) -> str | None:
        return self.divergence

    def _send(self, messages: list[tuple[tuple[str, int, int], Message]], op: Op) -> None:
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
                 self.network.batch_key(tuple(lowered.key for _, lowered in batch)))
                for latency, batch in batches.items()]
        return plan

    def _expander(self):
        return Folded(self.mates, self.mate_calls, self.mate_blocks, self.plans)


def in_step(ends: dict[int, float]) -> list[tuple[int, ...]]:
    """Ranks grouped by when their op ended (equal within ``LOCKSTEP_TOLERANCE``),
    each group in rank order, groups ordered by their first rank.

    >>> in_step({0: 1.0, 1: 2.0, 2: 1.0, 3: 2.0 + 1e-12})
    [(0, 2), (1, 3)]
    """
    groups: list[list[int]] = []
    last = None
    for rank, end in sorted(ends.items(), key=lambda item: (item[1], item[0])):
        if last is None or end - last > LOCKSTEP_TOLERANCE * max(end, 1e-6):
            groups.append([])
        groups[-1].append(rank)
        last = end
    return sorted((tuple(sorted(g)) for g in groups), key=lambda g: g[0])


def program_classes(program: Program) -> dict[int, tuple[int, ...]]:
    """Ranks that run one op tuple (a pipeline stage's tensor- and data-parallel
    ranks, in Megatron's layouts) as one gang: first rank -> the others."""
    classes: dict[int, list[int]] = {}
    for rank, ops in enumerate(program.ops):
        classes.setdefault(id(ops), []).append(rank)
    return {ranks[0]: tuple(ranks[1:]) for ranks in classes.values()}
