"""The ``network`` section: how collectives are lowered (NCCL's algorithm and
protocol, or the tuner's choice; the step model), its keys declared as
settings on ``NetworkSettings`` and checked against the cluster here."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx

from simulator.base.fields import choice, fail, schema_of, section, setting
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.config.cluster import Machine
from topologies import ClusterSpec


@dataclass(frozen=True)
class NetworkSettings:
    """The ``network`` section's settings."""

    # NCCL's algorithm for every collective (auto: its tuner's choice per call)
    algorithm: str = setting(choice(["auto"] + [a.value for a in Algorithm
                                                if a is not Algorithm.DIRECT]), "auto")
    # NCCL's protocol (auto: the tuner's choice per call)
    protocol: str = setting(choice(["auto"] + [p.value for p in Protocol]), "auto")
    # pipelined: NCCL's chunk pipelining; lockstep: every ring step waits for the slowest
    step_model: str = setting(choice(["pipelined", "lockstep"]), "pipelined")



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
    values = asdict(NetworkSettings(**section("network", raw, schema_of(NetworkSettings))))
    algorithm, protocol = _network(values, machine.cluster, machine.graph)
    return algorithm, protocol, values["step_model"]
