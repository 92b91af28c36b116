"""Two-level fat tree: NICs fill leaves in placement order; every leaf reaches every spine."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from topologies.links import Nic, Wire, link, spines_over, switch
from topologies.networks.base import NetworkSpec, leaf_ports_setting, oversubscription_setting


def leaf_spine_shape(ports: int, leaf_ports: int, oversubscription: float) -> tuple[int, int]:
    """Number of (leaves, spines) for ``ports`` NIC ports.

    Each leaf takes ``leaf_ports`` NICs and has ``ceil(leaf_ports / oversubscription)``
    uplinks, one to each spine; one leaf needs no spine.

    >>> leaf_spine_shape(512, 32, 1.0)
    (16, 32)
    >>> leaf_spine_shape(512, 32, 2.0)
    (16, 16)
    """
    leaves = max(1, math.ceil(ports / leaf_ports))
    spines = 0 if leaves == 1 else max(1, math.ceil(leaf_ports / oversubscription))
    return leaves, spines


@dataclass(frozen=True)
class FatTree(NetworkSpec):
    """A two-level leaf-spine fat tree: leaves of ``leaf_ports`` NICs, spines to give
    each leaf ``leaf_ports / oversubscription`` uplinks (full bisection at 1)."""

    name = "fat_tree"
    leaf_ports: int = leaf_ports_setting()  # NIC ports per leaf switch
    oversubscription: float = oversubscription_setting()  # a switch level's down : up bandwidth

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        leaves_n, spines_n = leaf_spine_shape(len(nics), self.leaf_ports, self.oversubscription)
        leaves = [switch(graph, f"leaf{i}", 1) for i in range(leaves_n)]
        for port, (_, _, nic) in enumerate(nics):
            link(graph, nic, leaves[port // self.leaf_ports], wire, "network")
        spines_over(graph, leaves, spines_n, "spine", 2, wire)
