"""NCCL past a few servers (NCCL 2.23-2.28 ``tuning.cc``): PAT all-gather and
reduce-scatter at one GPU per server, ring steps at the tree's network latency
there, the network post overhead on a multi-server ring's intra-server steps,
and the ring all-reduce's plateau factor; against closed forms."""

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.base.fields import ScenarioError
from simulator.base.ir import Collective
from simulator.collectives import nccl
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.collectives.pat import bruck_rounds
from simulator.collectives.tuner import (
    CollectiveError,
    Collectives,
    isolated_time,
    latency,
)
from simulator.config.cluster import Machine
from simulator.config.network import network_from
from simulator.network.fabric import Fabric, Transport
from topologies import CLUSTERS, build_cluster

US = 1e-6
A100, H100 = CLUSTERS["dgx-a100"], CLUSTERS["dgx-h100"]
ONE_GPU = dataclasses.replace(A100, gpus_per_node=1, nics_per_node=1)


def one_per_server(spec, servers):
    """A fabric of ``servers`` servers and the first GPU of each."""
    fabric = Fabric(build_cluster(spec, servers))
    per = spec.gpus_per_node
    return fabric, fabric.graph.graph["gpus"][::per]


@given(st.integers(2, 5000))
def test_bruck_rounds_send_every_other_shard_once_in_log_rounds(n):
    rounds = bruck_rounds(n)
    assert sum(shards for _, shards in rounds) == n - 1
    assert len(rounds) == (n - 1).bit_length()
    assert all(0 < shards <= distance for distance, shards in rounds)


@pytest.mark.parametrize("servers", [4, 5])
@pytest.mark.parametrize("kind", [Collective.ALL_GATHER, Collective.REDUCE_SCATTER])
def test_pat_closed_form(servers, kind):
    """base + log2(N) steps of 14/3.5 us + 2.8 us per rank, then every NIC carries
    (n-1)/n S at 0.75 of its rate."""
    fabric, gpus = one_per_server(ONE_GPU, servers)
    size = 1e9
    lowered = Collectives(fabric, Algorithm.PAT)(kind, gpus, size)
    wire = max(fabric.route(a, b).latency for a in gpus for b in gpus if a != b)
    rounds = (servers - 1).bit_length()
    expected_latency = (8.0 + rounds * 14.0 / 3.5 + servers * 2.8) * US + rounds * wire
    assert lowered.latency == pytest.approx(expected_latency, rel=1e-9)
    nic = ONE_GPU.nic_bandwidth * ONE_GPU.nic_efficiency
    t = isolated_time(fabric, lowered)
    assert t == pytest.approx(expected_latency + (servers - 1) / servers * size / 0.75 / nic,
                              rel=1e-9)
    assert (lowered.algorithm, lowered.protocol) == (Algorithm.PAT, Protocol.SIMPLE)


def test_pat_ranks_send_and_receive_what_a_ring_does():
    fabric, gpus = one_per_server(H100, 6)
    plan = Collectives(fabric).plan(Collective.ALL_GATHER, Algorithm.PAT, gpus)
    edges = {i: e for e, i in fabric.index.items()}
    sent = {g: 0.0 for g in gpus}
    received = dict(sent)
    for route, nbytes in zip(plan.routes, plan.payload, strict=True):
        sent[edges[route[0]][0]] += nbytes
        received[edges[route[-1]][1]] += nbytes
    for g in gpus:
        assert sent[g] == pytest.approx(5 / 6) and received[g] == pytest.approx(5 / 6)


def test_tuner_runs_pat_for_small_calls_at_scale_and_the_ring_for_large():
    fabric, gpus = one_per_server(H100, 64)
    tuner = Collectives(fabric)
    assert tuner(Collective.ALL_GATHER, gpus, 2**20).algorithm is Algorithm.PAT
    assert tuner(Collective.REDUCE_SCATTER, gpus, 2**20).algorithm is Algorithm.PAT
    assert tuner(Collective.ALL_GATHER, gpus, 2**30).algorithm is Algorithm.RING


