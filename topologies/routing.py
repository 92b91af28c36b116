"""Routes between GPUs, as a fabric kind answers them (nodes, not links).

The default, used by every network kind unless its module names another:

- same server: the shortest path inside the graph (GPU-NVSwitch-GPU, or the
  direct NVLink of a mesh);
- different servers: GPU -> its affinity NIC (node attribute ``nic``) -> switches
  -> the peer's affinity NIC -> peer GPU. Among equal-cost switch paths the
  choice is destination-mod-k: path ``d mod k`` for the destination NIC's
  index d, as InfiniBand's fat-tree routing (OpenSM ``ftree``, D-mod-K) does.
  It is deterministic and spreads permutation traffic such as NCCL's rings
  over distinct uplinks, where a random hash would collide. With the
  cluster's ``ecmp: hash`` (Ethernet / RoCE fabrics, whose switches hash
  each flow's header to a path) the choice is a seeded hash of the (source
  NIC, destination NIC) pair instead: flows collide on some uplinks and leave
  others idle, as measured on such fabrics (one flow per GPU pair: NCCL's
  several queue pairs per connection, which hash apart, are not modelled).

A network kind with other rules subclasses ``Routing`` in its own module (the
rail-optimized fabric's PXN) and sets it as its spec's ``routing``;
``build_cluster`` records it on the graph (``graph.graph["routing"]``).
"""

from __future__ import annotations

import zlib
from typing import ClassVar

import networkx as nx
import numpy as np


class RoutingError(ValueError):
    """A graph on which some GPUs cannot reach each other; the message names the element."""


