"""Dragonfly: routers in all-to-all groups joined by global links (Kim et al., ISCA 2008)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from simulator.base.fields import integer, setting
from topologies.links import Nic, Wire, link, switch
from topologies.networks.base import NetworkSpec


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


@dataclass(frozen=True)
class Dragonfly(NetworkSpec):
    """Servers attach to routers (``router_nodes`` each); the routers of a group are
    joined all-to-all; groups are joined by global links."""

    name = "dragonfly"
    router_nodes: int = setting(integer(1), 8)  # servers per router
    group_routers: int = setting(integer(1), 8)  # routers per group
    global_links: int = setting(integer(1), 8)  # global links per router

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        servers = {server: i for i, server in enumerate(sorted({s for s, _, _ in nics}))}
        routers_n = max(1, math.ceil(len(servers) / self.router_nodes))
        groups = math.ceil(routers_n / self.group_routers)
        sizes = [min(self.group_routers, routers_n - g * self.group_routers)
                 for g in range(groups)]

        def router(g: int, r: int) -> str:
            return f"group{g}.router{r % sizes[g]}"

        for i in range(routers_n):
            switch(graph, router(i // self.group_routers, i % self.group_routers), 1)
        for server, _, nic in nics:
            i = servers[server] // self.router_nodes
            link(graph, nic, router(i // self.group_routers, i % self.group_routers), wire,
                 "network")
        for g, size in enumerate(sizes):
            for x in range(size):
                for y in range(x + 1, size):
                    link(graph, router(g, x), router(g, y), wire, "network")
        for (ga, ra), (gb, rb) in dragonfly_links(groups, self.group_routers,
                                                  self.global_links):
            link(graph, router(ga, ra), router(gb, rb), wire, "network")
