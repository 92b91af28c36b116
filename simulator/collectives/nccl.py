"""NCCL's algorithms, protocols and latency model (pure functions and tables).

Figures are NCCL's own cost model (``src/graph/tuning.cc``, NCCL 2.23-2.28):
a collective costs a base latency per (algorithm, protocol), plus a per-step
latency that depends on the transport the step crosses (NVLink, PCI or the
network), plus its bytes at the protocol's share of the link bandwidth:

    base latency (us)      LL    LL128  Simple
      ring                 6.6   14.0   8.4
      tree                 6.8   14.0   8.4
      nvls                  -     -     23.0
      pat                   -     -     8.0
    per-step latency (us)  LL    LL128  Simple
      ring   NVLink        0.6   1.9    3.4
             PCI           1.0   2.5    5.7
             network       2.7   4.0    14.0
      tree   NVLink        0.6   1.25   4.0
             PCI           1.0   1.9    4.0
             network       5.0   8.5    14.0
      nvls   NVLink         -     -     25.0
      pat    network        -     -     4.0 (the tree's 14 / 3.5)

LL sends a 4-byte flag with every 4 bytes of data and NCCL's model gives it a
quarter of the bus bandwidth; LL128 uses 120 of every 128 bytes (NCCL: 0.92);
Simple uses the full bandwidth but has the highest per-step latency.
clustersim sends ``bytes / efficiency`` over the links, so a protocol's
overhead also loads the links other transfers share.

What changes past a few servers, as NCCL models it:

- a ring that crosses servers posts a network operation every step, so its
  intra-server steps cost at least the network post overhead (``NET_OVERHEAD``,
  1 us on Intel and Arm hosts, three times that under Simple);
- with one GPU per server nothing hides the network latency of a ring step, so
  it is the tree's (LL 5.0, LL128 8.5 us instead of 2.7 and 4.0);
- a multi-server Simple ring all-reduce pays 1.4 times its latency once each
  rank's share per channel reaches 64 bytes ("plateau effect of ring",
  ``RING_PLATEAU``; 1.9 before Ampere, which no GPU file here is);
- with one GPU per server, all-gather and reduce-scatter may run PAT
  (``simulator.collectives.pat``): log2 of the servers network steps instead of
  one per server, at 0.75 of the bandwidth, plus 2.8 us per rank.
"""

from __future__ import annotations

from simulator.base.ir import Symbol
from simulator.network.fabric import Transport


class Algorithm(Symbol):
    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    PAT = "pat"  # parallel aggregated trees: all-gather, reduce-scatter at one GPU per server
    DIRECT = "direct"  # all-to-all and point-to-point: every pair talks directly
    COLLNET = "collnet"  # in-network reduction (InfiniBand SHARP), NCCL's CollNet Direct
    # not NCCL: the flex dispatcher's own kernels (simulator.collectives.expert_exchange)
    DEEPEP = "deepep"
    HYBRIDEP = "hybridep"


class Protocol(Symbol):
    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


