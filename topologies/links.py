"""Wiring helpers the builders share: GPU and NIC names, link figures, full-duplex
links, switches."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

Nic = tuple[int, int, str]  # (server, index in server, node name)


def gpu_name(node: int, local: int) -> str:
    return f"n{node}.gpu{local}"


def nic_name(node: int, local: int) -> str:
    return f"n{node}.nic{local}"


def tray_of(data: dict) -> int:
    """The server (tray) of a GPU or NIC node's attributes: its ``tray`` in a
    rack-scale NVLink domain (``topologies.nvlink_domain``), else its ``node``."""
    return int(data.get("tray", data["node"]))


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


def switch(graph: nx.DiGraph, name: str, level: int) -> str:
    graph.add_node(name, kind="switch", level=level)
    return name


def spines_over(graph: nx.DiGraph, leaves: Sequence[str], count: int, prefix: str,
                level: int, wire: Wire) -> list[str]:
    """``count`` switches at ``level``, each linked to every one of ``leaves``."""
    spines = [switch(graph, f"{prefix}{i}", level) for i in range(count)]
    for spine in spines:
        for leaf in leaves:
            link(graph, leaf, spine, wire, "network")
    return spines
