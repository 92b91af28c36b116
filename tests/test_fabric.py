"""Topology builders: invariants (counts, connectivity) and routing."""

import dataclasses

import networkx as nx
import pytest

from simulator.fabric import Fabric, FabricError
from topologies import CLUSTERS, build_cluster
from topologies.fabric import leaf_spine_shape


@pytest.mark.parametrize("preset", list(CLUSTERS))
@pytest.mark.parametrize("nodes", [1, 2, 9])
def test_counts_and_connectivity(preset, nodes):
    spec = CLUSTERS[preset]
    graph = build_cluster(spec, nodes)
    kinds = nx.get_node_attributes(graph, "kind")
    count = {k: list(kinds.values()).count(k) for k in set(kinds.values())}
    assert count["gpu"] == nodes * spec.gpus_per_node == len(graph.graph["gpus"])
    assert count["nic"] == nodes * spec.nics_per_node
    assert nx.is_strongly_connected(graph)
    for u, v, data in graph.edges(data=True):
        assert graph.has_edge(v, u), "every link is full duplex"
        assert data["bandwidth"] > 0 and data["latency"] >= 0
    for gpu in graph.graph["gpus"]:
        assert graph.has_edge(gpu, graph.nodes[gpu]["nic"])


def test_polaris_shares_two_nics_among_four_gpus():
    graph = build_cluster(CLUSTERS["polaris"], 1)
    nics = [graph.nodes[f"n0.gpu{g}"]["nic"] for g in range(4)]
    assert nics == ["n0.nic0", "n0.nic0", "n0.nic1", "n0.nic1"]
    assert graph["n0.gpu0"]["n0.gpu3"]["bandwidth"] == pytest.approx(100e9)


def test_leaf_spine_shape():
    assert leaf_spine_shape(8, 32, 1.0) == (1, 0)
    assert leaf_spine_shape(512, 32, 1.0) == (16, 32)
    assert leaf_spine_shape(512, 32, 4.0) == (16, 8)


def test_routes():
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], 9))
    intra = fabric.route("n0.gpu0", "n0.gpu5")
    assert len(intra.links) == 2  # GPU -> NVSwitch -> GPU
    assert intra.latency == pytest.approx(1e-6)
    same_leaf = fabric.route("n0.gpu3", "n1.gpu3")  # leaves hold 4 servers x 8 NICs
    assert len(same_leaf.links) == 4
    far = fabric.route("n0.gpu3", "n8.gpu4")
    assert len(far.links) == 6  # gpu, nic, leaf, spine, leaf, nic, gpu
    names = {i: e for e, i in fabric.index.items()}
    assert names[far.links[0]] == ("n0.gpu3", "n0.nic3")
    assert names[far.links[-1]] == ("n8.nic4", "n8.gpu4")
    again = Fabric(build_cluster(CLUSTERS["dgx-a100"], 9)).route("n0.gpu3", "n8.gpu4")
    assert again == far, "ECMP choice is deterministic across processes and builds"


def test_mesh_route_is_direct():
    fabric = Fabric(build_cluster(CLUSTERS["polaris"], 2))
    assert len(fabric.route("n0.gpu1", "n0.gpu2").links) == 1


def test_zero_bandwidth_edge_is_rejected():
    graph = build_cluster(dataclasses.replace(CLUSTERS["dgx-a100"], nic_bandwidth=0.0), 2)
    with pytest.raises(FabricError, match="bandwidth"):
        Fabric(graph)
