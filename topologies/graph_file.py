"""Fabrics read from a file: GraphML, or a YAML edge list.

YAML edge list::

    nodes:
      - {name: n0.gpu0, kind: gpu, node: 0, local: 0, nic: n0.nic0}
      - {name: n0.nvsw, kind: nvswitch, node: 0, nvls: false}
      - {name: n0.nic0, kind: nic, node: 0, local: 0}
      - {name: leaf0, kind: switch}
    links:                      # full duplex unless directed: true
      - {a: n0.gpu0, b: n0.nvsw, bandwidth: "300 GB/s", latency: "0.5 us", link: nvlink,
         efficiency: 0.78}

GraphML files use the same node and edge attribute names; an undirected GraphML
graph gets both directions of every edge. Bandwidths and latencies are unit
strings (``"200 Gb/s"``, ``"1 us"``) or plain SI numbers (bytes/s, seconds),
finite and not negative. Every problem (a YAML error, a key given twice, a node
declared twice, a value of the wrong type) raises ``GraphFileError`` naming the
element and the attribute.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import networkx as nx

from simulator.base.fields import ScenarioError
from simulator.base.units import UnitError, parse_bandwidth, parse_time
from simulator.base.user_files import read_yaml

KINDS = ("gpu", "nvswitch", "nic", "switch")
LINKS = ("nvlink", "pcie", "network")


class GraphFileError(ValueError):
    """A fabric file that cannot be used; the message names the element."""


def _quantity(where: str, value: Any, parse) -> float:
    """A unit string or a plain SI number, finite and not negative."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = float(value)
    else:
        try:
            number = parse(value)
        except UnitError as error:
            raise GraphFileError(f"{where}: {error}") from None
    if not math.isfinite(number) or number < 0:
        raise GraphFileError(f"{where}: {value!r} must be a finite, non-negative quantity")
    return number


def _edge_attributes(where: str, data: dict[str, Any]) -> dict[str, Any]:
    bandwidth = _quantity(f"{where}.bandwidth", data.get("bandwidth"), parse_bandwidth)
    if bandwidth <= 0:
        raise GraphFileError(f"{where}.bandwidth: {data.get('bandwidth')!r} must be positive")
    latency = _quantity(f"{where}.latency", data.get("latency", 0.0), parse_time)
    efficiency = data.get("efficiency", 1.0)
    if isinstance(efficiency, str):  # GraphML stores attributes as they were typed
        with contextlib.suppress(ValueError):
            efficiency = float(efficiency)
    if isinstance(efficiency, bool) or not isinstance(efficiency, (int, float)) or not (
            0 < efficiency <= 1):
        raise GraphFileError(f"{where}.efficiency: {efficiency!r} must be a number in (0, 1]")
    kind = data.get("link", "network")
    if kind not in LINKS:
        raise GraphFileError(f"{where}.link: {kind!r} is not one of: {', '.join(LINKS)}")
    return {"bandwidth": bandwidth, "latency": latency, "efficiency": efficiency, "link": kind}


def _from_yaml(path: Path) -> nx.DiGraph:
    try:
        raw = read_yaml(path, "fabric file")
    except ScenarioError as error:
        raise GraphFileError(str(error)) from None
    if not isinstance(raw, dict) or "nodes" not in raw or "links" not in raw:
        raise GraphFileError(f"{path}: needs the keys 'nodes' and 'links'")
    for key in ("nodes", "links"):
        if not isinstance(raw[key], list):
            raise GraphFileError(f"{path}: {key}: {raw[key]!r} must be a list")
    graph = nx.DiGraph()
    for i, node in enumerate(raw["nodes"]):
        if not isinstance(node, dict) or not isinstance(node.get("name"), str):
            raise GraphFileError(f"nodes[{i}]: needs a name (a string)")
        if node["name"] in graph:
            raise GraphFileError(f"nodes[{i}]: {node['name']!r} is declared twice")
        graph.add_node(node["name"], **{k: v for k, v in node.items() if k != "name"})
    for i, edge in enumerate(raw["links"]):
        where = f"links[{i}]"
        if not isinstance(edge, dict) or "a" not in edge or "b" not in edge:
            raise GraphFileError(f"{where}: needs a and b")
        for end in ("a", "b"):
            if not isinstance(edge[end], str) or edge[end] not in graph:
                raise GraphFileError(f"{where}.{end}: {edge[end]!r} is not a declared node")
        if not isinstance(edge.get("directed", False), bool):
            raise GraphFileError(f"{where}.directed: {edge['directed']!r} must be true or false")
        attributes = _edge_attributes(where, edge)
        graph.add_edge(edge["a"], edge["b"], **attributes)
        if not edge.get("directed", False):
            graph.add_edge(edge["b"], edge["a"], **attributes)
    return graph


