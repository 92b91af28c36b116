"""NCCL's point-to-point protocol and channels: how an all-to-all's sends run.

NCCL has no all-to-all kernel of its own: PyTorch's ``all_to_all_single``
(what Megatron-Core's alltoall dispatcher calls) posts, inside one
``ncclGroupStart``/``ncclGroupEnd``, a send and a receive to every peer; NCCL
runs the n-1 pairs of the group as point-to-point work in one kernel
(``src/enqueue.cc``, the p2p schedule's rounds), each peer's bytes split over a
few channels. ``simulator.collectives.direct`` lays those n-1 transfers out as
flows at the per-peer size (S/n each); this module is NCCL's rule for the
protocol each one runs, from ``addP2pToPlan`` (``src/enqueue.cc``, NCCL 2.29):

- a peer's bytes go over ``channels`` channels: at least ``min_part`` bytes a
  channel (half a p2p chunk across nodes, an eighth inside one), at most the
  group's per-peer channels (``p2pnChannelsPerPeer``, halved until they times
  the ranks fit in the p2p channels), doubled while a channel's part exceeds
  ``max_part`` (a chunk across nodes, 32 chunks inside one);
- LL carries the transfer when its bytes are at most ``channels x
  P2P_LL_THRESHOLD`` (16 KiB a channel), Simple above: NCCL does not try the
  two and take the faster, as the tuner does for collectives.

The channels come from the topology (``src/graph/paths.cc``): two per NVLink a
GPU has to an NVLink peer (``ncclTopoGetNchannels``), at least one per NIC and
enough to carry the NIC at ``P2P_PER_CHANNEL_NET_BW`` each to a network peer;
the p2p channels are NCCL's channels (one per NVLink here,
``plan.nvlink_channels``), each rounded up to a power of two, at most
``MAXCHANNELS``. Every peer of a group up to 64 ranks runs in one wave
(``p2pnChannels / channels x 8`` at once, ``NCCL_MAX_DEV_WORK_P2P_PER_BATCH``),
so the call pays one step's latency, as ``direct`` charges.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.collectives.nccl import Protocol
from simulator.collectives.plan import nvlink_channels
from simulator.network.fabric import Fabric

P2P_LL_THRESHOLD = 16384  # bytes a channel: enqueue.cc NCCL_PARAM(P2pLLThreshold, 16384)
P2P_NET_CHUNKSIZE = 1 << 17  # init.cc NCCL_PARAM(P2pNetChunkSize): 128 KiB across nodes
P2P_NVL_CHUNKSIZE = 1 << 19  # init.cc NCCL_PARAM(P2pNvlChunkSize): 512 KiB over NVLink
P2P_PER_CHANNEL_NET_BW = 14e9  # bytes/s: paths.cc NCCL_PARAM(P2pPerChannelNetBw, 14 GB/s)
MAXCHANNELS = 64  # device.h


def pow2_up(x: int) -> int:
    """The least power of two at least ``x`` (NCCL's ``pow2Up``)."""
    return 1 << max(0, math.ceil(math.log2(max(x, 1))))


def channels_per_peer(nbytes: float, ranks: int, multi_node: bool, per_peer: int,
                      p2p_channels: int) -> int:
    """Channels one peer's ``nbytes`` run over (``addP2pToPlan``).

    >>> channels_per_peer(64 * 2**20, 8, False, 64, 32)  # 64 MiB to an NVLink peer
    4
    >>> channels_per_peer(20000, 8, False, 64, 32)
    1
    >>> channels_per_peer(2**20, 64, True, 4, 32)  # 1 MiB to a peer across nodes
    4
    """
    if nbytes <= 0:
        return 1
    low = per_peer
    while low * ranks > p2p_channels and low > 1:
        low //= 2
    chunk = P2P_NET_CHUNKSIZE if multi_node else P2P_NVL_CHUNKSIZE
    min_part, max_part = (chunk // 2, chunk) if multi_node else (chunk // 8, chunk * 32)
    channels = min(low, math.ceil(nbytes / min_part))
    part = max(min_part, math.ceil(nbytes / channels))
    while part > max_part and channels <= per_peer // 2:
        channels *= 2
        part = math.ceil(nbytes / channels)
    return channels


def protocol(nbytes: float, channels: int) -> Protocol:
    """LL up to 16 KiB a channel, Simple above (``addP2pToPlan``).

    >>> protocol(16384, 1).value, protocol(16385, 1).value, protocol(32768, 2).value
    ('ll', 'simple', 'll')
    """
    return Protocol.LL if nbytes <= channels * P2P_LL_THRESHOLD else Protocol.SIMPLE


def topology_channels(fabric: Fabric, gpus: Sequence[str]) -> tuple[int, int]:
    """(per-peer channels, p2p channels) of a group: ``ncclTopoGetNchannels``'s
    least over the group's peers (two per NVLink to an NVLink peer; to a network
    peer one per NIC, at least enough for the NIC's rate at 14 GB/s a channel),
    NCCL's channels (one per NVLink); both rounded up to powers of two, then the
    per-peer channels halved across nodes until the group's peers fit the p2p
    channels eight to a channel (``ncclTopoComputeP2pChannels``)."""
    graph, first = fabric.graph, gpus[0]
    links = nvlink_channels(fabric, first)
    p2p = min(MAXCHANNELS, pow2_up(links))
    per_peer = 2 * links
    if len({fabric.node_of(g) for g in gpus}) > 1:
        nic = graph.nodes[first].get("nic")
        rate = max((float(d.get("bandwidth", 0.0)) for _, _, d in graph.out_edges(nic, data=True)
                    if d.get("link") == "network"), default=0.0) if nic is not None else 0.0
        per_peer = min(per_peer, max(1, math.ceil(rate / P2P_PER_CHANNEL_NET_BW)))
        per_peer = pow2_up(per_peer)
        while per_peer * math.ceil(len(gpus) / 8) > p2p and per_peer > 1:
            per_peer //= 2
        return per_peer, p2p
    return pow2_up(per_peer), p2p


def nccl_protocol(fabric: Fabric, gpus: Sequence[str], per_peer_bytes: float) -> Protocol:
    """The protocol NCCL runs each of a group's point-to-point transfers of
    ``per_peer_bytes`` under."""
    per_peer, p2p = topology_channels(fabric, gpus)
    multi = len({fabric.node_of(g) for g in gpus}) > 1
    return protocol(per_peer_bytes, channels_per_peer(per_peer_bytes, len(gpus), multi,
                                                      per_peer, p2p))
