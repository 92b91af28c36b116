"""Rail-optimized fabric: NIC k of every server on rail k's leaves, with PXN routing.

Same-rail traffic between servers of one leaf block crosses a single switch.
NCCL's PXN (PCI x NVLink) keeps traffic on one rail: data bound for another
server first crosses NVLink to the local GPU whose NIC is on the destination
NIC's rail, then leaves through that NIC (in a rack-scale NVLink domain, a GPU
of its own tray where one is on that rail).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from topologies.links import Nic, Wire, link, spines_over, switch, tray_of
from topologies.networks.base import NetworkSpec, leaf_ports_setting, oversubscription_setting
from topologies.routing import Routing


class PxnRouting(Routing):
    """The default routing, entered through the GPU on the destination's rail."""

    proxies_through_peers = True

    def head(self, src: str, dst_nic: str) -> list[str]:
        nodes = self.graph.nodes
        rail, tray = nodes[dst_nic]["local"], tray_of(nodes[src])
        peers = self.server_gpus[nodes[src]["node"]]  # its own tray's GPUs first
        for gpu in sorted(peers, key=lambda g: tray_of(nodes[g]) != tray):
            if nodes[nodes[gpu]["nic"]]["local"] == rail:
                return self.inside(src, gpu) if gpu != src else [src]
        return [src]


@dataclass(frozen=True)
class RailOptimized(NetworkSpec):
    """NIC k of every server plugs into a leaf of rail k (``leaf_ports`` servers per
    leaf); spines join all leaves."""

    name = "rail_optimized"
    routing = PxnRouting
    leaf_ports: int = leaf_ports_setting()  # NIC ports per leaf switch
    oversubscription: float = oversubscription_setting()  # a switch level's down : up bandwidth

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        leaves: dict[tuple[int, int], str] = {}
        for server, k, nic in nics:
            key = (k, server // self.leaf_ports)
            if key not in leaves:
                leaves[key] = switch(graph, f"rail{k}.leaf{key[1]}", 1)
            link(graph, nic, leaves[key], wire, "network")
        all_leaves = list(leaves.values())
        if len(all_leaves) > 1:
            spines = max(1, math.ceil(self.leaf_ports / self.oversubscription))
            spines_over(graph, all_leaves, spines, "spine", 2, wire)