US = 1e-6
_BASE = {
    Algorithm.RING: {Protocol.LL: 6.6, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.TREE: {Protocol.LL: 6.8, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.NVLS: {Protocol.SIMPLE: 23.0},
    Algorithm.PAT: {Protocol.SIMPLE: 8.0},  # tuning.cc: PAT runs Simple only
    Algorithm.COLLNET: {Protocol.SIMPLE: 0.0},  # tuning.cc: CollNet runs Simple only
    # DeepEP, HybridEP: their published rates are whole kernels', fixed costs included
    # (expert_exchange); one protocol, their own (named Simple here)
    Algorithm.DEEPEP: {Protocol.SIMPLE: 0.0},
    Algorithm.HYBRIDEP: {Protocol.SIMPLE: 0.0},
}
_STEP = {
    Algorithm.RING: {
        Transport.NVLINK: {Protocol.LL: 0.6, Protocol.LL128: 1.9, Protocol.SIMPLE: 3.4},
        Transport.PCI: {Protocol.LL: 1.0, Protocol.LL128: 2.5, Protocol.SIMPLE: 5.7},
        Transport.NET: {Protocol.LL: 2.7, Protocol.LL128: 4.0, Protocol.SIMPLE: 14.0},
    },
    Algorithm.TREE: {
        Transport.NVLINK: {Protocol.LL: 0.6, Protocol.LL128: 1.25, Protocol.SIMPLE: 4.0},
        Transport.PCI: {Protocol.LL: 1.0, Protocol.LL128: 1.9, Protocol.SIMPLE: 4.0},
        Transport.NET: {Protocol.LL: 5.0, Protocol.LL128: 8.5, Protocol.SIMPLE: 14.0},
    },
    Algorithm.NVLS: {Transport.NVLINK: {Protocol.SIMPLE: 25.0}},
    # tuning.cc: log2(servers) * interLat / 3.5, interLat the tree's at one GPU per server
    Algorithm.PAT: {Transport.NET: {Protocol.SIMPLE: 14.0 / 3.5}},
    Algorithm.COLLNET: {Transport.NVLINK: {Protocol.SIMPLE: 3.7},
                        Transport.PCI: {Protocol.SIMPLE: 3.7},
                        Transport.NET: {Protocol.SIMPLE: 31.0}},
    Algorithm.DEEPEP: {Transport.NVLINK: {Protocol.SIMPLE: 0.0},
                       Transport.NET: {Protocol.SIMPLE: 0.0}},
    Algorithm.HYBRIDEP: {Transport.NVLINK: {Protocol.SIMPLE: 0.0},
                         Transport.NET: {Protocol.SIMPLE: 0.0}},
}
_EFFICIENCY = {Protocol.LL: 0.25, Protocol.LL128: 0.92, Protocol.SIMPLE: 1.0}

# Ring pipeline fill. A ring call moves its data in chunks through its pipelined
# steps; each channel holds one step slot of its protocol's buffer in flight
# (NCCL_BUFFSIZE 4 MiB / NCCL_STEPS 8 = 512 KiB for Simple; LL128's buffer is of
# the same order, LL's is 256 KiB), NCCL runs one channel per NVLink of a GPU
# (12 on A100, 18 on H100), and a channel moves at about one NVLink's rate.
# Until the first chunk has crossed every step the ring runs below its
# bandwidth: each step adds one chunk's time on one link, the chunk being the
# slot or, for small calls, the call's share per rank and channel.
SLOT_BYTES = {Protocol.SIMPLE: 512 * 1024, Protocol.LL128: 512 * 1024,
              Protocol.LL: 256 * 1024 / 8}
NVLINK_LINK_BANDWIDTH = 25e9  # bytes/s per NVLink (NVLink3 and NVLink4), per direction


def pipeline_fill(protocol: Protocol, ranks: int, channels: int, steps: int,
                  size: float) -> float:
    """Seconds a ring call of ``size`` bytes spends filling its pipeline:
    ``steps * min(slot, size / (ranks * channels)) / NVLINK_LINK_BANDWIDTH``. More
    channels (more NVLink bandwidth) only make the chunks smaller.

    >>> round(pipeline_fill(Protocol.SIMPLE, 8, 12, 14, 134217728) * 1e6, 1)
    293.6
    """
    if size <= 0 or channels <= 0:
        return 0.0
    chunk = min(SLOT_BYTES[protocol], size / (ranks * channels))
    return steps * chunk / NVLINK_LINK_BANDWIDTH
NET_OVERHEAD = 1.0  # us: tuning.cc getNetOverhead, Intel x86 and Arm hosts (AMD: 2.0)
NET_OVERHEAD_SIMPLE = 3  # tuning.cc: "if (p == NCCL_PROTO_SIMPLE) netOverhead *= 3"
RING_PLATEAU = 1.4  # tuning.cc: ring Simple all-reduce latency factor across servers (sm80+)
RING_PLATEAU_BYTES = 64  # ... once bytes / (channels * ranks) reach this
PAT_PER_RANK = 2.8e-6  # s: tuning.cc, PAT's linear part ("nRanks * 2.8")
PAT_EFFICIENCY = 0.75  # tuning.cc: PAT's bus bandwidth is 0.75 of the ring's


def efficiency(protocol: Protocol) -> float:
    """Share of link bandwidth that carries data under ``protocol``."""
    return _EFFICIENCY[protocol]


def supports(algorithm: Algorithm, protocol: Protocol) -> bool:
    if algorithm is Algorithm.DIRECT:
        return True
    return protocol in _BASE[algorithm]


def base_latency(algorithm: Algorithm, protocol: Protocol) -> float:
    """Seconds every call pays once (kernel launch, synchronisation)."""
    if algorithm is Algorithm.DIRECT:
        algorithm = Algorithm.RING  # NCCL prices p2p like a one-step ring
    return _BASE[algorithm][protocol] * US


def step_latency(algorithm: Algorithm, protocol: Protocol, transport: Transport,
                 multi_node: bool, one_per_server: bool = False) -> float:
    """Seconds of one pipeline step across ``transport``: a ring's steps inside a
    server cost at least the network post overhead when it crosses servers, and
    its network steps the tree's latency with one GPU per server (NCCL 2.23+).

    >>> round(step_latency(Algorithm.RING, Protocol.SIMPLE, Transport.NET, True) / US, 6)
    14.0
    >>> round(step_latency(Algorithm.RING, Protocol.LL, Transport.NET, True, True) / US, 6)
    5.0
    >>> round(step_latency(Algorithm.RING, Protocol.LL, Transport.NVLINK, True) / US, 6)
    1.0
    """
    if algorithm is Algorithm.DIRECT:
        algorithm = Algorithm.RING
    table = _STEP[Algorithm.TREE if (algorithm is Algorithm.RING and one_per_server
                                     and transport is Transport.NET) else algorithm]
    if transport not in table:
        transport = Transport.NVLINK if Transport.NVLINK in table else Transport.NET
    value = table[transport][protocol]
    if algorithm is Algorithm.RING and multi_node and transport is not Transport.NET:
        value = max(value, NET_OVERHEAD * (NET_OVERHEAD_SIMPLE if protocol is Protocol.SIMPLE
                                           else 1))
    return value * US
