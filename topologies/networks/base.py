"""What every inter-node network kind provides: its settings, a builder, a routing.

A kind is a frozen dataclass whose fields are its parameters, each declared
with ``setting(check, default)`` so that a scenario's ``cluster.fabric``
section is checked by the kind itself; ``build`` adds its switches and links
to a graph that already holds the servers; ``routing`` answers routes on the
result (``topologies.routing.Routing`` unless the kind needs its own).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import networkx as nx

from simulator.base.fields import integer, number, setting
from topologies.links import Nic, Wire
from topologies.routing import Routing

# Settings several kinds share (one definition, so their checks agree).
LEAF_PORTS = (integer(1), 32)  # NIC ports per leaf switch
OVERSUBSCRIPTION = (number(1.0, 64.0), 1.0)  # a switch level's down : up bandwidth


def leaf_ports_setting() -> int:
    return setting(*LEAF_PORTS)


def oversubscription_setting() -> float:
    return setting(*OVERSUBSCRIPTION)


@dataclass(frozen=True)
class NetworkSpec:
    """Parameters of one inter-node network kind (subclasses add their settings)."""

    name: ClassVar[str] = ""
    routing: ClassVar[type[Routing]] = Routing

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        """Add the switches and ``network`` links joining ``nics`` (placement order)."""
        raise NotImplementedError

    def whole_graph(self, base_dir: Path | None = None) -> nx.DiGraph | None:
        """The whole cluster's graph when the kind reads it from a file, else None."""
        return None
