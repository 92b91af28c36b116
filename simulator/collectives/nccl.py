"""NCCL's algorithms, protocols and latency model (pure functions and tables).

Figures are NCCL's own cost model (``src/graph/tuning.cc``, NCCL 2.18-2.20):
a collective costs a base latency per (algorithm, protocol), plus a per-step
latency that depends on the transport the step crosses (NVLink, PCI or the
network), plus its bytes at the protocol's share of the link bandwidth:

    base latency (us)      LL    LL128  Simple
      ring                 6.6   14.0   8.4
      tree                 6.8   14.0   8.4
      nvls                  -     -     23.0
    per-step latency (us)  LL    LL128  Simple
      ring   NVLink        0.6   1.9    3.4
             PCI           1.0   2.5    5.7
             network       2.7   4.0    14.0
      tree   NVLink        0.6   1.25   4.0
             PCI           1.0   1.9    4.0
             network       5.0   8.5    14.0
      nvls   NVLink         -     -     25.0

LL sends a 4-byte flag with every 4 bytes of data and NCCL's model gives it a
quarter of the bus bandwidth; LL128 uses 120 of every 128 bytes (NCCL: 0.92);
Simple uses the full bandwidth but has the highest per-step latency. With
several servers, LL's intra-node step latency is 1.8x (NCCL does the same).
clustersim sends ``bytes / efficiency`` over the links, so a protocol's
overhead also loads the links other transfers share.
"""

from __future__ import annotations

from simulator.base.ir import Symbol
from simulator.network.fabric import Transport


class Algorithm(Symbol):
    RING = "ring"
    TREE = "tree"
    NVLS = "nvls"
    DIRECT = "direct"  # all-to-all and point-to-point: every pair talks directly
    COLLNET = "collnet"  # in-network reduction (InfiniBand SHARP), NCCL's CollNet Direct


class Protocol(Symbol):
    LL = "ll"
    LL128 = "ll128"
    SIMPLE = "simple"


US = 1e-6
_BASE = {
    Algorithm.RING: {Protocol.LL: 6.6, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.TREE: {Protocol.LL: 6.8, Protocol.LL128: 14.0, Protocol.SIMPLE: 8.4},
    Algorithm.NVLS: {Protocol.SIMPLE: 23.0},
    Algorithm.COLLNET: {Protocol.SIMPLE: 0.0},  # tuning.cc: CollNet runs Simple only
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
    Algorithm.COLLNET: {Transport.NVLINK: {Protocol.SIMPLE: 3.7},
                        Transport.PCI: {Protocol.SIMPLE: 3.7},
                        Transport.NET: {Protocol.SIMPLE: 31.0}},
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
LL_MULTI_NODE_FACTOR = 1.8


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
                 multi_node: bool) -> float:
    """Seconds of one pipeline step across ``transport``.

    >>> round(step_latency(Algorithm.RING, Protocol.SIMPLE, Transport.NET, True) / US, 6)
    14.0
    """
    if algorithm is Algorithm.DIRECT:
        algorithm = Algorithm.RING
    table = _STEP[algorithm]
    if transport not in table:
        transport = Transport.NVLINK
    value = table[transport][protocol]
    if multi_node and protocol is Protocol.LL and transport is not Transport.NET:
        value *= LL_MULTI_NODE_FACTOR
    return value * US


def ring_latency(protocol: Protocol, intra_steps: int, inter_steps: int,
                 intra: Transport, multi_node: bool) -> float:
    """Base plus per-step latency of a ring pass with the given step counts."""
    return (base_latency(Algorithm.RING, protocol)
            + intra_steps * step_latency(Algorithm.RING, protocol, intra, multi_node)
            + inter_steps * step_latency(Algorithm.RING, protocol, Transport.NET, multi_node))
