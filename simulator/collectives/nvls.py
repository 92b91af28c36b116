"""NVLink SHARP (NVLS) all-reduce inside one NVSwitch.

- nvls: all-reduce inside one NVSwitch with NVLink SHARP: each GPU sends its
  buffer to the switch, which reduces and multicasts, S(n+1)/n bytes each way
  per GPU (before the switch's efficiency).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import (
    AlgorithmUnavailable,
    Plan,
)
from simulator.network.fabric import Fabric, Transport


def nvls(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """NVLink SHARP all-reduce: GPU -> NVSwitch (reduce) -> GPU (multicast)."""
    if kind is not Collective.ALL_REDUCE:
        raise AlgorithmUnavailable(f"nvls runs all_reduce only, not {kind.value}")
    servers = {fabric.node_of(g) for g in gpus}
    switch = fabric.nvswitch(next(iter(servers))) if len(servers) == 1 else None
    if switch is None:
        raise AlgorithmUnavailable("nvls needs the whole group on one NVSwitch with NVLS")
    graph = fabric.graph  # (this state of the fabric: a link may fail during the run)
    if not all(graph.has_edge(g, switch) and graph.has_edge(switch, g) for g in gpus):
        raise AlgorithmUnavailable("nvls needs every member's own NVLink to the NVSwitch (one "
                                   "is down)")
    n = len(gpus)
    routes = [(fabric.link(g, switch),) for g in gpus] + [(fabric.link(switch, g),) for g in gpus]
    wire = max(float(fabric.latency[r[0]]) for r in routes) * 2
    efficiency = float(fabric.graph.nodes[switch].get("nvls_efficiency", 1.0))
    return Plan(Algorithm.NVLS, routes, [size * (n + 1) / n] * len(routes),
                [(Transport.NVLINK, 1, wire)], 1, False, wire_scale=1.0 / efficiency)
