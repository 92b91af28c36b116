"""MoE token exchanges at the rates real runs reach (issue 56, items 2 and 4):
DeepEP's and HybridEP's dispatch and combine at their READMEs' published
bandwidths (``simulator.collectives.expert_exchange``), and NCCL's all-to-all
as n-1 point-to-point transfers under NCCL's p2p protocol rule
(``simulator.collectives.p2p``).

The README rows are reproduced by running each README's own configuration
through the simulator: every rank's hops lowered by the tuner and run at once
on the cluster's fabric, the logical bytes (each README's own count) over the
time both hops take. Tolerance 2 %: the hops' wire latency (a few
microseconds on calls of 1-8 ms) and the fabric's routes are the simulator's
own; the shares were taken from the same rows, so what this checks is that
the shares, the all-to-all's flows, their scaling by the fabric's capacities,
the two hops at once and the bottleneck hop give the README's figure back.
"""

from __future__ import annotations

from math import comb

import numpy as np
import pytest
import simpy

from simulator import run
from simulator.base.ir import Collective
from simulator.collectives import expert_exchange as X
from simulator.collectives import nccl, p2p
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.collectives.states import FabricStates
from simulator.collectives.tuner import estimate, execute, isolated_time
from simulator.config.scenario import from_dict
from simulator.network.fabric import Transport
from simulator.network.flows import Network
from tests.test_moe import scenario
from topologies import CLUSTERS, build_cluster

TOKENS, HIDDEN, TOP_K = 4096, 7168, 8  # both READMEs' configuration
FP8 = 2 * (1 + 4 / 128) / 2  # DeepEP's tests: FP8 bytes an element with its scales
BF16 = 2.0
TOLERANCE = 0.02


def _miss(pool: int, held: int) -> float:
    """Chance that none of a token's ``TOP_K`` experts, drawn from ``pool``, is
    among ``held`` of them."""
    return comb(pool - held, TOP_K) / comb(pool, TOP_K)


def _together(states: FabricStates, calls) -> float:
    """Seconds the calls ``(kind, gpus, bytes)`` take run at once on the fabric."""
    env = simpy.Environment()
    network = Network(env, states.fabric.capacity)
    for kind, gpus, size in calls:
        env.process(execute(network, states.lowering(kind, gpus, size)))
    env.run()
    return env.now


def _two_hops(cluster: str, nodes: int, kind: Collective, rdma: float, nvl: float) -> float:
    """Seconds of a dispatch (or combine) over ``nodes`` servers of 8: every
    server's NVLink hop of ``nvl`` bytes a rank and every local index's RDMA hop
    of ``rdma`` bytes a rank, at once (one hop inside a server)."""
    states = FabricStates.build(build_cluster(CLUSTERS[cluster], nodes))
    gpus = states.gpus
    calls = [(kind, gpus[8 * s:8 * s + 8], nvl) for s in range(nodes)]
    if nodes > 1:
        calls += [(kind, gpus[j::8], rdma) for j in range(8)]
    return _together(states, calls)


# DeepEP README (docs/legacy.md), H800 normal kernels: (EP, dispatch GB/s, combine GB/s)
DEEPEP_ROWS = [(8, 153.0, 158.0), (16, 43.0, 43.0), (32, 58.0, 57.0), (64, 51.0, 50.0)]


def _deepep_bytes(ep: int) -> tuple[float, float]:
    """(RDMA, NVLink) tokens a rank moves in DeepEP's test: 256 experts, top-4
    groups (``min(nodes, 4)`` of the nodes; a token's 8 experts among the chosen
    nodes' 256 / nodes each), RDMA once per node holding one (its own counted),
    NVLink: every token a rank receives."""
    nodes = ep // 8
    groups = min(nodes, 4)
    per_node, per_rank = 256 // nodes, 256 // ep
    pool = groups * per_node
    rdma = TOKENS * groups * (1 - _miss(pool, per_node))
    nvl = ep * TOKENS * groups / nodes * (1 - _miss(pool, per_rank))
    return rdma, nvl


