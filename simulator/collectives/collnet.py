"""In-network reduction with InfiniBand SHARP (NCCL's CollNet Direct).

- collnet: all-reduce across servers whose switches reduce (SHARP: Mellanox
  Quantum / Quantum-2, with NCCL's CollNet plugin; Graham et al., "Scalable
  Hierarchical Aggregation Protocol (SHArP)", COMHPC 2016). Inside each server
  the GPUs reduce-scatter over NVLink, so that GPU i holds shard i of the
  server's sum (S/g bytes, g GPUs); each GPU sends its shard through its own
  NIC into the switches, which reduce it on the way up an aggregation tree
  (one per shard, rooted at a top switch, the shards' trees spread over the
  spines) and multicast the result down; the GPUs then all-gather the shards
  over NVLink. The phases are pipelined in chunks, so all flows run at once:
  2 S/g per ordered GPU pair inside a server, S/g up and down each NIC, and
  S/g per shard on each switch link of its tree (the switches send the
  reduced sum up once, not once per NIC). The network carries S/g per NIC
  each way where a ring carries 2 (n-1)/n S/g: in-network reduction halves the
  NIC traffic of a large all-reduce.

Latency as NCCL's tuner models CollNet Direct (``tuning.cc``): 2 NVLink steps
plus 0.4 us per extra local rank (arity serialisation) and one network step.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import AlgorithmUnavailable, Plan
from simulator.network.fabric import Fabric, Transport

ARITY_LATENCY = 0.4e-6  # NCCL tuning.cc: per extra local rank, CollNet Direct


def collnet(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """SHARP all-reduce: NVLink reduce-scatter, switch reduction, NVLink all-gather."""
    if kind is not Collective.ALL_REDUCE:
        raise AlgorithmUnavailable(f"collnet runs all_reduce only, not {kind.value}")
    if not fabric.graph.graph.get("sharp"):
        raise AlgorithmUnavailable("collnet needs switches with SHARP (cluster.sharp: true)")
    servers: dict[int, list[str]] = {}
    for gpu in gpus:
        servers.setdefault(fabric.node_of(gpu), []).append(gpu)
    if len(servers) < 2:
        raise AlgorithmUnavailable("collnet reduces across servers; the group is on one")
    g = max(len(members) for members in servers.values())
    routes, payload = _local(fabric, servers.values(), g)
    up, intra_wire = _network(fabric, servers.values(), g)
    routes += up
    payload += [1.0 / g] * len(up)
    inter_wire = max(float(fabric.latency[list(r)].sum()) for r in up) / 2
    steps = [(Transport.NVLINK, 2 * min(1, g - 1), intra_wire + (g - 1) * ARITY_LATENCY),
             (Transport.NET, 1, inter_wire)]
    return Plan(Algorithm.COLLNET, routes, payload, steps, g, True)


def _local(fabric: Fabric, servers, g: int) -> tuple[list[tuple[int, ...]], list[float]]:
    """NVLink reduce-scatter and all-gather: 2 S/g per ordered pair of a server."""
    routes, payload = [], []
    for members in servers:
        for a in members:
            for b in members:
                if a != b:
                    routes.append(fabric.route(a, b).links)
                    payload.append(2.0 / g)
    return routes, payload


def _network(fabric: Fabric, servers, g: int) -> tuple[list[tuple[int, ...]], float]:
    """Each shard's flows: GPU -> NIC -> leaf and back, and one reduced stream
    per leaf up to the shard's root and back. Also the worst GPU-NIC latency."""
    routing, graph = fabric.routing, fabric.graph
    routes: list[tuple[int, ...]] = []
    leaves_of: dict[int, set[str]] = {}
    wire = 0.0
    for members in servers:
        for shard, gpu in enumerate(members):
            nic = graph.nodes[gpu]["nic"]
            leaf = routing.leaf(nic)
            leaves_of.setdefault(shard, set()).add(leaf)
            down = (fabric.link(gpu, nic), fabric.link(nic, leaf))
            routes += [down, (fabric.link(leaf, nic), fabric.link(nic, gpu))]
            wire = max(wire, float(fabric.latency[down[0]]))
    for shard, leaves in sorted(leaves_of.items()):
        if len(leaves) < 2:
            continue
        ordered = sorted(leaves)
        root = routing.aggregation_root(ordered, shard)
        for leaf in ordered:
            for a, b in ((leaf, root), (root, leaf)):
                path = routing.switch_path(a, b, shard)
                routes.append(tuple(fabric.link(u, v) for u, v in zip(path, path[1:],
                                                                       strict=False)))
    return [r for r in routes if r], wire
