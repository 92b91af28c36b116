"""Inter-node networks: builders that connect servers' NICs through switches.

Each builder takes the graph (servers already added), the NICs as
``(server, index, name)`` in placement order, the fabric parameters and the link
figures, and adds ``switch`` nodes and full-duplex ``network`` links. Switch
nodes carry ``level`` (1 = the switch a NIC plugs into).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from topologies.clusters import FabricKind, FabricSpec

Nic = tuple[int, int, str]  # (server, index in server, node name)


@dataclass(frozen=True)
class Wire:
    """Figures every link of the network gets."""

    bandwidth: float
    latency: float
    efficiency: float


def link(graph: nx.DiGraph, a: str, b: str, wire: Wire, kind: str) -> None:
    """Add one full-duplex link as two directed edges."""
    for u, v in ((a, b), (b, a)):
        graph.add_edge(u, v, bandwidth=wire.bandwidth, latency=wire.latency,
                       efficiency=wire.efficiency, link=kind)


def _switch(graph: nx.DiGraph, name: str, level: int) -> str:
    graph.add_node(name, kind="switch", level=level)
    return name


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


def _spines_over(graph: nx.DiGraph, leaves: Sequence[str], count: int, prefix: str,
                 level: int, wire: Wire) -> list[str]:
    spines = [_switch(graph, f"{prefix}{i}", level) for i in range(count)]
    for spine in spines:
        for leaf in leaves:
            link(graph, leaf, spine, wire, "network")
    return spines


def fat_tree(graph: nx.DiGraph, nics: Sequence[Nic], fabric: FabricSpec, wire: Wire) -> None:
    """Two levels: NICs fill leaves in placement order; every leaf reaches every spine."""
    leaves_n, spines_n = leaf_spine_shape(len(nics), fabric.leaf_ports, fabric.oversubscription)
    leaves = [_switch(graph, f"leaf{i}", 1) for i in range(leaves_n)]
    for port, (_, _, nic) in enumerate(nics):
        link(graph, nic, leaves[port // fabric.leaf_ports], wire, "network")
    _spines_over(graph, leaves, spines_n, "spine", 2, wire)


def fat_tree_3(graph: nx.DiGraph, nics: Sequence[Nic], fabric: FabricSpec, wire: Wire) -> None:
    """Three levels: leaves grouped in pods of ``pod_leaves``; aggregation switch j of
    every pod joins core plane j, whose switches reach every pod."""
    leaves_n = max(1, math.ceil(len(nics) / fabric.leaf_ports))
    leaves = [_switch(graph, f"leaf{i}", 1) for i in range(leaves_n)]
    for port, (_, _, nic) in enumerate(nics):
        link(graph, nic, leaves[port // fabric.leaf_ports], wire, "network")
    if leaves_n == 1:
        return
    aggs_per_pod = max(1, math.ceil(fabric.leaf_ports / fabric.oversubscription))
    pods = math.ceil(leaves_n / fabric.pod_leaves)
    aggregation: list[list[str]] = []
    for pod in range(pods):
        members = leaves[pod * fabric.pod_leaves:(pod + 1) * fabric.pod_leaves]
        aggregation.append(_spines_over(graph, members, aggs_per_pod, f"pod{pod}.agg", 2, wire))
    if pods == 1:
        return
    cores_per_plane = max(1, math.ceil(fabric.pod_leaves / fabric.core_oversubscription))
    for plane in range(aggs_per_pod):
        _spines_over(graph, [pod[plane] for pod in aggregation], cores_per_plane,
                     f"core{plane}.", 3, wire)


def rail_optimized(graph: nx.DiGraph, nics: Sequence[Nic], fabric: FabricSpec,
                   wire: Wire) -> None:
    """NIC k of every server plugs into a leaf of rail k (``leaf_ports`` servers per
    leaf); spines join all leaves. Same-rail traffic between servers of one leaf
    block crosses a single switch."""
    rails: dict[int, list[str]] = {}
    leaves: dict[tuple[int, int], str] = {}
    for server, k, nic in nics:
        key = (k, server // fabric.leaf_ports)
        if key not in leaves:
            leaves[key] = _switch(graph, f"rail{k}.leaf{key[1]}", 1)
            rails.setdefault(k, []).append(leaves[key])
        link(graph, nic, leaves[key], wire, "network")
    all_leaves = list(leaves.values())
    if len(all_leaves) > 1:
        spines = max(1, math.ceil(fabric.leaf_ports / fabric.oversubscription))
        _spines_over(graph, all_leaves, spines, "spine", 2, wire)
    graph.graph["rail_aligned"] = True


def dragonfly_links(groups: int, group_routers: int, global_links: int) -> list[tuple]:
    """Global links ((group, router), (group, router)) spreading each group's
    ``group_routers * global_links`` ports evenly over the other groups.

    >>> dragonfly_links(3, 2, 1)
    [((0, 0), (1, 0)), ((0, 1), (2, 0)), ((1, 1), (2, 1))]
    """
    if groups < 2:
        return []
    per_pair = max(1, group_routers * global_links // (groups - 1))
    used = [0] * groups
    links = []
    for a in range(groups):
        for b in range(a + 1, groups):
            for _ in range(per_pair):
                links.append(((a, used[a] % group_routers), (b, used[b] % group_routers)))
                used[a] += 1
                used[b] += 1
    return links


def dragonfly(graph: nx.DiGraph, nics: Sequence[Nic], fabric: FabricSpec, wire: Wire) -> None:
    """Servers attach to routers (``router_nodes`` each); the routers of a group are
    joined all-to-all; groups are joined by global links (Kim et al., ISCA 2008)."""
    servers = {server: i for i, server in enumerate(sorted({s for s, _, _ in nics}))}
    routers_n = max(1, math.ceil(len(servers) / fabric.router_nodes))
    groups = math.ceil(routers_n / fabric.group_routers)
    sizes = [min(fabric.group_routers, routers_n - g * fabric.group_routers)
             for g in range(groups)]

    def router(g: int, r: int) -> str:
        return f"group{g}.router{r % sizes[g]}"

    for i in range(routers_n):
        _switch(graph, router(i // fabric.group_routers, i % fabric.group_routers), 1)
    for server, _, nic in nics:
        i = servers[server] // fabric.router_nodes
        link(graph, nic, router(i // fabric.group_routers, i % fabric.group_routers), wire,
             "network")
    for g, size in enumerate(sizes):
        for x in range(size):
            for y in range(x + 1, size):
                link(graph, router(g, x), router(g, y), wire, "network")
    for (ga, ra), (gb, rb) in dragonfly_links(groups, fabric.group_routers, fabric.global_links):
        link(graph, router(ga, ra), router(gb, rb), wire, "network")


BUILDERS = {
    FabricKind.FAT_TREE: fat_tree,
    FabricKind.FAT_TREE_3: fat_tree_3,
    FabricKind.RAIL: rail_optimized,
    FabricKind.DRAGONFLY: dragonfly,
}