@pytest.mark.parametrize(("ep", "dispatch", "combine"), DEEPEP_ROWS)
def test_deepep_reproduces_its_readme_rows(ep, dispatch, combine):
    """DeepEP's normal kernels on DGX H800 (NVLink 200 GB/s a direction, CX7
    400 Gb/s): EP 8's NVLink bandwidth and EP 16/32/64's RDMA bandwidth, dispatch
    in FP8 and combine in BF16, as the README's table gives them. At EP 16 and up
    the RDMA hop is the slower (the NVLink hop, at the intranode row's share,
    would take less)."""
    rdma_tokens, nvl_tokens = _deepep_bytes(ep)
    for kind, element, published, intranode in (
            (Collective.DEEPEP_DISPATCH, FP8, dispatch, 153e9),
            (Collective.DEEPEP_COMBINE, BF16, combine, 158e9)):
        rdma, nvl = rdma_tokens * HIDDEN * element, nvl_tokens * HIDDEN * element
        seconds = _two_hops("dgx-h800", ep // 8, kind, rdma, nvl)
        logical = (nvl if ep == 8 else rdma) / seconds / 1e9
        assert logical == pytest.approx(published, rel=TOLERANCE)
        if ep > 8:
            assert nvl / intranode < 0.95 * seconds  # the NVLink hop alone: faster


# HybridEP README, H100 + InfiniBand, Torch API at 8 SMs (its default across nodes):
# (ranks, BF16 dispatch GB/s, combine GB/s)
HYBRIDEP_H100 = [(16, 57.74, 56.96), (32, 46.54, 50.68), (64, 41.46, 47.68)]


@pytest.mark.parametrize(("ranks", "dispatch", "combine"), HYBRIDEP_H100)
def test_hybridep_reproduces_its_h100_rows(ranks, dispatch, combine):
    """HybridEP across DGX H100 servers (8 local experts a rank, uniform random
    router, BF16): the RDMA bandwidth of its README's rows at its default 8 SMs."""
    experts, nodes = 8 * ranks, ranks // 8
    rdma_tokens = TOKENS * nodes * (1 - _miss(experts, experts // nodes))
    nvl_tokens = ranks * TOKENS * (1 - _miss(experts, 8))
    for kind, published in ((Collective.HYBRIDEP_DISPATCH, dispatch),
                            (Collective.HYBRIDEP_COMBINE, combine)):
        rdma, nvl = rdma_tokens * HIDDEN * BF16, nvl_tokens * HIDDEN * BF16
        seconds = _two_hops("dgx-h100", nodes, kind, rdma, nvl)
        assert rdma / seconds / 1e9 == pytest.approx(published, rel=TOLERANCE)


# HybridEP README, GB200 NVL72, Torch API: (ranks, 16-SM dispatch, combine, 32-SM ...)
HYBRIDEP_GB200 = [(8, 550.10, 538.44, 545.71, 568.94), (16, 472.84, 474.48, 523.48, 521.55),
                  (24, 441.89, 444.40, 507.32, 483.76), (32, 485.50, 423.19, 484.22, 464.54),
                  (36, 469.96, 418.27, 479.02, 447.89)]


@pytest.mark.parametrize(("ranks", "d16", "c16", "d32", "c32"), HYBRIDEP_GB200)
def test_hybridep_on_gb200_at_its_default_sms(ranks, d16, c16, d32, c32):
    """HybridEP inside one NVL72 rack (NVLink 5, 900 GB/s a direction), BF16, at
    its default 24 SMs in one NVLink domain: midway between the README's 16- and
    32-SM rows; at those budgets the shares give the rows themselves."""
    states = FabricStates.build(build_cluster(CLUSTERS["gb200-nvl72"], 18))
    received = ranks * TOKENS * (1 - _miss(8 * ranks, 8)) * HIDDEN * BF16
    for kind, kernel, low, high in ((Collective.HYBRIDEP_DISPATCH, X.DISPATCH, d16, d32),
                                    (Collective.HYBRIDEP_COMBINE, X.COMBINE, c16, c32)):
        seconds = _together(states, [(kind, states.gpus[:ranks], received)])
        assert received / seconds / 1e9 == pytest.approx((low + high) / 2, rel=TOLERANCE)
        for sms, published in ((16, low), (32, high)):
            share = X.share(Algorithm.HYBRIDEP, Transport.NVLINK, ranks, kernel, sms)
            assert share * 900 == pytest.approx(published, rel=1e-9)


def test_shares_interpolate_between_rows_and_hold_outside_them():
    nvl = X.share(Algorithm.HYBRIDEP, Transport.NVLINK, 12, X.DISPATCH, 16) * 900
    assert nvl == pytest.approx((550.10 + 472.84) / 2)
    assert X.share(Algorithm.HYBRIDEP, Transport.NVLINK, 64, X.COMBINE, 16) == \
        X.share(Algorithm.HYBRIDEP, Transport.NVLINK, 36, X.COMBINE, 16)
    assert X.share(Algorithm.DEEPEP, Transport.NET, 16, X.DISPATCH, 24) * 50 == \
        pytest.approx(51.0)  # EP 128: the EP 64 row


def test_deepep_on_a_fast_link_is_bound_by_its_sms():
    """DeepEP's NVLink hop at the H800 row's share of B200's 900 GB/s would be 689
    GB/s; at Megatron-Core's 20 SMs it reaches 20/24 of the 494 GB/s DeepEP's 24
    SMs reach on B200. On H100 (450 GB/s) the link binds the dispatch."""
    b200 = X.rate(Algorithm.DEEPEP, Transport.NVLINK, 8, X.DISPATCH, 900e9)
    assert b200 == pytest.approx(20 / 24 * 494e9)
    h100 = X.rate(Algorithm.DEEPEP, Transport.NVLINK, 8, X.DISPATCH, 450e9)
    assert h100 == pytest.approx(153 / 200 * 450e9)


def test_a_flex_run_uses_its_backend_and_says_so():
    """A flex run's exchanges are its backend's kernels (a backward's dispatch is a
    combine), slower than NCCL's all-to-all of the same bytes; the summary's
    ``token_exchange`` names what timed them."""
    raw = scenario(ep=8, moe_token_dispatcher_type="flex")
    result = run(raw)
    ep = result.comms[result.comms["name"].isin(["dispatch", "combine"])]
    assert set(ep["collective"]) == {"deepep_dispatch", "deepep_combine"}
    assert set(ep["algorithm"]) == {"deepep"}
    assert "deepep dispatch and combine at their published achieved bandwidths" in \
        result.summary["token_exchange"]
    hybrid = run({**raw, "parallelism": {**raw["parallelism"],
                                         "moe_flex_dispatcher_backend": "hybridep"}})
    assert "hybridep" in hybrid.summary["token_exchange"]
    nccl_run = run(scenario(ep=8))
    assert "n-1 point-to-point" in nccl_run.summary["token_exchange"]
    assert "deepep" not in nccl_run.summary["token_exchange"]


def test_hybridep_without_flex_is_refused():
    raw = scenario(ep=8)
    raw["parallelism"]["moe_flex_dispatcher_backend"] = "hybridep"
    with pytest.raises(ValueError, match="moe_flex_dispatcher_backend.*flex"):
        program = from_dict(raw)
        from workloads.program import build_program
        build_program(program.model, program.training, program.parallel, program.seed)


def test_an_unknown_backend_names_the_field_and_the_choices():
    raw = scenario(ep=8, moe_token_dispatcher_type="flex")
    raw["parallelism"]["moe_flex_dispatcher_backend"] = "nccl"
    with pytest.raises(ValueError, match=r"moe_flex_dispatcher_backend.*deepep, hybridep"):
        from_dict(raw)


# --- NCCL's all-to-all: n-1 point-to-point transfers (collectives.p2p) ---

@pytest.mark.parametrize(("nbytes", "ranks", "multi", "per_peer", "p2p_channels", "want"), [
    (64 * 2**20, 8, False, 64, 32, 4),   # 8 ranks on 32 p2p channels: 4 each, 16 MiB parts
    (200 * 2**20, 8, False, 64, 32, 16),  # parts over 16 MiB (32 NVLink chunks): doubled
    (100_000, 8, False, 64, 32, 2),      # at least 64 KiB (an eighth of a chunk) a channel
    (2**20, 64, True, 4, 32, 4),         # across nodes a 128 KiB chunk a channel, at most
    # the per-peer channels: 1 (4 x 64 > 32: halved to 1), doubled to 4 (256 KiB each)
    (100_000, 64, True, 4, 32, 1),       # under a chunk: the one channel
])
def test_channels_per_peer_follow_nccls_rule(nbytes, ranks, multi, per_peer, p2p_channels,
                                             want):
    assert p2p.channels_per_peer(nbytes, ranks, multi, per_peer, p2p_channels) == want


def test_nccl_channels_of_dgx_h100():
    """18 NVLinks: 32 p2p channels, 2 x 18 -> 64 to an NVLink peer; across servers a
    400 Gb/s NIC needs ceil(50 / 14) = 4 channels (P2P_PER_CHANNEL_NET_BW)."""
    states = FabricStates.build(build_cluster(CLUSTERS["dgx-h100"], 8))
    assert p2p.topology_channels(states.fabric, states.gpus[:8]) == (64, 32)
    assert p2p.topology_channels(states.fabric, states.gpus[:64]) == (4, 32)


def test_the_all_to_all_runs_the_protocol_nccl_picks_not_the_faster():
    """Eight H100s, 32 KiB to each peer: one channel a peer (32 KiB < 64 KiB parts),
    so more than LL's 16 KiB a channel: NCCL runs Simple, though LL would be
    faster on the idle fabric; at 8 KiB a peer LL."""
    states = FabricStates.build(build_cluster(CLUSTERS["dgx-h100"], 1))
    gpus, tuner = states.gpus, states.lowering
    size = 8 * 32 * 1024
    plan = tuner.plan(Collective.ALL_TO_ALL, Algorithm.DIRECT, gpus)
    assert estimate(states.fabric, plan, size, Protocol.LL) < \
        estimate(states.fabric, plan, size, Protocol.SIMPLE)
    assert tuner(Collective.ALL_TO_ALL, gpus, size).protocol is Protocol.SIMPLE
    assert tuner(Collective.ALL_TO_ALL, gpus, 8 * 8 * 1024).protocol is Protocol.LL


def test_an_all_to_all_is_latency_bound_when_small_and_n_minus_1_transfers_when_large():
    """Closed form on eight H100s: one step's latency (every peer in one wave)
    plus the n-1 transfers of S/n each sharing the rank's NVLink at NCCL's
    effective rate: ``base + step + wire + (n-1)/n x S / (450 GB/s x 0.822)``."""
    states = FabricStates.build(build_cluster(CLUSTERS["dgx-h100"], 1))
    gpus, tuner = states.gpus, states.lowering
    wire = states.fabric.route(gpus[0], gpus[1]).latency
    for size, protocol in ((8 * 1024, Protocol.LL), (2**30, Protocol.SIMPLE)):
        fixed = nccl.base_latency(Algorithm.DIRECT, protocol) + nccl.step_latency(
            Algorithm.DIRECT, protocol, Transport.NVLINK, False) + wire
        want = fixed + 7 / 8 * size / nccl.efficiency(protocol) / (450e9 * 0.822)
        lowered = tuner(Collective.ALL_TO_ALL, gpus, size)
        assert lowered.protocol is protocol
        assert isolated_time(states.fabric, lowered) == pytest.approx(want, rel=1e-9)
    small = isolated_time(states.fabric, tuner(Collective.ALL_TO_ALL, gpus, 8 * 1024))
    assert small < 1.1 * (nccl.base_latency(Algorithm.DIRECT, Protocol.LL) + 2e-6)


def test_the_moe_all_to_all_sends_its_per_peer_sizes():
    """The alltoall dispatcher's exchange is an NCCL all-to-all of the rank's routed
    copies: the tuner gives the n-1 peers S/n each."""
    states = FabricStates.build(build_cluster(CLUSTERS["dgx-h100"], 1))
    lowered = states.lowering(Collective.ALL_TO_ALL, states.gpus, 8e6)
    assert len(lowered.routes) == 8 * 7
    assert np.allclose(lowered.sizes, 1e6 / nccl.efficiency(lowered.protocol))
