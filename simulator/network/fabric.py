"""A NetworkX fabric as arrays the network model can use, with its routes.

Edges become integer link ids with a capacity (bytes/s: line rate times the
edge's ``efficiency``) and a latency (s). Routes are the network kind's own
(``topologies.routing``: the graph records which routing its kind uses), turned
into link ids here and cached per pair; each route also has a transport class
(NVLink, PCI or network) for NCCL's latency tables.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx
import numpy as np

from simulator.base.ir import Symbol
from topologies.links import tray_of
from topologies.routing import Routing, RoutingError


class Transport(Symbol):
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
    """``graph``'s links as arrays, with its routes. ``later``: the fabric as it will
    be after changes during the run (parts failing or recovering), whose links
    get ids too, with no capacity until ``after`` gives that fabric."""

    def __init__(self, graph: nx.DiGraph, later: Sequence[nx.DiGraph] = ()) -> None:
        self.graph = graph
        self.index: dict[tuple[str, str], int] = {}
        latency, kinds = [], []
        for g in (graph, *later):
            for u, v, data in g.edges(data=True):
                if (u, v) in self.index:
                    continue
                bw = data.get("bandwidth")
                if not isinstance(bw, (int, float)) or bw <= 0:
                    raise FabricError(f"edge {u}->{v}: bandwidth {bw!r} must be a positive "
                                      "number")
                self.index[(u, v)] = len(latency)
                latency.append(float(data.get("latency", 0.0)))
                kinds.append(data.get("link", "network"))
        self.capacity = self._capacity(graph)
        self.latency = np.array(latency)
        self._latency = latency  # (the same as a list: a route's few links sum faster)
        self._link_kind = kinds
        self._ends = list(self.index)  # per link id: (from, to)
        self._routes: dict[tuple[str, str], Route] = {}
        # the network kind's own routing (build_cluster records it; files: the default)
        self.routing: Routing = graph.graph.get("routing", Routing)(graph)

    def _capacity(self, graph: nx.DiGraph) -> np.ndarray:
        """Per link: bytes/s in ``graph`` (line rate times efficiency), 0 if absent."""
        capacity = np.zeros(len(self.index))
        for u, v, data in graph.edges(data=True):
            capacity[self.index[(u, v)]] = float(data["bandwidth"]) * float(
                data.get("efficiency", 1.0))
        return capacity

    def after(self, graph: nx.DiGraph) -> Fabric:
        """This fabric as ``graph`` (one of ``later``) has it: the same link ids, that
        graph's capacities (0 for links it lacks) and routes over its parts."""
        out = copy.copy(self)
        out.graph, out.capacity, out._routes = graph, self._capacity(graph), {}
        out.routing = graph.graph.get("routing", Routing)(graph)
        return out

    def ends(self, link: int) -> tuple[str, str]:
        """The parts a link joins (from, to)."""
        return self._ends[link]

    def reroute(self, links: Sequence[int]) -> tuple[int, ...]:
        """The links from the first link's start to the last one's end in this
        fabric (a flow whose route lost a part takes this one instead)."""
        src, dst = self._ends[links[0]][0], self._ends[links[-1]][1]
        nodes = self.graph.nodes
        if nodes[src].get("kind") == "gpu" and nodes[dst].get("kind") == "gpu":
            return self.route(src, dst).links
        try:
            path = nx.shortest_path(self.graph, src, dst)
        except (nx.NetworkXNoPath, nx.NodeNotFound):
            raise FabricError(f"no route is left from {src} to {dst}") from None
        return tuple(self.index[hop] for hop in zip(path, path[1:], strict=False))

    @property
    def proxies_through_peers(self) -> bool:
        """Whether inter-server traffic may first cross another GPU's NVLink (PXN)."""
        return self.routing.proxies_through_peers

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
        """The GPU's server as NCCL sees it: its NVLink domain."""
        return int(self.graph.nodes[gpu]["node"])

    def tray_of(self, gpu: str) -> int:
        """The GPU's server as ``cluster.nodes`` counts them (a tray of a rack-scale
        NVLink domain; otherwise ``node_of``)."""
        return tray_of(self.graph.nodes[gpu])

    def nvswitch(self, node: int) -> str | None:
        """The NVSwitch of server ``node`` that offers NVLS, if there is one."""
        name = next((n for n in self.graph.successors(self.routing.server_gpus[node][0])
                     if self.graph.nodes[n].get("kind") == "nvswitch"), None)
        return name if name and self.graph.nodes[name].get("nvls") else None

    def link(self, u: str, v: str) -> int:
        return self.index[(u, v)]

    def route(self, src: str, dst: str) -> Route:
        """The links (and summed latency) a transfer from GPU ``src`` to ``dst`` uses."""
        key = (src, dst)
        cached = self._routes.get(key)
        if cached is None:
            try:
                nodes = self.routing.path(src, dst)
            except RoutingError as error:
                raise FabricError(str(error)) from None
            hops = list(zip(nodes, nodes[1:], strict=False))
            missing = next((hop for hop in hops if hop not in self.index), None)
            if missing:
                raise FabricError(f"the route {src} -> {dst} needs the link {missing[0]} -> "
                                  f"{missing[1]}, which the fabric does not have")
            links = tuple(self.index[hop] for hop in hops)
            latency = (sum((self._latency[i] for i in links), 0.0) if len(links) < 8  # numpy's
                       else float(self.latency[list(links)].sum()))  # pairwise sum adds them
            cached = Route(links, latency, self._transport(links))
            self._routes[key] = cached
        return cached

    def _transport(self, links: tuple[int, ...]) -> Transport:
        kinds = {self._link_kind[i] for i in links}
        if "network" in kinds:
            return Transport.NET
        return Transport.NVLINK if kinds == {"nvlink"} else Transport.PCI
