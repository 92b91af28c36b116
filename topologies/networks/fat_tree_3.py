"""Three-level fat tree: leaves in pods, pod aggregation switches, core planes."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from simulator.base.fields import integer, number, setting
from topologies.links import Nic, Wire, link, spines_over, switch
from topologies.networks.base import NetworkSpec, leaf_ports_setting, oversubscription_setting


@dataclass(frozen=True)
class FatTree3(NetworkSpec):
    """Leaves grouped in pods of ``pod_leaves``; aggregation switch j of every pod
    joins core plane j, whose switches reach every pod."""

    name = "fat_tree_3"
    leaf_ports: int = leaf_ports_setting()  # NIC ports per leaf switch
    oversubscription: float = oversubscription_setting()  # a switch level's down : up bandwidth
    pod_leaves: int = setting(integer(1), 8)  # leaves per pod
    core_oversubscription: float = setting(number(1.0, 64.0), 1.0)  # aggregation down : up

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        leaves_n = max(1, math.ceil(len(nics) / self.leaf_ports))
        leaves = [switch(graph, f"leaf{i}", 1) for i in range(leaves_n)]
        for port, (_, _, nic) in enumerate(nics):
            link(graph, nic, leaves[port // self.leaf_ports], wire, "network")
        if leaves_n == 1:
            return
        aggs_per_pod = max(1, math.ceil(self.leaf_ports / self.oversubscription))
        pods = math.ceil(leaves_n / self.pod_leaves)
        aggregation: list[list[str]] = []
        for pod in range(pods):
            members = leaves[pod * self.pod_leaves:(pod + 1) * self.pod_leaves]
            aggregation.append(spines_over(graph, members, aggs_per_pod, f"pod{pod}.agg", 2,
                                           wire))
        if pods == 1:
            return
        cores_per_plane = max(1, math.ceil(self.pod_leaves / self.core_oversubscription))
        for plane in range(aggs_per_pod):
            spines_over(graph, [pod[plane] for pod in aggregation], cores_per_plane,
                        f"core{plane}.", 3, wire)
