"""Collectives lowered to flows on the fabric, as NCCL's ring algorithm runs them.

Ring all-reduce of S bytes over n ranks is a reduce-scatter then an all-gather:
2(n-1) steps, in each of which every rank sends one S/n chunk to its ring
successor (nccl-tests ``doc/PERFORMANCE.md``). The steps are pipelined, so each
ring link carries 2(n-1)/n * S bytes back to back: we simulate that as one flow
per ring link at the fair-shared bandwidth of its route, plus 2(n-1) step
latencies (the slowest hop's). On an idle uniform ring this is exactly

    t = 2(n-1)/n * S / B + 2(n-1) * latency.

With ``lockstep=True`` the ring is instead simulated step by step: 2(n-1)
transfers of one S/(n * channels) chunk per ring link, each followed by the step
latency, the next starting when the slowest chunk of the previous has arrived.
Both give the same time on an idle uniform ring (a test checks it); lock-step is
slower to simulate and slightly pessimistic under contention, pipelined is
NCCL's behaviour and the default.

Like NCCL, a ring that spans servers is split into channels, one per NIC a
server contributes; channel c rotates each server's members by c, so every
channel enters and leaves a server through different GPUs and so different NICs,
and each channel carries S / channels.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import simpy

from simulator.fabric import Fabric
from simulator.ir import Collective
from simulator.network import Network


@dataclass(frozen=True)
class Lowered:
    """Flows and latency of one collective call.

    The call runs ``steps`` times: transfer ``sizes[i]`` bytes along
    ``routes[i]`` (all flows at once), then wait ``latency / steps``.
    """

    routes: list[tuple[int, ...]]
    sizes: list[float]
    latency: float
    algorithm: str
    channels: int
    steps: int = 1

    @property
    def step_latency(self) -> float:
        return self.latency / self.steps


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


def ring_channels(fabric: Fabric, gpus: Sequence[str]) -> int:
    """NCCL-style channel count: the NICs each server brings (1 inside a server)."""
    nics: dict[int, set[str]] = {}
    for gpu in gpus:
        nics.setdefault(fabric.node_of(gpu), set()).add(fabric.graph.nodes[gpu]["nic"])
    if len(nics) == 1:
        return 1
    return min(len(v) for v in nics.values())


def ring_all_reduce(fabric: Fabric, gpus: Sequence[str], size: float,
                    lockstep: bool = False) -> Lowered:
    """Lower an all-reduce of ``size`` bytes over ``gpus`` to ring flows."""
    n = len(gpus)
    if n < 2 or size <= 0:
        return Lowered([], [], 0.0, "ring", 0)
    channels = ring_channels(fabric, gpus)
    per_flow = 2.0 * (n - 1) / n * size / channels
    routes: list[tuple[int, ...]] = []
    hop_latency = 0.0
    for order in ring_orders([fabric.node_of(g) for g in gpus], channels):
        for i, member in enumerate(order):
            route = fabric.route(gpus[member], gpus[order[(i + 1) % n]])
            routes.append(route.links)
            hop_latency = max(hop_latency, route.latency)
    steps = 2 * (n - 1)
    if lockstep:
        chunk = per_flow / steps
        return Lowered(routes, [chunk] * len(routes), steps * hop_latency, "ring", channels,
                       steps)
    return Lowered(routes, [per_flow] * len(routes), steps * hop_latency, "ring", channels)


def point_to_point(fabric: Fabric, src: str, dst: str, size: float) -> Lowered:
    """One message of ``size`` bytes from GPU ``src`` to ``dst`` along its route."""
    if src == dst or size <= 0:
        return Lowered([], [], 0.0, "p2p", 0)
    route = fabric.route(src, dst)
    return Lowered([route.links], [size], route.latency, "p2p", 1)


def isolated_time(fabric: Fabric, lowered: Lowered) -> float:
    """Seconds ``lowered`` takes alone on an idle fabric (bandwidth term + latency)."""
    env = simpy.Environment()
    env.run(env.process(execute(Network(env, fabric.capacity), lowered)))
    return env.now


def execute(network: Network, lowered: Lowered):
    """SimPy process that carries out ``lowered`` on ``network``."""
    for _ in range(lowered.steps):
        yield network.transfer(lowered.routes, lowered.sizes)
        if lowered.step_latency > 0:
            yield network.env.timeout(lowered.step_latency)


def lower(kind: Collective, fabric: Fabric, gpus: Sequence[str], size: float,
          lockstep: bool = False) -> Lowered:
    """Dispatch a collective to its algorithm."""
    if kind is Collective.ALL_REDUCE:
        return ring_all_reduce(fabric, gpus, size, lockstep)
    raise NotImplementedError(f"collective {kind.value} has no lowering yet")
