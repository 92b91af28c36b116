"""What every collective algorithm returns, and the pieces they share.

A ``Plan`` is the flows (route, payload bytes for a 1-byte call) an algorithm
puts on the fabric and the pipeline steps it pays latency for; a protocol then
turns it into wire bytes and a latency (``simulator.collectives.tuner``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from simulator.collectives import nccl
from simulator.collectives.nccl import Algorithm
from simulator.network.fabric import Fabric, Transport


class AlgorithmUnavailable(ValueError):
    """The algorithm cannot run this collective on this group."""


@dataclass
class Plan:
    """Flows of one algorithm for one call, before a protocol is chosen."""

    algorithm: Algorithm
    routes: list[tuple[int, ...]]
    payload: list[float]
    steps: list[tuple[Transport, int, float]]  # (transport, count, wire latency per step)
    channels: int
    multi_node: bool
    pipelined_steps: int = 1  # steps a lock-step ring would run
    wire_scale: float = 1.0  # extra bytes factor (NVLS switch efficiency)
    rates: np.ndarray | None = field(default=None, repr=False)
    signature: tuple | None = field(default=None, repr=False)  # tuner.signature's cache
    ranks: int = 0
    pipeline_channels: int = 0  # NCCL channels whose ring pipeline fills (0: not modelled)
    one_per_server: bool = False  # every member on its own server (NCCL's ppn == 1)
    fixed_latency: float = 0.0  # seconds beyond base and steps (PAT's per-rank part)
    plateau: bool = False  # a multi-server ring all-reduce (nccl.RING_PLATEAU under Simple)


def channels_for(fabric: Fabric, gpus: Sequence[str]) -> int:
    """NCCL-style channel count: the NICs each server brings (1 inside a server)."""
    nics: dict[int, set[str]] = {}
    for gpu in gpus:
        nics.setdefault(fabric.node_of(gpu), set()).add(fabric.graph.nodes[gpu].get("nic"))
    if len(nics) == 1:
        return 1
    return min(len(v) for v in nics.values())


def nics_of(fabric: Fabric, gpus: Sequence[str]) -> list[object]:
    """The NIC each GPU's traffic leaves its server through."""
    return [fabric.graph.nodes[g].get("nic") for g in gpus]


def channel_runs(nodes: Sequence[int], channels: int,
                 nics: Sequence[object] | None = None) -> list[list[list[int]]]:
    """Each channel's run of members (indices) through each server, servers in
    the order their members first appear.

    A server's members are grouped by NIC (``nics[i]``: member i's; default a
    NIC each), and channel c's run starts at the c-th group: it enters the server
    through NIC c and (a ring) leaves through NIC c-1, so with one channel per NIC
    every NIC carries one channel each way, however many GPUs share a NIC (NCCL
    binds each channel to a NIC; rotating by member instead put two channels on
    one NIC where two GPUs share it).

    >>> channel_runs([0, 0, 0, 0, 1, 1, 1, 1], 2, ["a", "a", "b", "b", "c", "c", "d", "d"])
    [[[0, 1, 2, 3], [4, 5, 6, 7]], [[2, 3, 0, 1], [6, 7, 4, 5]]]
    """
    blocks: dict[int, dict[object, list[int]]] = {}
    for member, node in enumerate(nodes):
        nic = member if nics is None else nics[member]
        blocks.setdefault(node, {}).setdefault(nic, []).append(member)
    out = []
    for c in range(channels):
        runs = []
        for groups in blocks.values():
            ordered = list(groups.values())
            shift = c % len(ordered)
            runs.append([m for group in ordered[shift:] + ordered[:shift] for m in group])
        out.append(runs)
    return out


def nvlink_channels(fabric: Fabric, gpu: str) -> int:
    """NCCL's channels on ``gpu``: one per NVLink (its NVLink bandwidth over one
    link's), at least one."""
    graph = fabric.graph
    total = sum(float(d.get("bandwidth", 0.0)) for _, _, d in graph.out_edges(gpu, data=True)
                if d.get("link") == "nvlink")
    return max(1, round(total / nccl.NVLINK_LINK_BANDWIDTH))


def hop_classes(fabric: Fabric, hops: Sequence[tuple[str, str]]):
    """Routes of ``hops``, the worst intra-server hop (transport, wire latency) and
    the worst inter-server wire latency (None when no hop leaves a server)."""
    routes: list[tuple[int, ...]] = []
    intra: tuple[Transport, float] = (Transport.NVLINK, 0.0)
    inter: float | None = None
    for a, b in hops:
        route = fabric.route(a, b)
        routes.append(route.links)
        if route.transport is Transport.NET:
            inter = max(inter or 0.0, route.latency)
        elif route.latency >= intra[1]:
            intra = (route.transport, route.latency)
    return routes, intra, inter
