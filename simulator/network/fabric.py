"""A NetworkX fabric as arrays the network model can use, plus routing.

Edges become integer link ids with a capacity (bytes/s: line rate times the
edge's ``efficiency``) and a latency (s). Routes between GPUs follow the
graph, as NCCL's transports do:

- same server: the shortest path inside the graph (GPU-NVSwitch-GPU, or the
  direct NVLink of a mesh);
- different servers: GPU -> its affinity NIC (node attribute ``nic``) -> switches
  -> the peer's affinity NIC -> peer GPU. On a rail-optimized fabric the data
  first crosses NVLink to the local GPU whose NIC is on the destination's rail
  (NCCL's PXN), so it stays on one rail. Among equal-cost switch paths the
  choice is destination-mod-k: path ``d mod k`` for the destination NIC's
  index d, as InfiniBand's fat-tree routing (OpenSM ``ftree``, D-mod-K) does.
  It is deterministic and spreads permutation traffic such as NCCL's rings
  over distinct uplinks, where a random hash would collide.

Each route also has a transport class (NVLink, PCI or network) for NCCL's
latency tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import networkx as nx
import numpy as np


class Transport(Enum):
    """How a route's bytes move, as NCCL's latency tables distinguish them."""

    NVLINK = "nvlink"
    PCI = "pci"
    NET = "net"


class FabricError(ValueError):
    """A graph that cannot carry a simulation; the message names the element."""


@dataclass(frozen=True)
class Route:
    links: tuple[int, ...]
    latency: float
    transport: Transport


class Fabric:
    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        self.index: dict[tuple[str, str], int] = {}
        capacity, latency, kinds = [], [], []
        for u, v, data in graph.edges(data=True):
            bw = data.get("bandwidth")
            if not isinstance(bw, (int, float)) or bw <= 0:
                raise FabricError(f"edge {u}->{v}: bandwidth {bw!r} must be a positive number")
            self.index[(u, v)] = len(capacity)
            capacity.append(float(bw) * float(data.get("efficiency", 1.0)))
            latency.append(float(data.get("latency", 0.0)))
            kinds.append(data.get("link", "network"))
        self.capacity = np.array(capacity)
        self.latency = np.array(latency)
        self._link_kind = kinds
        switches = [n for n, d in graph.nodes(data=True) if d.get("kind") == "switch"]
        self._switches = nx.DiGraph(graph.subgraph(switches))
        self._switch_paths: dict[tuple[str, str], list[list[str]]] = {}
        self._routes: dict[tuple[str, str], Route] = {}
        self._rail_aligned = bool(graph.graph.get("rail_aligned"))
        self._nic_index = {n: i for i, (n, d) in enumerate(graph.nodes(data=True))
                           if d.get("kind") == "nic"}
        self._server_gpus: dict[int, list[str]] = {}
        for name, data in graph.nodes(data=True):
            if data.get("kind") == "gpu":
                self._server_gpus.setdefault(int(data["node"]), []).append(name)

    @property
    def proxies_through_peers(self) -> bool:
        """Whether inter-server traffic may first cross another GPU's NVLink (PXN)."""
        return self._rail_aligned

    def link_classes(self) -> tuple[np.ndarray, np.ndarray]:
        """Per link: the server it leaves (-1 for switch links) and its class:
        1 for NVLink out of a GPU, 2 for a NIC's link into the network, 0 else
        (so each byte is counted once per server and class)."""
        server = np.full(len(self.capacity), -1)
        kind = np.zeros(len(self.capacity), dtype=np.int8)
        nodes = self.graph.nodes
        for (u, v), i in self.index.items():
            source, target = nodes[u].get("kind"), nodes[v].get("kind")
            if source == "gpu" and self._link_kind[i] == "nvlink":
                server[i], kind[i] = int(nodes[u]["node"]), 1
            elif source == "nic" and target == "switch":
                server[i], kind[i] = int(nodes[u]["node"]), 2
        return server, kind

    def node_of(self, gpu: str) -> int:
        return int(self.graph.nodes[gpu]["node"])

    def nvswitch(self, node: int) -> str | None:
        """The NVSwitch of server ``node`` that offers NVLS, if there is one."""
        name = next((n for n in self.graph.successors(self._server_gpus[node][0])
                     if self.graph.nodes[n].get("kind") == "nvswitch"), None)
        return name if name and self.graph.nodes[name].get("nvls") else None

    def link(self, u: str, v: str) -> int:
        return self.index[(u, v)]

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
            cached = Route(links, float(self.latency[list(links)].sum()), self._transport(links))
            self._routes[key] = cached
        return cached

    def _transport(self, links: tuple[int, ...]) -> Transport:
        kinds = {self._link_kind[i] for i in links}
        if "network" in kinds:
            return Transport.NET
        return Transport.NVLINK if kinds == {"nvlink"} else Transport.PCI

    def _inter_node(self, src: str, dst: str) -> list[str]:
        dst_nic = self.graph.nodes[dst]["nic"]
        head = [src]
        if self._rail_aligned:
            proxy = self._rail_proxy(src, self.graph.nodes[dst_nic]["local"])
            head = nx.shortest_path(self.graph, src, proxy) if proxy != src else [src]
        src_nic = self.graph.nodes[head[-1]]["nic"]
        paths = self._paths_between(self._leaf(src_nic), self._leaf(dst_nic))
        choice = self._nic_index[dst_nic] % len(paths)
        return [*head, src_nic, *paths[choice], dst_nic, dst]

    def _rail_proxy(self, src: str, rail: int) -> str:
        """The GPU on ``src``'s server whose NIC is on ``rail`` (``src`` if none is)."""
        for gpu in self._server_gpus[self.node_of(src)]:
            if self.graph.nodes[self.graph.nodes[gpu]["nic"]]["local"] == rail:
                return gpu
        return src

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