def test_pat_needs_one_gpu_per_server():
    fabric = Fabric(build_cluster(H100, 2))
    gpus = fabric.graph.graph["gpus"][:2] + fabric.graph.graph["gpus"][8:10]
    tuner = Collectives(fabric)
    assert tuner.plan(Collective.ALL_GATHER, Algorithm.PAT, gpus) is None
    assert tuner(Collective.ALL_GATHER, gpus, 2**20).algorithm is Algorithm.RING
    with pytest.raises(CollectiveError, match="network.algorithm pat cannot run all_gather "
                                              "over 4 GPUs on 2 server"):
        Collectives(fabric, Algorithm.PAT)(Collective.ALL_GATHER, gpus, 2**20)
    _, one = one_per_server(H100, 2)
    assert tuner.plan(Collective.ALL_REDUCE, Algorithm.PAT, one) is None  # AG/RS only


def test_pat_runs_simple_only():
    machine = Machine(H100, None, 1, 8, 0.0)
    with pytest.raises(ScenarioError, match="network.protocol.*simple only"):
        network_from({"algorithm": "pat", "protocol": "ll"}, machine)


@pytest.mark.parametrize("protocol", list(Protocol))
def test_a_ring_over_one_gpu_per_server_steps_at_the_tree_network_latency(protocol):
    fabric, gpus = one_per_server(H100, 3)
    plan = Collectives(fabric).plan(Collective.ALL_GATHER, Algorithm.RING, gpus)
    wire = sum(count * w for _, count, w in plan.steps)
    tree_net = nccl.step_latency(Algorithm.TREE, protocol, Transport.NET, True)
    assert latency(plan, protocol) == pytest.approx(
        nccl.base_latency(Algorithm.RING, protocol) + 2 * tree_net + wire, rel=1e-12)


def test_a_multi_server_ring_steps_inside_servers_at_least_the_net_overhead():
    fabric = Fabric(build_cluster(H100, 2))
    plan = Collectives(fabric).plan(Collective.ALL_GATHER, Algorithm.RING,
                                    fabric.graph.graph["gpus"])
    steps = {transport: count for transport, count, _ in plan.steps}
    wire = sum(count * w for _, count, w in plan.steps)
    for protocol, intra in ((Protocol.LL, 1.0), (Protocol.LL128, 1.9), (Protocol.SIMPLE, 3.4)):
        net = nccl.step_latency(Algorithm.RING, protocol, Transport.NET, True)
        assert latency(plan, protocol) == pytest.approx(
            nccl.base_latency(Algorithm.RING, protocol) + steps[Transport.NVLINK] * intra * US
            + steps[Transport.NET] * net + wire, rel=1e-12)


def test_the_ring_all_reduce_plateau_applies_across_servers_under_simple_only():
    fabric = Fabric(build_cluster(H100, 2))
    gpus = fabric.graph.graph["gpus"]
    tuner = Collectives(fabric)
    ring = tuner.plan(Collective.ALL_REDUCE, Algorithm.RING, gpus)
    wire = sum(count * w for _, count, w in ring.steps)
    small, large = 64 * ring.channels * 16 - 1, 64 * ring.channels * 16
    assert latency(ring, Protocol.SIMPLE, large) - wire == pytest.approx(
        1.4 * (latency(ring, Protocol.SIMPLE, small) - wire), rel=1e-12)
    assert latency(ring, Protocol.LL128, large) == latency(ring, Protocol.LL128, small)
    gather = tuner.plan(Collective.ALL_GATHER, Algorithm.RING, gpus)
    assert latency(gather, Protocol.SIMPLE, 1e9) == latency(gather, Protocol.SIMPLE, 1)
    inside = Collectives(Fabric(build_cluster(H100, 1))).plan(
        Collective.ALL_REDUCE, Algorithm.RING, gpus[:8])
    assert latency(inside, Protocol.SIMPLE, 1e9) == latency(inside, Protocol.SIMPLE, 1)
