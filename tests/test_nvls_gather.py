"""NVLS all-gather and reduce-scatter (simulator/collectives/nvls.py) against
NCCL's own figures: its maintainer's bytes per GPU (NCCL issue #1083), a
measured ring reduce-scatter on one H100 server (NCCL issue #1047) that NVLS
does not beat there, and NCCL's rules for when NVLS may run (tuning.cc,
enqueue.cc: NCCL_MAX_NVLS_ARITY)."""

import pytest

from simulator.base.ir import Collective
from simulator.collectives import nccl
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.collectives.nvls import MAX_ARITY, nvls_bytes
from simulator.collectives.plan import AlgorithmUnavailable
from simulator.collectives.tuner import CollectiveError, Collectives, isolated_time
from simulator.network.fabric import Fabric, Transport
from topologies import CLUSTERS, build_cluster

GIB = 2**30
H100, GB200 = CLUSTERS["dgx-h100"], CLUSTERS["gb200-nvl72"]
GATHERS = (Collective.ALL_GATHER, Collective.REDUCE_SCATTER)


def fabric_of(spec, nodes):
    return Fabric(build_cluster(spec, nodes))


def timed(fabric, kind, size, algorithm=None, protocol=None):
    lowered = Collectives(fabric, algorithm, protocol)(kind, fabric.graph.graph["gpus"], size)
    return isolated_time(fabric, lowered), lowered


@pytest.mark.parametrize("n", [2, 4, 8, 32])
def test_bytes_each_way_are_the_maintainers(n):
    """NCCL issue #1083: all-gather sends S/N and receives S, reduce-scatter
    sends S and receives S/N; all-reduce S(n+1)/n each way (issue #212)."""
    assert nvls_bytes(Collective.ALL_GATHER, n, 1.0) == (pytest.approx(1 / n), 1.0)
    assert nvls_bytes(Collective.REDUCE_SCATTER, n, 1.0) == (1.0, pytest.approx(1 / n))
    up, down = nvls_bytes(Collective.ALL_REDUCE, n, 1.0)
    assert up == down == pytest.approx((n + 1) / n)
    with pytest.raises(AlgorithmUnavailable, match="not broadcast"):
        nvls_bytes(Collective.BROADCAST, n, 1.0)


@pytest.mark.parametrize("kind", GATHERS)
def test_forced_nvls_closed_form_on_h100(kind):
    """The busier direction carries S at the switch's NVLS rate, after NCCL's
    NVLS latency (one NVLink step) and the two wires."""
    fabric, size = fabric_of(H100, 1), 8 * GIB
    t, lowered = timed(fabric, kind, size, Algorithm.NVLS)
    rate = H100.nvlink_bandwidth * H100.nvlink_efficiency * H100.nvls_efficiency
    latency = (nccl.base_latency(Algorithm.NVLS, Protocol.SIMPLE)
               + nccl.step_latency(Algorithm.NVLS, Protocol.SIMPLE, Transport.NVLINK, False)
               + 2 * H100.nvlink_latency)
    assert lowered.algorithm is Algorithm.NVLS and lowered.protocol is Protocol.SIMPLE
    assert t == pytest.approx(latency + size / rate, rel=1e-9)


@pytest.mark.parametrize("kind", GATHERS)
def test_ring_beats_nvls_on_one_h100_server_as_measured(kind):
    """NCCL issue #1047: on one H100 server NVLS reduce-scatter is slower than
    the ring, whose busbw reaches 362.16 GB/s at 8 GiB; the simulated ring is
    within 5 % of that, NVLS below it, and the tuner keeps the ring."""
    fabric, size = fabric_of(H100, 1), 8 * GIB
    ring, _ = timed(fabric, kind, size, Algorithm.RING, Protocol.SIMPLE)
    forced, _ = timed(fabric, kind, size, Algorithm.NVLS)
    assert size / ring * 7 / 8 / 1e9 == pytest.approx(362.16, rel=0.05)
    assert forced > ring
    # NVLS's busier direction carries S against the ring's 7/8 S, at NVLS's efficiency
    ratio = 8 / 7 / H100.nvls_efficiency
    assert forced / ring == pytest.approx(ratio, rel=0.02)


@pytest.mark.parametrize("size", [2.0**k for k in range(10, 34, 2)])
@pytest.mark.parametrize("kind", GATHERS)
def test_the_tuner_never_takes_nvls_gathers_on_an_8_gpu_server(kind, size):
    """NCCL's model gives NVLS all-gather and reduce-scatter less bandwidth and
    more latency than the ring on 8 GPUs (tuning.cc), so it never picks them
    there without registered buffers; nor does the tuner here."""
    _, lowered = timed(fabric_of(H100, 1), kind, size)
    assert lowered.algorithm is Algorithm.RING


@pytest.mark.parametrize("kind", GATHERS)
def test_nvls_takes_mid_sizes_over_32_gpus_of_a_rack(kind):
    """Over 32 GPUs of an NVL72 rack a ring pays 31 steps, NVLS one (NCCL's
    model: its NVLS latency does not grow with the ranks), so NVLS takes small
    and mid sizes and the ring the largest, where its fewer bytes win."""
    fabric = fabric_of(GB200, 8)
    assert len(fabric.graph.graph["gpus"]) == 32
    assert timed(fabric, kind, 2**20)[1].algorithm is Algorithm.NVLS
    assert timed(fabric, kind, 2**26)[1].algorithm is Algorithm.NVLS
    assert timed(fabric, kind, 2**30)[1].algorithm is Algorithm.RING


@pytest.mark.parametrize("kind", GATHERS)
def test_no_nvls_gathers_beyond_ncclS_arity(kind):
    """enqueue.cc: NVLS runs collectives but all-reduce over at most
    NCCL_MAX_NVLS_ARITY (32) GPUs of a domain; a 72-GPU rack's all-reduce may."""
    fabric = fabric_of(GB200, 18)
    gpus = fabric.graph.graph["gpus"]
    assert len(gpus) == 72 > MAX_ARITY == 32
    tuner = Collectives(fabric)
    assert tuner.plan(kind, Algorithm.NVLS, gpus) is None
    assert tuner.plan(kind, Algorithm.NVLS, gpus[:32]) is not None
    assert tuner.plan(Collective.ALL_REDUCE, Algorithm.NVLS, gpus) is not None
    assert timed(fabric, kind, 2**20)[1].algorithm is Algorithm.RING


def test_nvls_gathers_need_one_nvswitch():
    """Across two DGX H100 servers there is no one switch: the tuner takes the
    ring, and forced NVLS fails as NCCL_ALGO=nvls does (NCCL issue #1670: "no
    algorithm/protocol available for function ReduceScatter")."""
    fabric = fabric_of(H100, 2)
    gpus = fabric.graph.graph["gpus"]
    assert Collectives(fabric).plan(Collective.ALL_GATHER, Algorithm.NVLS, gpus) is None
    assert Collectives(fabric)(Collective.ALL_GATHER, gpus, 2**20).algorithm is Algorithm.RING
    with pytest.raises(CollectiveError, match="nvls cannot run reduce_scatter over 16 GPUs"):
        Collectives(fabric, Algorithm.NVLS)(Collective.REDUCE_SCATTER, gpus, 2**20)