def _from_graphml(path: Path) -> nx.DiGraph:
    try:
        loaded = nx.read_graphml(path)
    except Exception as error:  # networkx raises several parser types
        raise GraphFileError(f"{path}: not readable GraphML ({error})") from None
    graph = nx.DiGraph()
    graph.add_nodes_from(loaded.nodes(data=True))
    for u, v, data in loaded.edges(data=True):
        attributes = _edge_attributes(f"edge {u}-{v}", data)
        graph.add_edge(u, v, **attributes)
        if not loaded.is_directed():
            graph.add_edge(v, u, **attributes)
    return graph


def _check_nodes(graph: nx.DiGraph) -> list[str]:
    """Validate node attributes; return the GPUs in (server, local) order."""
    gpus = []
    for name, data in graph.nodes(data=True):
        kind = data.get("kind")
        if kind not in KINDS:
            raise GraphFileError(f"node {name}: kind {kind!r} is not one of: {', '.join(KINDS)}")
        if kind in ("gpu", "nvswitch", "nic"):
            for key in ("node", "local") if kind != "nvswitch" else ("node",):
                if not isinstance(data.get(key), int):
                    raise GraphFileError(f"node {name}: {key} must be an integer")
        if kind == "gpu":
            nic = data.get("nic")
            if "nic" in data and not isinstance(nic, str):
                raise GraphFileError(f"node {name}: nic {nic!r} must be the name of a NIC "
                                     "node (or leave the key out)")
            if nic is not None and not (graph.has_edge(name, nic) and graph.has_edge(nic, name)):
                raise GraphFileError(f"node {name}: nic {nic!r} is not linked to it both ways "
                                     "(a GPU sends and receives through its NIC)")
            gpus.append(name)
    if not gpus:
        raise GraphFileError("the fabric has no node of kind gpu")
    if len({graph.nodes[g]["node"] for g in gpus}) > 1:  # traffic between servers
        for gpu in gpus:
            if graph.nodes[gpu].get("nic") is None:
                raise GraphFileError(f"node {gpu}: needs a nic: with several servers, its "
                                     "traffic to the others leaves through one")
    return sorted(gpus, key=lambda g: (graph.nodes[g]["node"], graph.nodes[g]["local"]))


def load_graph(path: str | Path) -> nx.DiGraph:
    """Read a fabric file; the result is like ``build_cluster``'s."""
    file = Path(path)
    if not file.is_file():
        raise GraphFileError(f"{path}: no such fabric file")
    graph = _from_graphml(file) if file.suffix == ".graphml" else _from_yaml(file)
    gpus = _check_nodes(graph)
    if not nx.is_strongly_connected(graph):
        raise GraphFileError(f"{path}: not every node can reach every other")
    per_server: dict[int, int] = {}
    for gpu in gpus:
        server = graph.nodes[gpu]["node"]
        per_server[server] = per_server.get(server, 0) + 1
    graph.graph.update(name=file.stem, gpus=gpus, gpus_per_node=max(per_server.values()),
                       servers=len(per_server))
    return graph
