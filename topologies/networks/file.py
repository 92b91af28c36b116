"""A whole cluster read from a file (GraphML or a YAML edge list; ``graph_file``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import networkx as nx

from simulator.base.fields import setting, text
from simulator.base.user_files import user_path
from topologies.graph_file import load_graph
from topologies.links import Nic, Wire
from topologies.networks.base import NetworkSpec


@dataclass(frozen=True)
class FileNetwork(NetworkSpec):
    name = "file"
    path: str = setting(text, "", required=True)  # GraphML (.graphml) or YAML edge list

    def build(self, graph: nx.DiGraph, nics: Sequence[Nic], wire: Wire) -> None:
        raise ValueError("a file fabric is read whole: use FileNetwork.whole_graph")

    def whole_graph(self, base_dir: Path | None = None) -> nx.DiGraph:
        """The file's graph; a relative path is taken from ``base_dir``."""
        return load_graph(user_path(self.path, base_dir))
