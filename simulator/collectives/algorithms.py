"""Collective algorithms as NCCL runs them, lowered to flows on the fabric.

Each function returns a ``Plan``: the flows (route, payload bytes) an algorithm
puts on the fabric and the pipeline steps it pays latency for; a protocol then
turns the plan into wire bytes and a latency (``simulator.collectives.tuner``).
S is the nccl-tests buffer size: the full buffer for all-reduce, broadcast and
reduce, the gathered buffer for all-gather and reduce-scatter, each rank's send
buffer for all-to-all.

- ring: the ranks in a ring, split into one channel per NIC each server brings
  (channel c starts each server's run at its c-th member, so channels leave a
  server through different NICs). Per channel, every ring link carries
  all-reduce 2(n-1)/n S/C, all-gather and reduce-scatter (n-1)/n S/C;
  broadcast and reduce are a pipelined chain from the root carrying S/C.
  Steps: 2(n-1) (all-reduce) or n-1, of which 2(N-1) or N-1 cross servers.
- tree: all-reduce. NCCL's double binary tree over servers, each tree carrying
  half the data, with a chain through each server's GPUs (inside one server it
  is just the chain); reduce flows go up while broadcast flows come down.
  Latency 2((n/N-1) intra + log2(N) inter) steps.
- nvls: all-reduce inside one NVSwitch with NVLink SHARP: each GPU sends its
  buffer to the switch, which reduces and multicasts, S(n+1)/n bytes each way
  per GPU (before the switch's efficiency).
- direct: all-to-all (every pair exchanges S/n), send/recv (one flow), and
  ring exchange (every member sends S to its ring successor: one step of ring
  attention's K/V rotation, as batched send/recv).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.base.ir import Collective
from simulator.collectives import nccl
from simulator.collectives.nccl import Algorithm
from simulator.network.fabric import Fabric, Transport


class AlgorithmUnavailable(ValueError):
    """The algorithm cannot run this collective on this group."""


@dataclass
class Plan:
    """Flows of one algorithm for one call, before a protocol is chosen."""

    algorithm: Algorithm
    routes: list[tuple[int, ...]]
    payload: list[float]
    steps: list[tuple[Transport, int, float]]  # (transport, count, wire latency per step)
    channels: int
    multi_node: bool
    pipelined_steps: int = 1  # steps a lock-step ring would run
    wire_scale: float = 1.0  # extra bytes factor (NVLS switch efficiency)
    rates: np.ndarray | None = field(default=None, repr=False)
    ranks: int = 0
    pipeline_channels: int = 0  # NCCL channels whose ring pipeline fills (0: not modelled)


RING_PASSES = {  # collective -> (ring link bytes as a fraction of S, steps factor)
    Collective.ALL_REDUCE: 2,
    Collective.ALL_GATHER: 1,
    Collective.REDUCE_SCATTER: 1,
}


def ring_orders(nodes: Sequence[int], channels: int) -> list[list[int]]:
    """Ring order (member indices) of each channel.

    ``nodes[i]`` is member i's server; members stay grouped by server in the
    order given, and channel c starts each server's run at its c-th member.

    >>> ring_orders([0, 0, 1, 1], 2)
    [[0, 1, 2, 3], [1, 0, 3, 2]]
    """
    servers: dict[int, list[int]] = {}
    for member, node in enumerate(nodes):
        servers.setdefault(node, []).append(member)
    orders = []
    for c in range(channels):
        order: list[int] = []
        for members in servers.values():
            shift = c % len(members)
            order.extend(members[shift:] + members[:shift])
        orders.append(order)
    return orders


def channels_for(fabric: Fabric, gpus: Sequence[str]) -> int:
    """NCCL-style channel count: the NICs each server brings (1 inside a server)."""
    nics: dict[int, set[str]] = {}
    for gpu in gpus:
        nics.setdefault(fabric.node_of(gpu), set()).add(fabric.graph.nodes[gpu].get("nic"))
    if len(nics) == 1:
        return 1
    return min(len(v) for v in nics.values())


def nvlink_channels(fabric: Fabric, gpu: str) -> int:
    """NCCL's channels on ``gpu``: one per NVLink (its NVLink bandwidth over one
    link's), at least one."""
    graph = fabric.graph
    total = sum(float(d.get("bandwidth", 0.0)) for _, _, d in graph.out_edges(gpu, data=True)
                if d.get("link") == "nvlink")
    return max(1, round(total / nccl.NVLINK_LINK_BANDWIDTH))


def _hop_classes(fabric: Fabric, hops: Sequence[tuple[str, str]]):
    """Routes of ``hops``, the worst intra-server hop (transport, wire latency) and
    the worst inter-server wire latency (None when no hop leaves a server)."""
    routes: list[tuple[int, ...]] = []
    intra: tuple[Transport, float] = (Transport.NVLINK, 0.0)
    inter: float | None = None
    for a, b in hops:
        route = fabric.route(a, b)
        routes.append(route.links)
        if route.transport is Transport.NET:
            inter = max(inter or 0.0, route.latency)
        elif route.latency >= intra[1]:
            intra = (route.transport, route.latency)
    return routes, intra, inter


