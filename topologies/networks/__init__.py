"""Inter-node network kinds, one module each (``fat_tree``, ``fat_tree_3``,
``rail_optimized``, ``dragonfly``, ``file``; what every kind provides:
``base``); ``NETWORKS`` is the registry.

Adding a kind = one module with a ``NetworkSpec`` subclass (settings, ``build``,
and a ``routing`` if the default does not fit) + one line below.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType

from topologies.networks.base import NetworkSpec
from topologies.networks.dragonfly import Dragonfly
from topologies.networks.fat_tree import FatTree
from topologies.networks.fat_tree_3 import FatTree3
from topologies.networks.file import FileNetwork
from topologies.networks.rail_optimized import RailOptimized

NETWORKS: Mapping[str, type[NetworkSpec]] = MappingProxyType({
    FatTree.name: FatTree,  # two levels: leaves and spines
    FatTree3.name: FatTree3,  # three levels: leaves, pod aggregation, core
    RailOptimized.name: RailOptimized,  # NIC k of every server on rail k; PXN routing
    Dragonfly.name: Dragonfly,  # all-to-all router groups joined by global links
    FileNetwork.name: FileNetwork,  # the whole graph read from GraphML or YAML
})

__all__ = ["NETWORKS", "NetworkSpec"]
