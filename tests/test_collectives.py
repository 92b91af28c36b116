"""Collective lowering against nccl-tests closed forms (doc/PERFORMANCE.md)."""

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.collectives import isolated_time, ring_all_reduce, ring_channels, ring_orders
from simulator.fabric import Fabric
from topologies import CLUSTERS, build_cluster


def test_ring_orders_rotate_each_server():
    assert ring_orders([0, 0, 0, 1, 1, 1], 3) == [
        [0, 1, 2, 3, 4, 5], [1, 2, 0, 4, 5, 3], [2, 0, 1, 5, 3, 4]]
    assert ring_orders([0, 1, 2], 1) == [[0, 1, 2]]


@pytest.mark.parametrize("n", [2, 4, 8])
@pytest.mark.parametrize("size", [8.0, 1e6, 8e9])
def test_single_node_ring_all_reduce_closed_form(n, size):
    spec = CLUSTERS["dgx-a100"]
    fabric = Fabric(build_cluster(spec, 1))
    gpus = fabric.graph.graph["gpus"][:n]
    hop_latency = 2 * spec.nvlink_latency  # GPU -> NVSwitch -> GPU
    expected = 2 * (n - 1) / n * size / spec.nvlink_bandwidth + 2 * (n - 1) * hop_latency
    assert isolated_time(fabric, ring_all_reduce(fabric, gpus, size)) == pytest.approx(
        expected, rel=1e-9)


def test_multi_node_ring_uses_every_nic():
    spec = CLUSTERS["dgx-a100"]
    fabric = Fabric(build_cluster(spec, 2))
    gpus = fabric.graph.graph["gpus"]
    n, size = len(gpus), 1e9
    lowered = ring_all_reduce(fabric, gpus, size)
    assert lowered.channels == 8
    hop = 2 * spec.pcie_latency + 2 * spec.link_latency  # gpu-nic-leaf-nic-gpu
    expected = 2 * (n - 1) / n * size / (8 * spec.nic_bandwidth) + 2 * (n - 1) * hop
    t = isolated_time(fabric, lowered)
    assert t == pytest.approx(expected, rel=1e-9)
    busbw = size / t * 2 * (n - 1) / n
    assert busbw == pytest.approx(200e9, rel=0.01)  # 8 x HDR; NCCL measures 192 GB/s


@pytest.mark.parametrize(("nodes", "n"), [(1, 8), (2, 16), (3, 24)])
def test_lockstep_ring_equals_pipelined_ring_on_an_idle_fabric(nodes, n):
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], nodes))
    gpus = fabric.graph.graph["gpus"][:n]
    pipelined = ring_all_reduce(fabric, gpus, 64e6)
    lockstep = ring_all_reduce(fabric, gpus, 64e6, lockstep=True)
    assert lockstep.steps == 2 * (n - 1) and pipelined.steps == 1
    assert lockstep.sizes[0] * lockstep.steps == pytest.approx(pipelined.sizes[0])
    assert isolated_time(fabric, lockstep) == pytest.approx(isolated_time(fabric, pipelined),
                                                            rel=1e-9)


@settings(max_examples=30, deadline=None)
@given(st.integers(1, 3), st.data(), st.floats(1.0, 1e9))
def test_every_rank_sends_and_receives_the_same_bytes(nodes, data, size):
    fabric = Fabric(build_cluster(CLUSTERS["polaris"], nodes))
    every = fabric.graph.graph["gpus"]
    gpus = data.draw(st.lists(st.sampled_from(every), min_size=2, unique=True))
    lowered = ring_all_reduce(fabric, gpus, size)
    edges = {i: e for e, i in fabric.index.items()}
    sent = {g: 0.0 for g in gpus}
    received = {g: 0.0 for g in gpus}
    for route, nbytes in zip(lowered.routes, lowered.sizes, strict=True):
        sent[edges[route[0]][0]] += nbytes
        received[edges[route[-1]][1]] += nbytes
    n = len(gpus)
    for g in gpus:
        assert sent[g] == pytest.approx(2 * (n - 1) / n * size)
        assert received[g] == pytest.approx(sent[g])


def test_channels_follow_nics():
    fabric = Fabric(build_cluster(CLUSTERS["polaris"], 2))
    assert ring_channels(fabric, fabric.graph.graph["gpus"]) == 2
    assert ring_channels(fabric, fabric.graph.graph["gpus"][:4]) == 1


def test_one_rank_all_reduce_is_free():
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], 1))
    lowered = ring_all_reduce(fabric, ["n0.gpu0"], 1e9)
    assert isolated_time(fabric, lowered) == 0.0


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["nvlink_bandwidth", "nic_bandwidth", "pcie_bandwidth"]),
       st.floats(1.01, 8.0), st.integers(2, 3), st.floats(1e3, 1e9))
def test_raising_bandwidth_never_slows_all_reduce(field, factor, nodes, size):
    spec = CLUSTERS["dgx-a100"]
    faster = dataclasses.replace(spec, **{field: getattr(spec, field) * factor})
    times = []
    for s in (spec, faster):
        fabric = Fabric(build_cluster(s, nodes))
        times.append(isolated_time(fabric, ring_all_reduce(fabric, fabric.graph.graph["gpus"],
                                                           size)))
    assert times[1] <= times[0] * (1 + 1e-12)
