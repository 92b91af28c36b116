"""Plug-in: a gang's collective runs every group it holds as one batched transfer.

A gang (``gangs``) that holds whole groups of a dimension (a pipeline stage's
class holds each of its tensor-parallel groups, and often its data-parallel
groups) makes every group's call at once: the groups' members are all the
gang's, and they arrive together. The reference joins each group's call on its
own (a call record, a lowering, a transfer and an event per group: 32 tensor-
parallel groups of 4 in a stage of 128 GPUs is 32 of each per call). Here the
groups' calls start as one batch (``BatchNetwork.transfer_group``: the flows of
all of them start together, each group's part ends when its own flows end,
exactly as separate transfers would, and one event fires after the last), and
are logged as one block of rows in group order. This is the case the
``exclusive`` plug-in cannot settle without the network: links shared with
other traffic some of the time (tensor parallelism of 2 or 4 beside data-
parallel peers in one server), so the calls still run on the shared fabric.

Only groups with single-step lowerings inside one server, or of context
parallelism, are batched; a call whose lowering runs several steps, another
group that spans servers (a batch joins every component any of its links
touches, so the data-parallel rings of many servers are cheaper apart) and a
gang that does not hold every member of each group go the reference way. A
stage's context-parallel ring exchanges across servers are batched: apart,
each of its groups' transfers would merge with the pipeline messages on its
NICs and recompute their shares once per group (Llama 3.1 405B with CP 2
across servers: 9.6 M events -> 0.31 M, the same timeline). So are a stage's
expert-parallel token exchanges across servers (``ep``, DeepEP's ``ep_rdma``
hop) and its expert replicas' gradient reductions and parameter gathers
(``edp``: pairs in two EP groups, 64 groups a stage), for the same reason
(the DeepSeek-V3 benchmark on 2,048 GPUs: 460 k events -> 229 k; its recipe
with DeepEP's two hops and DualPipe 4.75 M -> 0.67 M, the same timeline).
The cache of batches is keyed by the call's name too: a DeepEP dispatch and
combine of one size are logged under their own names. A batch moves only the
representative's call counter; the other groups' counters catch up when a
call of the same groups goes the reference way (``_catch_up``), the only
place they are read.

Contract: ``tests/test_engine_plugins.py::test_a_plugin_gives_the_reference_timeline``
(every combination with ``call_groups``) and ``tests/test_symmetry.py`` (every
rank's spans and the log equal the full run's).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.base.ir import Op
from simulator.engine.gangs import LOCKSTEP_TOLERANCE, Gangs


@dataclass(frozen=True)
class CallGroup:
    """How a gang's call on one dimension runs as a batch (cached per call kind)."""

    members: tuple[tuple[int, ...], ...]  # per group: its members (for the lockstep check)
    own: int  # position of the representative's own group
    plan: int  # the mates' block plan (``Gangs._plan``)
    heads: list[tuple]  # per group: its log row's fixed fields (no seq, no times)
    parts: tuple[tuple[float, tuple[int, ...], list, tuple], ...]  # per latency:
    # (latency, the groups' positions, their (routes, sizes), a shape key)


# batched across servers too: ring and token exchanges, expert replicas' reductions
ACROSS_SERVERS = ("cp", "ep", "ep_rdma", "edp")


