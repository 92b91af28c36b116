"""The ``network`` section: how collectives are lowered (NCCL's algorithm and
protocol, or the tuner's choice; the step model)."""

from __future__ import annotations

from typing import Any

import networkx as nx

from simulator.base.fields import choice, fail, section
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.config.cluster import Machine
from topologies import ClusterSpec

SCHEMA = {
    "algorithm": (choice(["auto"] + [a.value for a in Algorithm
                                     if a is not Algorithm.DIRECT]), "auto"),
    "protocol": (choice(["auto"] + [p.value for p in Protocol]), "auto"),
    "step_model": (choice(["pipelined", "lockstep"]), "pipelined"),
}


def _network(values: dict[str, Any], cluster: ClusterSpec, graph: nx.DiGraph | None):
    algorithm = None if values["algorithm"] == "auto" else Algorithm(values["algorithm"])
    protocol = None if values["protocol"] == "auto" else Protocol(values["protocol"])
    has_nvls = cluster.nvls if graph is None else any(
        d.get("nvls") for _, d in graph.nodes(data=True))
    if algorithm is Algorithm.NVLS and not has_nvls:
        raise fail("network.algorithm", "nvls", "needs an NVSwitch with NVLink SHARP "
                                                 "(dgx-h100, dgx-h200, or cluster.nvls: true)")
    if algorithm is Algorithm.COLLNET and not (cluster.sharp or (
            graph is not None and graph.graph.get("sharp"))):
        raise fail("network.algorithm", "collnet", "needs switches with SHARP "
                                                    "(cluster.sharp: true)")
    if algorithm in (Algorithm.NVLS, Algorithm.COLLNET, Algorithm.PAT) and protocol not in (
            None, Protocol.SIMPLE):
        raise fail("network.protocol", protocol.value, "cannot run with network.algorithm "
                                                        f"{algorithm.value}, which uses simple "
                                                        "only")
    return algorithm, protocol


def network_from(raw: object, machine: Machine) -> tuple[Algorithm | None, Protocol | None, str]:
    """Check a ``network:`` section: (algorithm or None, protocol or None, step model)."""
    values = section("network", raw, SCHEMA)
    algorithm, protocol = _network(values, machine.cluster, machine.graph)
    return algorithm, protocol, values["step_model"]