class Routing:
    """Destination-mod-k routing over the switches (the default)."""

    proxies_through_peers: ClassVar[bool] = False  # may traffic cross other GPUs' NVLink?

    def __init__(self, graph: nx.DiGraph) -> None:
        self.graph = graph
        switches = [n for n, d in graph.nodes(data=True) if d.get("kind") == "switch"]
        self._switch_names = switches
        self._switch_index = {n: i for i, n in enumerate(switches)}
        self._adjacency = np.zeros((len(switches), len(switches)), dtype=bool)
        for a, b in graph.subgraph(switches).edges():
            self._adjacency[self._switch_index[a], self._switch_index[b]] = True
        self._switch_paths: dict[tuple[str, str], list[list[str]]] = {}
        self._hops: dict[str, np.ndarray] = {}  # source switch -> hops to every switch
        self._leaves: dict[str, str] = {}  # NIC -> its switch
        nics = [n for n, d in graph.nodes(data=True) if d.get("kind") == "nic"]
        self._nic_index = {n: i for i, n in enumerate(nics)}  # the NIC's ordinal
        self._ecmp = graph.graph.get("ecmp", ("d-mod-k", 0))  # (rule, seed): ``pick``
        self.server_gpus: dict[int, list[str]] = {}
        self._nvswitch: dict[str, set[str]] = {}  # GPU -> the NVSwitches it links both ways
        for name, data in graph.nodes(data=True):
            if data.get("kind") == "gpu":
                self.server_gpus.setdefault(int(data["node"]), []).append(name)
                self._nvswitch[name] = {n for n in graph.successors(name) if graph.nodes[n].get(
                    "kind") == "nvswitch" and graph.has_edge(n, name)}

    def path(self, src: str, dst: str) -> list[str]:
        """The nodes a transfer from GPU ``src`` to GPU ``dst`` crosses, both included."""
        nodes = self.graph.nodes
        if nodes[src]["node"] == nodes[dst]["node"]:
            return self.inside(src, dst)
        dst_nic = nodes[dst]["nic"]
        head = self.head(src, dst_nic)
        src_nic = nodes[head[-1]]["nic"]
        paths = self._paths_between(self.leaf(src_nic), self.leaf(dst_nic))
        return [*head, src_nic, *paths[self.pick(src_nic, dst_nic, len(paths))], dst_nic, dst]

    def inside(self, src: str, dst: str) -> list[str]:
        """A path between two GPUs of one server or NVLink domain: through the
        NVSwitch both link to (a rack has 72 GPUs on one, so every pair of an
        expert-parallel group needs one: no graph search), else the shortest path."""
        shared = self._nvswitch.get(src, set()) & self._nvswitch.get(dst, set())
        if shared and src != dst:
            return [src, min(shared), dst]
        return nx.shortest_path(self.graph, src, dst)

    def pick(self, src_nic: str, dst_nic: str, count: int) -> int:
        """Which of ``count`` equal-cost switch paths the pair's traffic takes."""
        rule, seed = self._ecmp
        if rule == "hash" and count > 1:
            return zlib.crc32(f"{seed}|{src_nic}|{dst_nic}".encode()) % count
        return self._nic_index[dst_nic] % count

    def head(self, src: str, dst_nic: str) -> list[str]:
        """The GPUs the data crosses on its own server before a NIC: ``src`` alone."""
        return [src]

    def aggregation_root(self, leaves: list[str], index: int) -> str:
        """The switch an in-network reduction over ``leaves`` meets at: one that
        all reach in the fewest hops (the tops of a fat tree), the ``index``-th
        of those, so that trees of different shards spread over the spines."""
        hops = np.array([self._hops_from(leaf) for leaf in leaves])
        worst = np.where((hops >= 0).all(axis=0), hops.max(axis=0), np.iinfo(np.int64).max)
        if worst.min() == np.iinfo(np.int64).max:
            raise RoutingError(f"no switch joins the leaves {', '.join(leaves)}")
        tops = np.flatnonzero(worst == worst.min())
        return self._switch_names[int(tops[index % len(tops)])]

    def switch_path(self, a: str, b: str, index: int) -> list[str]:
        """The ``index``-th (mod their number) shortest switch path from ``a`` to ``b``."""
        paths = self._paths_between(a, b)
        return paths[index % len(paths)]

    def _hops_from(self, switch: str) -> np.ndarray:
        hops = self._hops.get(switch)
        if hops is None:
            hops = self._hops[switch] = self._levels(self._switch_index[switch])
        return hops

    def leaf(self, nic: str) -> str:
        """The switch ``nic`` attaches to (the first by name; cached)."""
        if nic not in self._leaves:
            leaves = sorted(n for n in self.graph.successors(nic)
                            if self.graph.nodes[n].get("kind") == "switch")
            if not leaves:
                raise RoutingError(f"NIC {nic} is not connected to any switch")
            self._leaves[nic] = leaves[0]
        return self._leaves[nic]

    def _paths_between(self, a: str, b: str) -> list[list[str]]:
        key = (a, b)
        if key not in self._switch_paths:
            if a == b:
                paths = [[a]]
            else:
                paths = sorted(shortest_paths(self._predecessors(a, b), a, b))
                if not paths:
                    raise RoutingError(f"no switch path from {a} to {b}")
            self._switch_paths[key] = paths
        return self._switch_paths[key]

    def _predecessors(self, source: str, target: str) -> dict[str, list[str]]:
        """The predecessors, on shortest paths from ``source``, of the switches on
        shortest paths to ``target`` (what ``shortest_paths`` walks): one
        breadth-first search per source switch, by levels over the switches'
        adjacency matrix, shared by all its destinations."""
        hops = self._hops_from(source)
        names, adjacency = self._switch_names, self._adjacency
        end = self._switch_index[target]
        if hops[end] < 0:
            return {}
        out: dict[str, list[str]] = {}
        stack = [end]
        while stack:
            v = stack.pop()
            if names[v] in out:
                continue
            before = [] if hops[v] == 0 else np.flatnonzero(
                adjacency[:, v] & (hops == hops[v] - 1)).tolist()
            out[names[v]] = [names[u] for u in before]
            stack.extend(before)
        return out

    def _levels(self, source: int) -> np.ndarray:
        """Hops from switch ``source`` to every switch (-1: unreachable)."""
        hops = np.full(len(self._switch_names), -1, dtype=np.int64)
        hops[source] = 0
        frontier, level = np.zeros(len(hops), dtype=bool), 0
        frontier[source] = True
        while frontier.any():
            level += 1
            frontier = self._adjacency[frontier].any(axis=0) & (hops < 0)
            hops[frontier] = level
        return hops


def shortest_paths(predecessors: dict[str, list[str]], source: str, target: str
                   ) -> list[list[str]]:
    """Every shortest path from ``source`` to ``target`` given a breadth-first
    search's predecessor lists (``networkx.predecessor``); [] if unreachable.

    >>> shortest_paths({"a": [], "x": ["a"], "y": ["a"], "b": ["x", "y"]}, "a", "b")
    [['a', 'x', 'b'], ['a', 'y', 'b']]
    """
    if target not in predecessors:
        return []
    paths, stack = [], [[target]]
    while stack:
        partial = stack.pop()
        head = partial[-1]
        if head == source:
            paths.append(partial[::-1])
        else:
            stack.extend([*partial, p] for p in reversed(predecessors[head]))
    return paths
