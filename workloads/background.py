"""Background traffic: a job that only moves bytes, at a fixed offered rate.

Two kinds, as shared clusters see them beside a training job:

- ``all_to_all``: every GPU of the job exchanges ``message`` bytes with all
  the others (a recommendation model's embedding exchange, another tenant's
  MoE job) once per period;
- ``storage``: the job's first ``servers`` nodes stand for storage servers;
  every GPU of the other nodes writes ``message`` bytes to one of them per
  period (checkpoint writes; ``direction: read`` streams the other way, as
  data loading or a checkpoint restore does).

The load is open-loop, as a real tenant's is: a new message starts every
``message / rate`` seconds whether or not the last has arrived (the period
is a pacing op on the compute stream, whose duration is fixed, not timed by
the kernel table); messages queue on their stream when the fabric cannot
keep up. ``rate`` is per GPU (bytes each GPU offers per second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.base.fields import BANDWIDTH, SIZE, choice, integer, quantity, setting
from simulator.base.ir import (
    BG_STREAM,
    COMPUTE_STREAM,
    PACING,
    Collective,
    Op,
    OpKind,
    Phase,
    Program,
)
from simulator.base.units import Dimension

TRAFFIC = ("all_to_all", "storage")


@dataclass(frozen=True)
class BackgroundSpec:
    """A background job's traffic (``jobs.NAME`` with ``kind: background``)."""

    # all_to_all (every GPU to every other) or storage (clients to the first nodes)
    traffic: str = setting(choice(TRAFFIC), required=True)
    rate: float = setting(BANDWIDTH, required=True)  # bytes per second each GPU offers
    message: float = setting(SIZE, 4 * 2**20)  # one message (an all-to-all's buffer per GPU)
    servers: int = setting(integer(1), 1)  # storage: the first nodes of the job serve
    # storage: clients write to servers, or read from them
    direction: str = setting(choice(["write", "read"]), "write")
    # seconds of traffic (default: as long as the training jobs run)
    duration: float | None = setting(quantity(Dimension.TIME, positive=True), None)

    @property
    def period(self) -> float:
        return self.message / self.rate


def messages(spec: BackgroundSpec, duration: float) -> int:
    """How many periods cover ``duration`` seconds (at least one).

    >>> messages(BackgroundSpec("all_to_all", 1e9, 1e6), 0.0105)
    11
    """
    return max(1, math.ceil(duration / spec.period - 1e-9))


def background_program(spec: BackgroundSpec, ranks_per_node: int, nodes: int,
                       duration: float) -> Program:
    """The job's program over ``duration`` seconds on ``nodes`` nodes of
    ``ranks_per_node`` GPUs each (ranks node-major)."""
    ranks = ranks_per_node * nodes
    count = messages(spec, duration)
    if spec.traffic == "all_to_all":
        op = _message(OpKind.COLLECTIVE, BG_STREAM, spec.message)
        return _program([_paced((op,), count)] * ranks, {BG_STREAM: (tuple(range(ranks)),)},
                        ranks)
    return _storage(spec, count, ranks_per_node * spec.servers, ranks)


def _storage(spec: BackgroundSpec, count: int, servers: int, ranks: int) -> Program:
    """Client ``i`` (the ``i``-th GPU past the servers') streams to or from server
    GPU ``i mod servers``; a server's ``k``-th client is its pair in dimension
    ``bg.k`` (a rank is in one pair per dimension). Writers pace their messages,
    readers take them as they come; a server that sends (``read``) serves its
    clients one after another each period."""
    send = spec.direction == "write"  # clients send; else servers do
    slots: dict[int, list[str]] = {s: [] for s in range(servers)}
    groups: dict[str, list[tuple[int, int]]] = {}
    ops: list[tuple[Op, ...]] = [()] * ranks
    shared: dict[object, tuple[Op, ...]] = {}  # equal programs share one tuple (symmetry)
    for i, client in enumerate(range(servers, ranks)):
        server, dim = i % servers, f"{BG_STREAM}.{i // servers}"
        groups.setdefault(dim, []).append((client, server) if send else (server, client))
        slots[server].append(dim)
        if dim not in shared:
            op = _message(OpKind.SEND if send else OpKind.RECV, dim, spec.message)
            shared[dim] = _paced((op,), count) if send else (op,) * count
        ops[client] = shared[dim]
    for server, dims in slots.items():
        if tuple(dims) not in shared:
            mine = tuple(_message(OpKind.RECV if send else OpKind.SEND, dim, spec.message)
                         for dim in dims)
            shared[tuple(dims)] = mine * count if send else _paced(mine, count)
        ops[server] = shared[tuple(dims)]
    return _program(ops, {dim: tuple(pairs) for dim, pairs in groups.items()}, ranks)


def _message(kind: OpKind, group: str, size: float) -> Op:
    """One message: an all-to-all call (``kind`` COLLECTIVE) or one side of a
    storage transfer."""
    collective = Collective.ALL_TO_ALL if kind is OpKind.COLLECTIVE else Collective.SEND_RECV
    return Op(kind, f"background {collective.value}", BG_STREAM, Phase.FORWARD,
              collective=collective, group=group, bytes=size)


def _paced(released: tuple[Op, ...], count: int) -> tuple[Op, ...]:
    """``count`` periods: a pacing op, then the messages it releases."""
    ops: list[Op] = []
    for _ in range(count):
        ops.append(Op(OpKind.COMPUTE, PACING, COMPUTE_STREAM, Phase.FORWARD))
        pacing = len(ops) - 1
        ops.extend(op._replace(deps=(pacing,)) for op in released)
    return tuple(ops)


def _program(ops: list, groups: dict, ranks: int) -> Program:
    return Program(ops=tuple(ops), groups=groups,
                   static_memory=tuple({} for _ in range(ranks)), model_flops=0.0, tokens=0,
                   stage=(0,) * ranks)