def ring(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """Ring (or, for broadcast/reduce, pipelined chain from the first member)."""
    n, servers = len(gpus), len({fabric.node_of(g) for g in gpus})
    channels = channels_for(fabric, gpus)
    chain = kind in (Collective.BROADCAST, Collective.REDUCE)
    hops: list[tuple[str, str]] = []
    for order in ring_orders([fabric.node_of(g) for g in gpus], channels):
        links = range(n - 1) if chain else range(n)
        hops.extend((gpus[order[i]], gpus[order[(i + 1) % n]]) for i in links)
    routes, intra, inter = _hop_classes(fabric, hops)
    passes = 1 if chain else RING_PASSES[kind]
    fraction = 1.0 if chain else passes * (n - 1) / n
    steps = passes * (n - 1)
    inter_steps = passes * (servers - 1)
    return Plan(Algorithm.RING, routes, [fraction * size / channels] * len(routes),
                [(intra[0], steps - inter_steps, intra[1]),
                 (Transport.NET, inter_steps, inter or 0.0)],
                channels, servers > 1, pipelined_steps=steps, ranks=n,
                pipeline_channels=0 if chain else nvlink_channels(fabric, gpus[0]))


def btree_parents(n: int) -> list[int]:
    """Parents in NCCL's in-order binary tree over ranks 0..n-1 (root 0: -1).

    A rank's parent clears its lowest set bit and sets the next one up, or just
    clears it when that would leave the range.

    >>> btree_parents(4)
    [-1, 2, 0, 2]
    """
    parents = [-1] * n
    for rank in range(1, n):
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        parents[rank] = up if up < n else rank ^ bit
    return parents


def double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary trees: the second mirrors (n even) or shifts
    (n odd) the first, so a rank that is a leaf in one is inside the other.

    >>> double_binary_tree(4)
    ([-1, 2, 0, 2], [1, 3, 1, -1])
    """
    first = btree_parents(n)
    label = [n - 1 - r if n % 2 == 0 else (r - 1) % n for r in range(n)]
    unlabel = {v: r for r, v in enumerate(label)}
    second = [-1 if first[label[r]] < 0 else unlabel[first[label[r]]] for r in range(n)]
    return first, second


def tree(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """NCCL double binary tree all-reduce across servers (chains inside them)."""
    if kind is not Collective.ALL_REDUCE:
        raise AlgorithmUnavailable(f"tree runs all_reduce only, not {kind.value}")
    servers: dict[int, list[int]] = {}
    for member, gpu in enumerate(gpus):
        servers.setdefault(fabric.node_of(gpu), []).append(member)
    heads_of = list(servers.values())
    channels = channels_for(fabric, gpus)
    hops: list[tuple[str, str]] = []
    for c in range(channels):
        chains = [[gpus[m] for m in members[c % len(members):] + members[:c % len(members)]]
                  for members in heads_of]
        for parents in double_binary_tree(len(chains)):
            for chain in chains:  # reduce up the chain to its head, broadcast back down
                for a, b in zip(chain[1:], chain[:-1], strict=True):
                    hops += [(a, b), (b, a)]
            for child, parent in enumerate(parents):
                if parent >= 0:
                    hops += [(chains[child][0], chains[parent][0]),
                             (chains[parent][0], chains[child][0])]
    routes, intra, inter = _hop_classes(fabric, hops)
    per_server = max(len(m) for m in heads_of)
    depth = math.ceil(math.log2(len(servers)))
    return Plan(Algorithm.TREE, routes, [size / (2 * channels)] * len(routes),
                [(intra[0], 2 * (per_server - 1), intra[1]),
                 (Transport.NET, 2 * depth, inter or 0.0)],
                channels, len(servers) > 1)


def nvls(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """NVLink SHARP all-reduce: GPU -> NVSwitch (reduce) -> GPU (multicast)."""
    if kind is not Collective.ALL_REDUCE:
        raise AlgorithmUnavailable(f"nvls runs all_reduce only, not {kind.value}")
    servers = {fabric.node_of(g) for g in gpus}
    switch = fabric.nvswitch(next(iter(servers))) if len(servers) == 1 else None
    if switch is None:
        raise AlgorithmUnavailable("nvls needs the whole group on one NVSwitch with NVLS")
    n = len(gpus)
    routes = [(fabric.link(g, switch),) for g in gpus] + [(fabric.link(switch, g),) for g in gpus]
    wire = max(float(fabric.latency[r[0]]) for r in routes) * 2
    efficiency = float(fabric.graph.nodes[switch].get("nvls_efficiency", 1.0))
    return Plan(Algorithm.NVLS, routes, [size * (n + 1) / n] * len(routes),
                [(Transport.NVLINK, 1, wire)], 1, False, wire_scale=1.0 / efficiency)


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
    routes, intra, inter = _hop_classes(fabric, hops)
    worst = (Transport.NET, inter) if inter is not None else intra
    servers = len({fabric.node_of(g) for g in gpus})
    return Plan(Algorithm.DIRECT, routes, [payload] * len(routes), [(worst[0], 1, worst[1])],
                1, servers > 1)


PLANNERS = {Algorithm.RING: ring, Algorithm.TREE: tree, Algorithm.NVLS: nvls,
            Algorithm.DIRECT: direct}
