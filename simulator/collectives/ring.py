"""Ring algorithms (all-reduce, all-gather, reduce-scatter, broadcast, reduce).

- ring: the ranks in a ring, split into one channel per NIC each server brings
  (channel c enters each server at a member on its c-th NIC and leaves from a
  member on its (c-1)-th, so no NIC carries two channels one way). Per
  channel, every ring link carries all-reduce 2(n-1)/n S/C, all-gather and
  reduce-scatter (n-1)/n S/C; broadcast and reduce are a pipelined chain from the root carrying S/C.
  Steps: 2(n-1) (all-reduce) or n-1, of which 2(N-1) or N-1 cross servers
  (at one GPU per server each at the tree's network latency, and a Simple
  all-reduce across servers at 1.4 times its latency: ``nccl``).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import (
    Plan,
    channel_runs,
    channels_for,
    hop_classes,
    nics_of,
    nvlink_channels,
)
from simulator.network.fabric import Fabric, Transport

RING_PASSES = {  # collective -> (ring link bytes as a fraction of S, steps factor)
    Collective.ALL_REDUCE: 2,
    Collective.ALL_GATHER: 1,
    Collective.REDUCE_SCATTER: 1,
}


def ring_orders(nodes: Sequence[int], channels: int,
                nics: Sequence[object] | None = None) -> list[list[int]]:
    """Ring order (member indices) of each channel.

    ``nodes[i]`` is member i's server and ``nics[i]`` its NIC (default: a NIC
    each); members stay grouped by server in the order given, and channel c
    starts each server's run at the first member on that server's c-th NIC
    (``channel_runs``), so the channels enter and leave a server through
    different NICs, as NCCL's rings do.

    >>> ring_orders([0, 0, 1, 1], 2)
    [[0, 1, 2, 3], [1, 0, 3, 2]]
    >>> ring_orders([0, 0, 0, 0], 2, ["a", "a", "b", "b"])  # two GPUs per NIC
    [[0, 1, 2, 3], [2, 3, 0, 1]]
    """
    runs = channel_runs(nodes, channels, nics)
    return [[m for run in channel for m in run] for channel in runs]


def ring(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """Ring (or, for broadcast/reduce, pipelined chain from the first member)."""
    n, servers = len(gpus), len({fabric.node_of(g) for g in gpus})
    channels = channels_for(fabric, gpus)
    chain = kind in (Collective.BROADCAST, Collective.REDUCE)
    hops: list[tuple[str, str]] = []
    for order in ring_orders([fabric.node_of(g) for g in gpus], channels, nics_of(fabric, gpus)):
        links = range(n - 1) if chain else range(n)
        hops.extend((gpus[order[i]], gpus[order[(i + 1) % n]]) for i in links)
    routes, intra, inter = hop_classes(fabric, hops)
    passes = 1 if chain else RING_PASSES[kind]
    fraction = 1.0 if chain else passes * (n - 1) / n
    steps = passes * (n - 1)
    inter_steps = passes * (servers - 1)
    return Plan(Algorithm.RING, routes, [fraction * size / channels] * len(routes),
                [(intra[0], steps - inter_steps, intra[1]),
                 (Transport.NET, inter_steps, inter or 0.0)],
                channels, servers > 1, pipelined_steps=steps, ranks=n,
                pipeline_channels=0 if chain else nvlink_channels(fabric, gpus[0]),
                one_per_server=servers == n > 1,
                plateau=kind is Collective.ALL_REDUCE and servers > 1)
