"""Direct flows: all-to-all, send/recv, ring exchange.

- direct: all-to-all (every pair exchanges S/n), send/recv (one flow), and
  ring exchange (every member sends S to its ring successor: one step of ring
  attention's K/V rotation, as batched send/recv).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import (
    AlgorithmUnavailable,
    Plan,
    hop_classes,
)
from simulator.network.fabric import Fabric, Transport


def direct(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """All-to-all (each pair exchanges S/n) or send/recv (``gpus`` = [src, dst])."""
    if kind is Collective.SEND_RECV:
        hops, payload = [(gpus[0], gpus[1])], size
    elif kind is Collective.RING_EXCHANGE:
        hops = [(gpus[i], gpus[(i + 1) % len(gpus)]) for i in range(len(gpus))]
        payload = size
    elif kind is Collective.ALL_TO_ALL:
        hops = [(a, b) for a in gpus for b in gpus if a != b]
        payload = size / len(gpus)
    else:
        raise AlgorithmUnavailable(f"direct runs all_to_all and send_recv, not {kind.value}")
    routes, intra, inter = hop_classes(fabric, hops)
    worst = (Transport.NET, inter) if inter is not None else intra
    servers = len({fabric.node_of(g) for g in gpus})
    return Plan(Algorithm.DIRECT, routes, [payload] * len(routes), [(worst[0], 1, worst[1])],
                1, servers > 1)
