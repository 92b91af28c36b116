"""Rack-scale NVLink domains: servers (trays) whose GPUs share one NVLink fabric.

A GB200 or GB300 NVL72 rack joins 18 trays of 4 GPUs through NVLink switch
trays so that every GPU reaches every other at its full NVLink bandwidth; NCCL
then treats the whole domain as one node (multi-node NVLink: its rings, trees
and NVLS run over NVLink across trays, and only traffic between domains takes
the NICs). Built here as one non-blocking NVSwitch per domain of
``spec.domain`` consecutive GPUs (a last domain may be smaller); each GPU keeps
its own NIC in its tray.

Graph attributes, beside ``builder``'s: a GPU's and a NIC's ``node`` is its
NVLink domain (what collectives and routing call a server), ``tray`` its
server as ``cluster.nodes`` counts them (slow nodes, faults' NIC moves, job
placement; ``links.tray_of``), ``local`` its index in the tray (a NIC's rail).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import networkx as nx

from topologies.links import Nic, Wire, gpu_name, link, nic_name

if TYPE_CHECKING:
    from topologies.clusters import ClusterSpec


def domain_of(spec: ClusterSpec, tray: int, local: int) -> int:
    """The NVLink domain of GPU ``local`` of tray ``tray``.

    >>> from topologies.clusters import CLUSTERS
    >>> [domain_of(CLUSTERS["gb200-nvl72"], t, 0) for t in (0, 17, 18)]
    [0, 0, 1]
    """
    return (tray * spec.gpus_per_node + local) // spec.domain


def add_domains(graph: nx.DiGraph, trays: int, spec: ClusterSpec) -> list[Nic]:
    """Add ``trays`` trays of ``spec`` in NVLink domains; the NICs, as
    (tray, index in tray, name), for the scale-out network."""
    nvlink = Wire(spec.nvlink_bandwidth, spec.nvlink_latency, spec.nvlink_efficiency)
    pcie = Wire(spec.pcie_bandwidth, spec.pcie_latency, 1.0)
    nics: list[Nic] = []
    for tray in range(trays):
        for k in range(spec.gpus_per_node):
            domain = domain_of(spec, tray, k)
            switch = f"d{domain}.nvsw"
            if switch not in graph:
                graph.add_node(switch, kind="nvswitch", node=domain, local=0, nvls=spec.nvls,
                               nvls_efficiency=spec.nvls_efficiency)
            gpu, nic = gpu_name(tray, k), nic_name(tray, k)
            graph.add_node(gpu, kind="gpu", node=domain, tray=tray, local=k, nic=nic)
            graph.add_node(nic, kind="nic", node=domain, tray=tray, local=k)
            link(graph, gpu, switch, nvlink, "nvlink")
            link(graph, gpu, nic, pcie, "pcie")
            nics.append((tray, k, nic))
    return nics

