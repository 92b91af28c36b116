"""A NetworkX fabric as arrays the network model can use, plus routing.

Edges become integer link ids with a capacity (bytes/s) and a latency (s).
Routes between GPUs follow the graph, as NCCL's transports do:

- same server: the shortest path inside the graph (GPU-NVSwitch-GPU, or the
  direct NVLink of a mesh);
- different servers: GPU -> its affinity NIC (node attribute ``nic``) -> switches
  -> the peer's affinity NIC -> peer GPU. Among equal-cost switch paths the
  choice is a deterministic ECMP hash (CRC-32 of the NIC pair), never Python's
  salted ``hash``.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass

import networkx as nx
import numpy as np


class FabricError(ValueError):
    """A graph that cannot carry a simulation; the message names the element."""


@dataclass(frozen=True)
class Route:
    links: tuple[int, ...]
    latency: float


class Fabric:
    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        self.index: dict[tuple[str, str], int] = {}
        capacity, latency = [], []
        for u, v, data in graph.edges(data=True):
            bw = data.get("bandwidth")
            if not isinstance(bw, (int, float)) or bw <= 0:
                raise FabricError(f"edge {u}->{v}: bandwidth {bw!r} must be a positive number")
            self.index[(u, v)] = len(capacity)
            capacity.append(float(bw))
            latency.append(float(data.get("latency", 0.0)))
        self.capacity = np.array(capacity)
        self.latency = np.array(latency)
        switches = [n for n, d in graph.nodes(data=True) if d.get("kind") == "switch"]
        self._switches = nx.DiGraph(graph.subgraph(switches))
        self._switch_paths: dict[tuple[str, str], list[list[str]]] = {}
        self._routes: dict[tuple[str, str], Route] = {}

    def node_of(self, gpu: str) -> int:
        return int(self.graph.nodes[gpu]["node"])

    def route(self, src: str, dst: str) -> Route:
        """The links (and summed latency) a transfer from GPU ``src`` to ``dst`` uses."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is None:
            if self.node_of(src) == self.node_of(dst):
                nodes = nx.shortest_path(self.graph, src, dst)
            else:
                nodes = self._inter_node(src, dst)
            links = tuple(self.index[(a, b)] for a, b in zip(nodes, nodes[1:], strict=False))
            cached = Route(links, float(self.latency[list(links)].sum()))
            self._routes[key] = cached
        return cached

    def _inter_node(self, src: str, dst: str) -> list[str]:
        src_nic, dst_nic = self.graph.nodes[src]["nic"], self.graph.nodes[dst]["nic"]
        up, down = self._leaf(src_nic), self._leaf(dst_nic)
        paths = self._paths_between(up, down)
        choice = zlib.crc32(f"{src_nic}>{dst_nic}".encode()) % len(paths)
        return [src, src_nic, *paths[choice], dst_nic, dst]

    def _leaf(self, nic: str) -> str:
        leaves = sorted(n for n in self.graph.successors(nic)
                        if self.graph.nodes[n].get("kind") == "switch")
        if not leaves:
            raise FabricError(f"NIC {nic} is not connected to any switch")
        return leaves[0]

    def _paths_between(self, a: str, b: str) -> list[list[str]]:
        key = (a, b)
        if key not in self._switch_paths:
            if a == b:
                paths = [[a]]
            else:
                try:
                    paths = sorted(nx.all_shortest_paths(self._switches, a, b))
                except nx.NetworkXNoPath:
                    raise FabricError(f"no switch path from {a} to {b}") from None
            self._switch_paths[key] = paths
        return self._switch_paths[key]
