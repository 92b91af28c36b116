"""Topology builders: invariants (counts, connectivity), routing, fabric files."""

import dataclasses

import networkx as nx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.network.fabric import Fabric, FabricError, Transport
from topologies import CLUSTERS, NETWORKS, build_cluster
from topologies.graph_file import GraphFileError, load_graph
from topologies.networks.dragonfly import dragonfly_links
from topologies.networks.fat_tree import leaf_spine_shape
from topologies.routing import Routing, shortest_paths

KINDS = ["fat_tree", "fat_tree_3", "rail_optimized", "dragonfly"]


def with_fabric(preset, kind, **params):
    """``preset`` on a ``kind`` network with those of ``params`` the kind has."""
    spec, network = CLUSTERS[preset], NETWORKS[kind]
    own = {f.name for f in dataclasses.fields(network)}
    return dataclasses.replace(spec, fabric=network(**{k: v for k, v in params.items()
                                                        if k in own}))


@pytest.mark.parametrize("preset", list(CLUSTERS))
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("nodes", [1, 2, 9, 40])
def test_counts_and_connectivity(preset, kind, nodes):
    spec = with_fabric(preset, kind, leaf_ports=8, pod_leaves=2, router_nodes=2,
                       group_routers=3, global_links=2)
    graph = build_cluster(spec, nodes)
    kinds = nx.get_node_attributes(graph, "kind")
    count = {k: list(kinds.values()).count(k) for k in set(kinds.values())}
    assert count["gpu"] == nodes * spec.gpus_per_node == len(graph.graph["gpus"])
    assert count["nic"] == nodes * spec.nics_per_node
    assert nx.is_strongly_connected(graph)
    for u, v, data in graph.edges(data=True):
        assert graph.has_edge(v, u), "every link is full duplex"
        assert data["bandwidth"] > 0 and data["latency"] >= 0 and 0 < data["efficiency"] <= 1
    for gpu in graph.graph["gpus"]:
        assert graph.has_edge(gpu, graph.nodes[gpu]["nic"])
    fabric = Fabric(graph)  # every GPU reaches every other
    first, last = graph.graph["gpus"][0], graph.graph["gpus"][-1]
    assert fabric.route(first, last).links and fabric.route(last, first).links


def test_polaris_shares_two_nics_among_four_gpus():
    graph = build_cluster(CLUSTERS["polaris"], 1)
    nics = [graph.nodes[f"n0.gpu{g}"]["nic"] for g in range(4)]
    assert nics == ["n0.nic0", "n0.nic0", "n0.nic1", "n0.nic1"]
    assert graph["n0.gpu0"]["n0.gpu3"]["bandwidth"] == pytest.approx(100e9)


def test_leaf_spine_shape():
    assert leaf_spine_shape(8, 32, 1.0) == (1, 0)
    assert leaf_spine_shape(512, 32, 1.0) == (16, 32)
    assert leaf_spine_shape(512, 32, 4.0) == (16, 8)


def test_oversubscription_cuts_uplinks():
    full = build_cluster(with_fabric("dgx-a100", "fat_tree", leaf_ports=16), 8)
    half = build_cluster(with_fabric("dgx-a100", "fat_tree", leaf_ports=16,
                                     oversubscription=2.0), 8)
    assert full.out_degree("leaf0") == 16 + 16 and half.out_degree("leaf0") == 16 + 8


def test_three_level_fat_tree_levels():
    graph = build_cluster(with_fabric("dgx-a100", "fat_tree_3", leaf_ports=8,
                                      pod_leaves=2), 8)
    levels = {d["level"] for _, d in graph.nodes(data=True) if d["kind"] == "switch"}
    assert levels == {1, 2, 3}
    route = Fabric(graph).route("n0.gpu0", "n7.gpu0")
    assert len(route.links) == 8  # gpu nic leaf agg core agg leaf nic gpu


def test_rail_optimized_keeps_traffic_on_the_destination_rail():
    graph = build_cluster(with_fabric("dgx-a100", "rail_optimized", leaf_ports=4), 4)
    fabric = Fabric(graph)
    names = {i: e for e, i in fabric.index.items()}
    same_rail = [names[i] for i in fabric.route("n0.gpu3", "n1.gpu3").links]
    assert same_rail == [("n0.gpu3", "n0.nic3"), ("n0.nic3", "rail3.leaf0"),
                         ("rail3.leaf0", "n1.nic3"), ("n1.nic3", "n1.gpu3")]
    cross = [names[i] for i in fabric.route("n0.gpu2", "n1.gpu5").links]
    assert cross[:2] == [("n0.gpu2", "n0.nvsw"), ("n0.nvsw", "n0.gpu5")]  # NVLink first (PXN)
    assert ("n0.nic5", "rail5.leaf0") in cross


