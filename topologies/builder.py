"""NetworkX builders for cluster fabrics.

A fabric is a ``networkx.DiGraph``. Nodes carry ``kind`` (``gpu``, ``nvswitch``,
``nic``, ``switch``); GPUs, NVSwitches and NICs carry ``node`` (the server
index) and ``local`` (index inside the server); a GPU carries ``nic``, the name
of the NIC it uses for inter-node traffic (its PCIe affinity); an NVSwitch
carries ``nvls`` and ``nvls_efficiency``. Every physical link is two directed
edges, each with ``bandwidth`` (line rate in bytes/s in that direction),
``efficiency`` (the share of it NCCL reaches), ``latency`` (seconds) and ``link``
(``nvlink``, ``pcie``, ``network``).

``graph.graph["gpus"]`` lists the GPU names in placement order (server-major),
so rank ``r`` of a job runs on ``graph.graph["gpus"][r]``. Servers that share a
rack-scale NVLink domain (``nvlink_domain``) are built by
``topologies.nvlink_domain``: there ``node`` is the domain, ``tray`` the server.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import networkx as nx

from topologies.clusters import CLUSTERS, ClusterSpec, IntraNode
from topologies.links import Wire, gpu_name, link, nic_name
from topologies.networks import NETWORKS
from topologies.nvlink_domain import add_domains


def add_server(graph: nx.DiGraph, node: int, spec: ClusterSpec) -> None:
    """Add one server: its GPUs, NVLink (switch or mesh), NICs and PCIe links."""
    n = spec.gpus_per_node
    for g in range(n):
        nic = nic_name(node, g * spec.nics_per_node // n)
        graph.add_node(gpu_name(node, g), kind="gpu", node=node, local=g, nic=nic)
    if spec.intra_node is IntraNode.NVSWITCH:
        switch = f"n{node}.nvsw"
        graph.add_node(switch, kind="nvswitch", node=node, local=0, nvls=spec.nvls,
                       nvls_efficiency=spec.nvls_efficiency)
        nvlink = Wire(spec.nvlink_bandwidth, spec.nvlink_latency, spec.nvlink_efficiency)
        for g in range(n):
            link(graph, gpu_name(node, g), switch, nvlink, "nvlink")
    elif n > 1:
        per_peer = Wire(spec.nvlink_bandwidth / (n - 1), spec.nvlink_latency,
                        spec.nvlink_efficiency)
        for a in range(n):
            for b in range(a + 1, n):
                link(graph, gpu_name(node, a), gpu_name(node, b), per_peer, "nvlink")
    for k in range(spec.nics_per_node):
        graph.add_node(nic_name(node, k), kind="nic", node=node, local=k)
    pcie = Wire(spec.pcie_bandwidth, spec.pcie_latency, 1.0)
    for g in range(n):
        name = gpu_name(node, g)
        link(graph, name, graph.nodes[name]["nic"], pcie, "pcie")


def with_overrides(spec: ClusterSpec | str, **overrides: Any) -> ClusterSpec:
    """``spec`` (or the preset of that name) with cluster or network fields replaced;
    ``fabric`` may name another network kind (``topologies.networks.NETWORKS``).

    >>> with_overrides("dgx-a100", nics_per_node=4, fabric="dragonfly").fabric.name
    'dragonfly'
    """
    base = CLUSTERS[spec] if isinstance(spec, str) else spec
    fabric = base.fabric
    if "fabric" in overrides:
        kind = NETWORKS[overrides.pop("fabric")]
        fabric = fabric if isinstance(fabric, kind) else kind()
    own = {f.name for f in dataclasses.fields(fabric)}
    network = {k: overrides.pop(k) for k in list(overrides) if k in own}
    for key in list(overrides):
        if key not in {f.name for f in dataclasses.fields(ClusterSpec)}:
            raise TypeError(f"{key!r} is neither a cluster field nor a setting of the "
                             f"{fabric.name} network ({', '.join(sorted(own)) or 'none'})")
    return dataclasses.replace(base, fabric=dataclasses.replace(fabric, **network), **overrides)


def build_cluster(spec: ClusterSpec | str, nodes: int, **overrides: Any) -> nx.DiGraph:
    """The fabric of ``nodes`` servers of ``spec`` (a ClusterSpec or a preset name)
    joined by its inter-node network; keyword arguments override any cluster or
    fabric field, e.g. ``build_cluster("dgx-a100", 64, fabric="fat_tree_3",
    oversubscription=2.0, nic_bandwidth=50e9)``."""
    if isinstance(spec, str) or overrides:
        spec = with_overrides(spec, **overrides)
    whole = spec.fabric.whole_graph()
    if whole is not None:  # a kind that reads the whole cluster from a file
        return whole
    problem = spec.domain_problem()
    if problem:
        raise ValueError(f"nvlink_domain {spec.domain}: {problem}")
    graph = nx.DiGraph(name=f"{spec.name}x{nodes}", gpus_per_node=spec.gpus_per_node,
                       nvlink_domain=spec.domain)
    if spec.domain == spec.gpus_per_node:
        for node in range(nodes):
            add_server(graph, node, spec)
        nics = [(node, k, nic_name(node, k)) for node in range(nodes)
                for k in range(spec.nics_per_node)]
    else:
        nics = add_domains(graph, nodes, spec)
    if len({graph.nodes[name]["node"] for _, _, name in nics}) > 1:
        wire = Wire(spec.nic_bandwidth, spec.link_latency, spec.nic_efficiency)
        spec.fabric.build(graph, nics, wire)
    graph.graph["routing"] = spec.fabric.routing  # the kind answers routes on its graph
    graph.graph["ecmp"] = (spec.ecmp, spec.ecmp_seed)  # how it picks among equal paths
    graph.graph["sharp"] = spec.sharp  # in-network reduction (simulator.collectives.collnet)
    graph.graph["gpus"] = [gpu_name(node, g) for node in range(nodes)
                           for g in range(spec.gpus_per_node)]
    return graph