class CallGroups(Gangs):
    """Gangs whose calls on whole groups run as one batched transfer."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._call_groups: dict[tuple, CallGroup | None] = {}
        self._behind: set[tuple[int, str]] = set()  # (rep, dimension): mates' counters lag

    def _collective(self, rank: int, op_index: int, op: Op):
        batch = self._call_group(rank, op)
        if batch is None:
            if (rank, op.group) in self._behind:
                self._catch_up(rank, op.group)
            yield from super()._collective(rank, op_index, op)
            return
        start = self.env.now
        seq = self._seq[rank].get(op.group, 0)
        self._seq[rank][op.group] = seq + 1
        self._behind.add((rank, op.group))
        ends = [start] * len(batch.members)
        if len(batch.parts) == 1:  # one latency: its parts are the groups, in order
            (latency, _, calls, key), = batch.parts
            yield self.network.transfer_group(calls, key, ends, latency)
        else:
            yield from self._transfer_parts(batch, ends)
        row = len(self.collectives) + batch.own
        self.collectives.block(batch.heads, seq, start, ends=ends)
        self._record(rank, op, start, start, ends[batch.own], row)
        late = max(ends)
        if late - min(ends) > LOCKSTEP_TOLERANCE * max(late, 1e-6):  # (seldom: look closer)
            self.check_lockstep(rank, op, list(zip(batch.members, ends, strict=True)))
        self.mate_blocks.setdefault(rank, {})[row] = batch.plan
        self._finish(rank, op_index, late)

    def _catch_up(self, rank: int, dim: str) -> None:
        """Number the next call of every ``dim`` group of ``rank``'s gang as its own
        call counter would have (a batch moves only the representative's: the
        others' are read only where a call of the same groups goes the reference
        way, and the gang holds those groups whole, so they always move together)."""
        seq = self._seq[rank].get(dim, 0)
        for members in self.gang_groups(rank, dim)[0].values():
            self._seq[members[0]][dim] = seq
        self._behind.discard((rank, dim))

    def _transfer_parts(self, batch: CallGroup, ends: list[float]):
        """A batch of several latencies: a transfer each, ``ends`` per group."""
        waits = []
        for latency, positions, calls, key in batch.parts:
            part_ends = [0.0] * len(positions)
            waits.append((self.network.transfer_group(calls, key, part_ends, latency),
                          positions, part_ends))
        yield self._all([event for event, _, _ in waits])
        for _, positions, part_ends in waits:
            for position, end in zip(positions, part_ends, strict=True):
                ends[position] = end

    def _call_group(self, rank: int, op: Op) -> CallGroup | None:
        """``rank``'s gang's call ``op`` as a batch: when the gang holds two or more
        groups of ``op.group``, every member of each, and each group's lowering is
        a single step; else None. Cached per call kind."""
        key = (rank, op.group, op.collective, op.bytes, op.name)  # (the name is logged)
        if key in self._call_groups:
            return self._call_groups[key]
        held, own, plan = self.gang_groups(rank, op.group)
        whole = [tuple(self.program.groups[op.group][g]) for g in held]
        batch = None
        if plan is not None and all(len(held[g]) == len(m) and (
                op.group in ACROSS_SERVERS or self._one_server(m))
                for g, m in zip(held, whole, strict=True)):
            lowered = [self._lower(op.collective, [self.placement[r] for r in m], op.bytes)
                       for m in whole]
            if all(low.steps == 1 for low in lowered):
                batch = CallGroup(
                    members=tuple(whole), own=own,
                    plan=plan,
                    heads=[(op.group, g, op.collective.value, op.name, len(m), op.bytes,
                            low.algorithm.value, low.protocol.value, low.channels)
                           for g, m, low in zip(held, whole, lowered, strict=True)],
                    parts=_by_latency(lowered, self.network.batch_key))
        self._call_groups[key] = batch
        return batch

    def _one_server(self, members: tuple[int, ...]) -> bool:
        """Whether a group lies in one server. Only such groups are batched: a
        batch shares its fate on the network (it runs alone only while all its
        links are free, and joins every component any of them touches), so the
        groups of a data-parallel dimension spread over many servers' NICs,
        which pipeline messages cross here and there, are cheaper apart."""
        return len({self.fabric.node_of(self.placement[r]) for r in members}) == 1


def _by_latency(lowered: list, short: Callable[[tuple], tuple]
                ) -> tuple[tuple[float, tuple[int, ...], list, tuple], ...]:
    """The groups' lowerings batched per latency (a batch adds one latency to every
    part): (latency, positions, (routes, sizes) per position, a shape key naming
    the batch's flows for the network's caches, made ``short``)."""
    batches: dict[float, list[int]] = {}
    for position, low in enumerate(lowered):
        batches.setdefault(low.latency, []).append(position)
    return tuple((latency, tuple(positions),
                  [(lowered[p].routes, lowered[p].sizes) for p in positions],
                  short(("call group", *(lowered[p].key for p in positions))))
                 for latency, positions in batches.items())