def test_dragonfly_links_spread_over_groups():
    links = dragonfly_links(5, 4, 2)
    per_group = [sum(1 for a, b in links for g in (a[0], b[0]) if g == x) for x in range(5)]
    assert per_group == [8] * 5
    graph = build_cluster(CLUSTERS["polaris"], 200)
    groups = {n.split(".")[0] for n, d in graph.nodes(data=True) if d["kind"] == "switch"}
    assert len(groups) == 4  # 200 servers / 8 per router / 8 routers per group
    far = Fabric(graph).route("n0.gpu0", "n199.gpu0")
    assert far.transport is Transport.NET and len(far.links) <= 9


def test_routes():
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], 9))
    intra = fabric.route("n0.gpu0", "n0.gpu5")
    assert len(intra.links) == 2 and intra.transport is Transport.NVLINK
    assert intra.latency == pytest.approx(1e-6)
    same_leaf = fabric.route("n0.gpu3", "n1.gpu3")  # leaves hold 4 servers x 8 NICs
    assert len(same_leaf.links) == 4 and same_leaf.transport is Transport.NET
    far = fabric.route("n0.gpu3", "n8.gpu4")
    assert len(far.links) == 6  # gpu, nic, leaf, spine, leaf, nic, gpu
    again = Fabric(build_cluster(CLUSTERS["dgx-a100"], 9)).route("n0.gpu3", "n8.gpu4")
    assert again == far, "ECMP choice is deterministic across processes and builds"
    assert len(Fabric(build_cluster(CLUSTERS["polaris"], 2)).route("n0.gpu1", "n0.gpu2")
               .links) == 1


def test_zero_bandwidth_edge_is_rejected():
    graph = build_cluster(dataclasses.replace(CLUSTERS["dgx-a100"], nic_bandwidth=0.0), 2)
    with pytest.raises(FabricError, match="bandwidth"):
        Fabric(graph)


YAML_FABRIC = """
nodes:
  - {name: a0, kind: gpu, node: 0, local: 0, nic: nic0}
  - {name: a1, kind: gpu, node: 0, local: 1, nic: nic0}
  - {name: b0, kind: gpu, node: 1, local: 0, nic: nic1}
  - {name: nic0, kind: nic, node: 0, local: 0}
  - {name: nic1, kind: nic, node: 1, local: 0}
  - {name: sw, kind: switch}
links:
  - {a: a0, b: a1, bandwidth: "100 GB/s", latency: "0.5 us", link: nvlink}
  - {a: a0, b: nic0, bandwidth: "32 GB/s", link: pcie}
  - {a: a1, b: nic0, bandwidth: "32 GB/s", link: pcie}
  - {a: b0, b: nic1, bandwidth: "32 GB/s", link: pcie}
  - {a: nic0, b: sw, bandwidth: "200 Gb/s", latency: "1 us", efficiency: 0.9}
  - {a: nic1, b: sw, bandwidth: "200 Gb/s", latency: "1 us"}
"""


def test_yaml_fabric_file(tmp_path):
    path = tmp_path / "tiny.yaml"
    path.write_text(YAML_FABRIC)
    graph = load_graph(path)
    assert graph.graph["gpus"] == ["a0", "a1", "b0"] and graph.graph["servers"] == 2
    assert graph["nic0"]["sw"]["bandwidth"] == 25e9 and graph["sw"]["nic0"]["efficiency"] == 0.9
    route = Fabric(graph).route("a1", "b0")
    assert route.transport is Transport.NET and len(route.links) == 4


def test_graphml_fabric_file(tmp_path):
    graph = build_cluster(CLUSTERS["polaris"], 2)
    path = tmp_path / "polaris.graphml"
    undirected = graph.to_undirected()
    undirected.graph.clear()  # GraphML keeps node and edge attributes, not lists
    nx.write_graphml(undirected, path)
    loaded = load_graph(path)
    assert loaded.graph["gpus"] == graph.graph["gpus"]
    assert loaded.number_of_edges() == graph.number_of_edges()


