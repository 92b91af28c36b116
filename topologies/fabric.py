"""NetworkX builders for cluster fabrics.

A fabric is a ``networkx.DiGraph``. Nodes carry ``kind`` (``gpu``, ``nvswitch``,
``nic``, ``switch``); GPUs, NVSwitches and NICs carry ``node`` (the server
index) and ``local`` (index inside the server); a GPU carries ``nic``, the name
of the NIC it uses for inter-node traffic (its PCIe affinity). Every physical
link is two directed edges, each with ``bandwidth`` (bytes/s in that direction),
``latency`` (seconds) and ``link`` (``nvlink``, ``pcie``, ``network``).

``graph.graph["gpus"]`` lists the GPU names in placement order (server-major),
so rank ``r`` of a job runs on ``graph.graph["gpus"][r]``.
"""

from __future__ import annotations

import math

import networkx as nx

from topologies.clusters import ClusterSpec, IntraNode


def gpu_name(node: int, local: int) -> str:
    return f"n{node}.gpu{local}"


def nic_name(node: int, local: int) -> str:
    return f"n{node}.nic{local}"


def _link(graph: nx.DiGraph, a: str, b: str, bandwidth: float, latency: float, kind: str) -> None:
    """Add one full-duplex link as two directed edges."""
    graph.add_edge(a, b, bandwidth=bandwidth, latency=latency, link=kind)
    graph.add_edge(b, a, bandwidth=bandwidth, latency=latency, link=kind)


def add_server(graph: nx.DiGraph, node: int, spec: ClusterSpec) -> None:
    """Add one server: its GPUs, NVLink (switch or mesh), NICs and PCIe links."""
    n = spec.gpus_per_node
    for g in range(n):
        nic = nic_name(node, g * spec.nics_per_node // n)
        graph.add_node(gpu_name(node, g), kind="gpu", node=node, local=g, nic=nic)
    if spec.intra_node is IntraNode.NVSWITCH:
        switch = f"n{node}.nvsw"
        graph.add_node(switch, kind="nvswitch", node=node, local=0)
        for g in range(n):
            _link(graph, gpu_name(node, g), switch, spec.nvlink_bandwidth, spec.nvlink_latency,
                  "nvlink")
    elif n > 1:
        per_peer = spec.nvlink_bandwidth / (n - 1)
        for a in range(n):
            for b in range(a + 1, n):
                _link(graph, gpu_name(node, a), gpu_name(node, b), per_peer, spec.nvlink_latency,
                      "nvlink")
    for k in range(spec.nics_per_node):
        graph.add_node(nic_name(node, k), kind="nic", node=node, local=k)
    for g in range(n):
        name = gpu_name(node, g)
        _link(graph, name, graph.nodes[name]["nic"], spec.pcie_bandwidth, spec.pcie_latency,
              "pcie")


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


def add_fat_tree(graph: nx.DiGraph, nodes: int, spec: ClusterSpec) -> None:
    """Connect every NIC to a leaf switch, and every leaf to every spine.

    NIC ``k`` of server ``s`` takes leaf port ``s * nics_per_node + k``, so the
    servers fill leaves in order. Uplinks run at the NIC bandwidth, which makes
    ``oversubscription`` the ratio of a leaf's down- to up-link bandwidth.
    """
    leaves, spines = leaf_spine_shape(nodes * spec.nics_per_node, spec.leaf_ports,
                                      spec.oversubscription)
    for leaf in range(leaves):
        graph.add_node(f"leaf{leaf}", kind="switch", level=1)
    for spine in range(spines):
        graph.add_node(f"spine{spine}", kind="switch", level=2)
        for leaf in range(leaves):
            _link(graph, f"leaf{leaf}", f"spine{spine}", spec.nic_bandwidth, spec.link_latency,
                  "network")
    for node in range(nodes):
        for k in range(spec.nics_per_node):
            leaf = (node * spec.nics_per_node + k) // spec.leaf_ports
            _link(graph, nic_name(node, k), f"leaf{leaf}", spec.nic_bandwidth, spec.link_latency,
                  "network")


def build_cluster(spec: ClusterSpec, nodes: int) -> nx.DiGraph:
    """The fabric of ``nodes`` servers of ``spec`` joined by a leaf/spine fat tree."""
    graph = nx.DiGraph(name=f"{spec.name}x{nodes}", gpus_per_node=spec.gpus_per_node)
    for node in range(nodes):
        add_server(graph, node, spec)
    if nodes > 1:
        add_fat_tree(graph, nodes, spec)
    graph.graph["gpus"] = [gpu_name(node, g) for node in range(nodes)
                           for g in range(spec.gpus_per_node)]
    return graph
