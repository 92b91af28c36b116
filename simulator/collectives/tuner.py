"""Collective calls: choose an algorithm and protocol, lower to flows, execute.

``Collectives`` is the NCCL-like tuner the engine calls: for each call it
considers every (algorithm, protocol) that can run it (``simulator.collectives.algorithms``,
``simulator.collectives.nccl``), prices each on the idle fabric exactly (max-min fair
rates of its flows plus its latency) and picks the fastest, as NCCL's tuner
picks the lowest modelled time (NVLS all-gather and reduce-scatter only where
they also beat the ring priced as NCCL's model prices it: ``unchosen_nvls``);
point-to-point calls (an all-to-all's n-1 sends and receives, send/recv) take
the protocol NCCL's p2p rule gives their per-peer bytes instead (``p2p``), and
DeepEP's and HybridEP's exchanges their own kernels' rates (``expert_exchange``).
Either choice can be forced
(``network.algorithm``, ``network.protocol``). A lowered call runs as its flows
on the shared network (so concurrent calls contend) followed by its latency.

Time on an idle, uniform fabric therefore has the closed form
``base + sum(steps * (step latency + wire latency)) + bytes / (bandwidth * efficiency)``,
which the oracle tests check per algorithm.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import simpy

from simulator.base.ir import Collective
from simulator.collectives import nccl, p2p
from simulator.collectives.algorithms import PLANNERS, AlgorithmUnavailable, Plan
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.network.fabric import Fabric
from simulator.network.flows import Network
from simulator.network.maxmin import max_min_rates


class CollectiveError(ValueError):
    """A forced algorithm or protocol that cannot run a call."""


@dataclass(frozen=True)
class Lowered:
    """Flows and latency of one collective call.

    The call runs ``steps`` times: transfer ``sizes[i]`` wire bytes along
    ``routes[i]`` (all flows at once), then wait ``latency / steps``.
    """

    routes: list[tuple[int, ...]]
    sizes: list[float]
    latency: float
    algorithm: Algorithm
    protocol: Protocol
    channels: int
    steps: int = 1
    key: tuple | None = None  # names this call's shape for the network's caches

    @property
    def step_latency(self) -> float:
        return self.latency / self.steps


CANDIDATES = {
    Collective.ALL_REDUCE: (Algorithm.NVLS, Algorithm.RING, Algorithm.TREE, Algorithm.COLLNET),
    # NVLS last: on equal times the ring is taken (nvls.py: when NVLS wins)
    Collective.ALL_GATHER: (Algorithm.RING, Algorithm.PAT, Algorithm.NVLS),
    Collective.REDUCE_SCATTER: (Algorithm.RING, Algorithm.PAT, Algorithm.NVLS),
    Collective.BROADCAST: (Algorithm.RING,),
    Collective.REDUCE: (Algorithm.RING,),
    Collective.ALL_TO_ALL: (Algorithm.DIRECT,),
    Collective.SEND_RECV: (Algorithm.DIRECT,),
    Collective.RING_EXCHANGE: (Algorithm.DIRECT,),
    Collective.DEEPEP_DISPATCH: (Algorithm.DEEPEP,),
    Collective.DEEPEP_COMBINE: (Algorithm.DEEPEP,),
    Collective.HYBRIDEP_DISPATCH: (Algorithm.HYBRIDEP,),
    Collective.HYBRIDEP_COMBINE: (Algorithm.HYBRIDEP,),
}
DIRECT_PROTOCOLS = (Protocol.LL, Protocol.SIMPLE)  # NCCL p2p never uses LL128
# NCCL point-to-point calls: their protocol by NCCL's p2p rule (p2p.nccl_protocol)
P2P_KINDS = (Collective.ALL_TO_ALL, Collective.SEND_RECV, Collective.RING_EXCHANGE)
OWN_KERNELS = (Algorithm.DEEPEP, Algorithm.HYBRIDEP)  # not NCCL: network.protocol is not theirs


def latency(plan: Plan, protocol: Protocol, size: float = 0.0) -> float:
    """NCCL's latency of ``plan`` under ``protocol`` for ``size`` bytes plus the
    wire latency per step."""
    total, wires = nccl.base_latency(plan.algorithm, protocol) + plan.fixed_latency, 0.0
    for transport, count, wire in plan.steps:
        total += count * nccl.step_latency(plan.algorithm, protocol, transport,
                                           plan.multi_node, plan.one_per_server)
        wires += count * wire
    if plan.plateau and protocol is Protocol.SIMPLE and \
            size >= nccl.RING_PLATEAU_BYTES * plan.channels * max(plan.ranks, 1):
        total *= nccl.RING_PLATEAU
    return total + wires


def finish(plan: Plan, size: float, protocol: Protocol, lockstep: bool = False) -> Lowered:
    """The call of ``size`` bytes that ``plan`` (made for 1 byte) becomes under ``protocol``."""
    if not nccl.supports(plan.algorithm, protocol):
        raise CollectiveError(f"{plan.algorithm.value} does not run the {protocol.value} protocol")
    scale = size * plan.wire_scale / nccl.efficiency(protocol)
    sizes = [b * scale for b in plan.payload]
    steps = 1
    if lockstep and plan.algorithm is Algorithm.RING and plan.pipelined_steps > 1:
        steps = plan.pipelined_steps
        sizes = [s / steps for s in sizes]
    fill = nccl.pipeline_fill(protocol, plan.ranks, plan.pipeline_channels,
                              plan.pipelined_steps, size)
    return Lowered(plan.routes, sizes, latency(plan, protocol, size) + fill, plan.algorithm,
                   protocol, plan.channels, steps)


def idle_rates(fabric: Fabric, plan: Plan) -> np.ndarray:
    """Max-min fair rate of each flow of ``plan`` alone on the fabric (cached)."""
    if plan.rates is None and len(plan.routes) == 1:  # one flow: its bottleneck link
        plan.rates = np.array([fabric.capacity[list(plan.routes[0])].min()])
    if plan.rates is None:
        lengths = np.array([len(r) for r in plan.routes])
        pair_flow = np.repeat(np.arange(len(plan.routes)), lengths)
        pair_link = np.fromiter((x for r in plan.routes for x in r), dtype=np.int64,
                                count=int(lengths.sum()))
        plan.rates = max_min_rates(pair_flow, pair_link, fabric.capacity, len(plan.routes))
    return plan.rates


def estimate(fabric: Fabric, plan: Plan, size: float, protocol: Protocol) -> float:
    """Seconds ``plan`` takes for ``size`` bytes on the idle fabric (exact)."""
    lowered = finish(plan, size, protocol)
    if not lowered.routes:
        return lowered.latency
    return lowered.latency + float(np.max(np.asarray(lowered.sizes) / idle_rates(fabric, plan)))


def unchosen_nvls(fabric: Fabric, kind: Collective, options: Sequence[tuple[Plan, Protocol]],
                  size: float, times: Sequence[float]) -> list[int]:
    """Indices of the NVLS all-gather or reduce-scatter options NCCL would not
    take: those slower than a ring option priced as NCCL's cost model prices it,
    latency plus bytes over bandwidth without the pipeline fill
    (``tuning.cc``, ``ncclTopoGetAlgoTime``). The fill is a real cost of the
    ring's chunks, which its time keeps once chosen, but NCCL's choice does not
    see it, and with it an 8-GPU server would take NVLS at 16-128 MiB, where
    NCCL keeps the ring and NVLS measures slower (NCCL issues #1047, #1083)."""
    if kind not in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        return []
    rings = [t - nccl.pipeline_fill(p, plan.ranks, plan.pipeline_channels,
                                    plan.pipelined_steps, size)
             for (plan, p), t in zip(options, times, strict=True)
             if plan.algorithm is Algorithm.RING]
    best_ring = min(rings, default=np.inf)
    return [i for i, ((plan, _), t) in enumerate(zip(options, times, strict=True))
            if plan.algorithm is Algorithm.NVLS and t >= best_ring]


def signature(fabric: Fabric, plan: Plan) -> tuple:
    """What ``estimate`` and ``finish`` read of ``plan``, but its routes (cached on
    it): two calls whose plans have equal signatures (the pipeline messages of
    every replica, say) cost the same under each protocol and lower to the same
    sizes and latency, so the tuner prices each shape of call once, not every
    group of GPUs."""
    if plan.signature is None:
        plan.signature = (plan.algorithm, tuple(plan.steps), plan.channels, plan.multi_node,
                          plan.pipelined_steps, plan.wire_scale, plan.ranks,
                          plan.pipeline_channels, tuple(plan.payload), plan.one_per_server,
                          plan.fixed_latency, plan.plateau,
                          idle_rates(fabric, plan).tobytes())
    return plan.signature


def execute(network: Network, lowered: Lowered):
    """SimPy process that carries out ``lowered`` on ``network``."""
    for _ in range(lowered.steps):
        yield network.transfer(lowered.routes, lowered.sizes, key=lowered.key)
        if lowered.step_latency > 0:
            yield network.env.timeout(lowered.step_latency)


def isolated_run(fabric: Fabric, lowered: Lowered) -> tuple[float, int]:
    """(seconds, SimPy events) of ``lowered`` alone on an idle fabric, simulated."""
    env = simpy.Environment()
    env.process(execute(Network(env, fabric.capacity), lowered))
    events = 0
    while env.peek() != float("inf"):
        env.step()
        events += 1
    return env.now, events


def isolated_time(fabric: Fabric, lowered: Lowered) -> float:
    """Seconds ``lowered`` takes alone on an idle fabric, simulated."""
    return isolated_run(fabric, lowered)[0]


class Collectives:
    """NCCL-like choice and lowering of collective calls on one fabric."""

    def __init__(self, fabric: Fabric, algorithm: Algorithm | None = None,
                 protocol: Protocol | None = None, lockstep: bool = False,
                 epoch: int = 0) -> None:
        self.fabric, self.algorithm, self.protocol = fabric, algorithm, protocol
        self.lockstep = lockstep
        self.epoch = epoch  # the fabric's state (its n-th change): in every call's key
        self._plans: dict[tuple, Plan | None] = {}
        self._lowered: dict[tuple, Lowered] = {}
        self._by_shape: dict[tuple, tuple[int, Lowered]] = {}  # call shape -> choice

    def __call__(self, kind: Collective, gpus: Sequence[str], size: float) -> Lowered:
        if len(gpus) < 2 or size <= 0:
            return Lowered([], [], 0.0, Algorithm.RING, Protocol.SIMPLE, 0)
        key = (kind, tuple(gpus), size)
        lowered = self._lowered.get(key)
        if lowered is None:
            options = self.p2p_protocol(kind, gpus, size, self.candidates(kind, gpus))
            shape = (kind, size, *((signature(self.fabric, plan), p) for plan, p in options))
            chosen = self._by_shape.get(shape)
            if chosen is None:  # the fastest on the idle fabric, ties to the first listed;
                # priced once per shape of call
                times = [estimate(self.fabric, plan, size, p) for plan, p in options]
                for i in unchosen_nvls(self.fabric, kind, options, size, times):
                    times[i] = np.inf
                best = int(np.argmin(times))
                plan, protocol = options[best]
                chosen = self._by_shape[shape] = (best, finish(plan, size, protocol,
                                                               self.lockstep))
            best, template = chosen
            lowered = self._lowered[key] = replace(template, routes=options[best][0].routes,
                                                   key=("call", self.epoch,
                                                        len(self._lowered)))
        return lowered

    def plan(self, kind: Collective, algorithm: Algorithm, gpus: Sequence[str]) -> Plan | None:
        """The 1-byte plan of ``algorithm`` for this call, or None if it cannot run it."""
        key = (kind, algorithm, tuple(gpus))
        if key not in self._plans:
            try:
                self._plans[key] = PLANNERS[algorithm](self.fabric, kind, gpus, 1.0)
            except AlgorithmUnavailable:
                self._plans[key] = None
        return self._plans[key]

    def candidates(self, kind: Collective, gpus: Sequence[str]) -> list[tuple[Plan, Protocol]]:
        algorithms = CANDIDATES[kind]
        if self.algorithm is not None and self.algorithm in algorithms:
            algorithms = (self.algorithm,)
        options = []
        for algorithm in algorithms:
            plan = self.plan(kind, algorithm, gpus)
            if plan is None:
                continue
            protocols = DIRECT_PROTOCOLS if algorithm is Algorithm.DIRECT else tuple(Protocol)
            if algorithm in OWN_KERNELS:
                protocols = (Protocol.SIMPLE,)
            elif self.protocol is not None:
                protocols = (self.protocol,) if self.protocol in protocols else ()
            options += [(plan, p) for p in protocols if nccl.supports(algorithm, p)]
        if not options:
            raise CollectiveError(self._why_none(kind, gpus))
        return options

    def p2p_protocol(self, kind: Collective, gpus: Sequence[str], size: float,
                     options: list[tuple[Plan, Protocol]]) -> list[tuple[Plan, Protocol]]:
        """``options`` left with the protocol NCCL runs a point-to-point call under
        (an all-to-all's n-1 sends and receives, a send/recv; ``p2p``): NCCL picks
        it by the bytes a channel carries, it does not take the faster. A forced
        ``network.protocol`` stays as given."""
        if self.protocol is not None or kind not in P2P_KINDS:
            return options
        peer = size / len(gpus) if kind is Collective.ALL_TO_ALL else size
        chosen = p2p.nccl_protocol(self.fabric, gpus, peer)
        return [(plan, p) for plan, p in options if p is chosen] or options

    def _why_none(self, kind: Collective, gpus: Sequence[str]) -> str:
        forced = ", ".join(f"network.{name} {value.value}" for name, value in
                           (("algorithm", self.algorithm), ("protocol", self.protocol)) if value)
        servers = len({self.fabric.node_of(g) for g in gpus})
        return (f"{forced or 'no algorithm'} cannot run {kind.value} over {len(gpus)} GPUs on "
                f"{servers} server(s)")