@pytest.mark.parametrize(("edit", "message"), [
    (("200 Gb/s", "0 Gb/s"), r"links\[4\].bandwidth: '0 Gb/s' must be positive"),
    (("200 Gb/s", "200 GB"), r"links\[4\].bandwidth: '200 GB' is not a bandwidth"),
    (("kind: switch", "kind: router"), "node sw: kind 'router' is not one of"),
    (("{a: nic1, b: sw", "{a: nic1, b: sx"), r"links\[5\].b: 'sx' is not a declared node"),
    (("link: nvlink", "link: wifi"), r"links\[0\].link: 'wifi' is not one of"),
])
def test_bad_fabric_files(tmp_path, edit, message):
    path = tmp_path / "bad.yaml"
    path.write_text(YAML_FABRIC.replace(*edit, 1))
    with pytest.raises(GraphFileError, match=message):
        load_graph(path)


def test_builders_take_keyword_parameters():
    graph = build_cluster("dgx-a100", 8, fabric="fat_tree_3", leaf_ports=16, pod_leaves=2,
                          oversubscription=2.0, nic_bandwidth=50e9)
    assert graph["n0.nic0"]["leaf0"]["bandwidth"] == 50e9
    assert {d["level"] for _, d in graph.nodes(data=True) if d["kind"] == "switch"} == {1, 2, 3}
    assert graph.out_degree("leaf0") == 16 + 8  # 16 NICs down, 8 aggregation switches up
    with pytest.raises(TypeError):
        build_cluster("dgx-a100", 2, colour="blue")


@settings(max_examples=30, deadline=None)
@given(n=st.integers(2, 12), p=st.floats(0.1, 0.6), seed=st.integers(0, 10**6))
def test_shortest_paths_from_one_search_equal_networkx(n, p, seed):
    """Routing enumerates equal-cost paths from one breadth-first search per source
    switch; the set equals networkx's all_shortest_paths for every pair."""
    graph = nx.relabel_nodes(nx.gnp_random_graph(n, p, seed=seed, directed=True), str)
    nx.set_node_attributes(graph, "switch", "kind")
    routing = Routing(graph)
    for source in graph:
        for target in graph:
            if target == source:
                continue
            mine = sorted(shortest_paths(routing._predecessors(source, target), source, target))
            if nx.has_path(graph, source, target):
                assert mine == sorted(nx.all_shortest_paths(graph, source, target))
            else:
                assert mine == []


def _spine_loads(spec, nodes):
    """Flows per leaf-to-spine uplink when every NIC sends to the next server's
    NIC of the same index (the inter-node permutation of NCCL's rings)."""
    from collections import Counter

    graph = build_cluster(spec, nodes)
    routing = graph.graph["routing"](graph)
    loads = Counter()
    for node in range(nodes):
        for g in range(spec.gpus_per_node):
            path = routing.path(f"n{node}.gpu{g}", f"n{(node + 1) % nodes}.gpu{g}")
            loads.update((a, b) for a, b in zip(path, path[1:], strict=False)
                         if a.startswith("leaf") and b.startswith("spine"))
    return loads


def test_ecmp_hash_collides_where_d_mod_k_does_not():
    spec = CLUSTERS["dgx-a100"]
    assert max(_spine_loads(spec, 16).values()) == 1  # D-mod-K: one flow per uplink
    hashed = [_spine_loads(dataclasses.replace(spec, ecmp="hash", ecmp_seed=s), 16)
              for s in range(3)]
    assert all(max(loads.values()) >= 2 for loads in hashed)  # 32 of 32 uplinks: collisions
    assert hashed[0] == _spine_loads(dataclasses.replace(spec, ecmp="hash", ecmp_seed=0), 16)
    assert hashed[0] != hashed[1]  # the seed picks the collisions


def test_ecmp_hash_slows_a_multi_leaf_all_reduce_and_nothing_within_a_leaf():
    from simulator.base.ir import Collective
    from simulator.collectives.nccl_tests import time_alone
    from simulator.collectives.tuner import Collectives

    def seconds(nodes, **changes):
        fabric = Fabric(build_cluster(dataclasses.replace(CLUSTERS["dgx-a100"], **changes),
                                      nodes))
        gpus = fabric.graph.graph["gpus"]
        return time_alone(fabric, Collectives(fabric), Collective.ALL_REDUCE, gpus, 2**30)[0]

    assert seconds(16, ecmp="hash") > 1.1 * seconds(16)
    assert seconds(4, ecmp="hash") == seconds(4)  # 32 NICs, one leaf: no path to pick
