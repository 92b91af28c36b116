"""Which calls no other traffic can share links with: a static analysis of a program
placed on a fabric, for the ``exclusive_links`` plug-in.

On an NVSwitch server each GPU has its own links to the switch, so a collective
of GPUs in one server uses only its members' links, and two calls can share a
link only through a GPU that takes part in both. A call on such a link runs at
its isolated speed when, on every GPU of its group, nothing else that uses the
GPU's links can run at the same time. That is decided here without running
anything, from each rank's ops: what each op waits for (its inputs and its
stream's previous op) orders ops in time, and two calls ordered that way never
overlap (a collective's traffic starts once every member has arrived and is
over when it ends).

- ``exclusive_dimensions``: the dimensions whose groups stay inside servers
  (``tp``, and ``cp`` when its groups share servers) and those whose groups
  share servers with them (``late``, e.g. data parallelism over ``dp x cp``,
  whose gradient reductions overlap the last backwards);
- ``alone_calls``: per rank's program, the calls of those dimensions that are
  ordered with every call of the late ones (all of them before the first
  reduction starts, in a pipeline most of the iteration); the others go
  through the network.

Contract: ``tests/test_engine_plugins.py`` (context-parallel layouts whose
data-parallel groups share servers, against the reference core).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Op, OpKind, Program
from simulator.network.fabric import Fabric

SERVER_DIMENSIONS = ("tp", "cp")  # dimensions whose calls may be settled alone
NONE = (frozenset(), frozenset())


def exclusive_dimensions(program: Program, fabric: Fabric, placement: list[str]
                         ) -> tuple[frozenset, frozenset]:
    """(dimensions whose calls may run alone, dimensions whose calls may share their
    links): ``tp``, and ``cp`` where its groups share servers, may when

    - each group of such a dimension lies in one server (its calls stay on NVLink);
    - traffic is not routed through other GPUs' NVLink (a rail-optimized fabric's
      PXN);
    - a rank's calls on them never run at the same time (``one_at_a_time``);
    - the groups of the other dimensions leave each server through its NICs,
      except collective-only ones whose members share a server with the same
      program (``late``: ``alone_calls`` then says which calls run alone)."""
    if fabric.proxies_through_peers:
        return NONE
    inside, late = {"tp"}, set()
    for dim, groups in program.groups.items():
        shared = spread = False  # two members in one server; members in two servers
        for group in groups:
            servers = {fabric.node_of(placement[r]) for r in group}
            shared |= len(servers) < len(group)
            spread |= len(servers) > 1
        if dim in SERVER_DIMENSIONS and spread:
            if dim == "tp" or shared:  # (tp across servers: its calls use the NICs)
                return NONE
        elif shared:
            (inside if dim in SERVER_DIMENSIONS else late).add(dim)
    if (len(inside) > 1 or late) and not one_at_a_time(program, inside):
        return NONE
    if late and not (_same_programs(program, inside | late) and any(
            len(group) > 1 for dim in inside for group in program.groups.get(dim, ()))):
        return NONE  # (nothing to settle alone: leave the reductions' runs as they were)
    return frozenset(inside), frozenset(late)


def _same_programs(program: Program, dims: set[str]) -> bool:
    """Whether every group of ``dims`` runs one program (a pipeline stage's ranks)."""
    return all(len({id(program.ops[r]) for r in group}) == 1
               for dim in dims for group in program.groups.get(dim, ()))


def one_at_a_time(program: Program, dims: set[str]) -> bool:
    """Whether every rank's calls on ``dims`` are ordered by what each waits for:
    each call, in program order, starts only after the one before it has ended
    (through its inputs or its stream), so no two of them ever run together.
    One pass per distinct op tuple (the ops are in topological order)."""
    seen: set[int] = set()
    for ops in program.ops:
        if id(ops) in seen:
            continue
        seen.add(id(ops))
        is_call = [op.kind is OpKind.COLLECTIVE and op.group in dims for op in ops]
        after = _latest_before(ops, is_call)
        previous = -1
        for i, call in enumerate(is_call):
            if call:
                if after[i] != previous:
                    return False
                previous = i
    return True


def _latest_before(ops: Sequence[Op], marked: list[bool]) -> list[int]:
    """Per op, the latest marked op that has ended before it starts (-1: none).
    Marked ops that form a chain (each waits for the one before) are all in an
    op's past up to that one."""
    after = [-1] * len(ops)
    last_on: dict[str, int] = {}
    for i, op in enumerate(ops):
        latest = -1
        before = last_on.get(op.stream)
        for d in (*op.deps, before) if before is not None else op.deps:
            a = d if marked[d] else after[d]
            if a > latest:
                latest = a
        last_on[op.stream] = i
        after[i] = latest
    return after


def alone_calls(ops: Sequence[Op], dims: frozenset, late: frozenset) -> list[int]:
    """The calls on ``dims`` (in order) that a call on ``late`` dimensions of this
    rank may overlap, so that they do not run alone: those not ordered, by what
    ops wait for, with every late call (``one_at_a_time`` holds for ``dims``).
    Every call on ``dims`` when a late dimension also sends messages (a message
    may arrive before its receiver waits for it)."""
    if not late:
        return []
    calls = [op.kind is OpKind.COLLECTIVE and op.group in dims for op in ops]
    lates = [op.group in late for op in ops]
    if any(op.kind is not OpKind.COLLECTIVE for op, is_late in zip(ops, lates, strict=True)
           if is_late):
        return [i for i, call in enumerate(calls) if call]
    after_call = _latest_before(ops, calls)  # (the calls are a chain)
    streams = sorted({op.stream for op, is_late in zip(ops, lates, strict=True) if is_late})
    blocked: set[int] = set()
    for stream in streams:  # the late calls of one stream are a chain
        on = [op.stream == stream and is_late for op, is_late in zip(ops, lates, strict=True)]
        after_late = _latest_before(ops, on)
        last, pending = -1, []  # the last late call so far; calls since it
        for i, call in enumerate(calls):
            if on[i]:
                blocked.update(c for c in pending if c > after_call[i])  # not before it
                last, pending = i, []
            elif call:
                if after_late[i] != last:  # a late call before it may still run
                    blocked.add(i)
                pending.append(i)
    return sorted(blocked)
