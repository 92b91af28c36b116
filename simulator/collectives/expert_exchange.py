"""DeepEP's and HybridEP's dispatch and combine at the rates their kernels reach.

Megatron-Core's flex dispatcher (``moe_token_dispatcher_type: flex``) moves a
MoE layer's tokens with DeepEP's normal kernels (``moe_flex_dispatcher_backend:
deepep``, its default) or NVIDIA's HybridEP (``hybridep``, DeepEP's
``hybrid-ep`` branch). Neither is NCCL: each runs its own kernels on a few SMs,
and what they reach is well below the links' rate. Both projects publish it as
a *logical* bandwidth: the bytes a rank's kernel moves (every token it receives
over NVLink, its own included; every token it sends once to each node holding
its experts over RDMA, its own node included: DeepEP ``tests/test_internode.py``
``num_rdma_token_sent``, HybridEP ``tests/utils.py``
``count_rdma_send_from_routing_map``, which says so) over the kernel's time.

Here each published row is what it is physically: that logical bandwidth as a
share of the line rate (per direction) of the hop's link on the system it was
measured on (``Table.line``), for a hop (NVLink or RDMA), a size (the NVLink
hop's ranks, the RDMA hop's nodes) and an SM budget. On another GPU or link
the same share applies to that link's line rate (the kernels' design is the
same; the measured systems are the only ones published). Between rows the share
is interpolated linearly in size and SMs; outside them it is the nearest row's.

A call of ``size`` bytes (a rank's logical bytes, as ``workloads.strategies.
expert`` sizes each hop) over ``n`` ranks then takes ``size / (share x line)``
alone on an idle fabric: its flows are an all-to-all's ((n-1)/n of it leaves
the rank), their bytes scaled so that the bottleneck link's capacity (line rate
times the fabric's efficiency for NCCL's copies) gives that time
(``Plan.wire_scale``), so the kernel's extra time also loads the links other
calls share. No latency is added: the published rates are whole kernels' at
the sizes measured (4,096 tokens a rank), their fixed costs inside them.

DeepEP's SM budget: Megatron-Core's default of 20 (``set_deepep_num_sms``,
``token_dispatcher.py``: "DeepEP's historical mcore default"). Its Hopper
rows were measured at 24 (``num_sms = 24`` in DeepEP's tests) with NVLink, not
the SMs, the bottleneck (153 GB/s of H800's ~160), so they stand for 20 too.
On a faster link DeepEP is bound by its SMs: the NVLink hop is capped at 20
times the per-SM rate DeepEP reaches on B200, where the link is far from full
(``DEEPEP_PER_SM``). HybridEP's: its own default, 24 SMs in one NVLink domain
and 8 across nodes (``hybrid_ep/config.cuh``, ``sms_dispatch``).

Left out: FP8 dispatch (Megatron-Core dispatches the activations' type; DeepEP
publishes only its FP8 dispatch row, used here for BF16 too: a lower bound, as
a token's fixed work is spread over fewer bytes), calls far smaller than the
rows' (their latency), and DeepEP's RDMA hop at SM budgets other than 24.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import Plan, hop_classes
from simulator.network.fabric import Fabric, Transport

DISPATCH, COMBINE = "dispatch", "combine"
KINDS = {Collective.DEEPEP_DISPATCH: (Algorithm.DEEPEP, DISPATCH),
         Collective.DEEPEP_COMBINE: (Algorithm.DEEPEP, COMBINE),
         Collective.HYBRIDEP_DISPATCH: (Algorithm.HYBRIDEP, DISPATCH),
         Collective.HYBRIDEP_COMBINE: (Algorithm.HYBRIDEP, COMBINE)}
BACKENDS = {"deepep": Algorithm.DEEPEP, "hybridep": Algorithm.HYBRIDEP}
GB = 1e9


@dataclass(frozen=True)
class Row:
    """One published row: logical GB/s of the dispatch and the combine kernel."""

    size: int  # the NVLink hop's ranks, or the RDMA hop's nodes (EP / 8)
    sms: int
    dispatch: float
    combine: float


@dataclass(frozen=True)
class Table:
    """A hop's published rows and the line rate of the link they were measured on."""

    line: float  # bytes/s per direction
    rows: tuple[Row, ...]
    source: str


# DeepEP README (deepseek-ai/DeepEP @dd758ca docs/legacy.md "Normal kernels with
# NVLink and RDMA forwarding", the README's table since 2025-06): H800, ~160 GB/s
# NVLink (datasheet 400 GB/s both ways: 200 each), CX7 400 Gb/s (50 GB/s); 4,096
# tokens a rank, hidden 7168, top-4 groups, top-8 of 256 experts, FP8 dispatch,
# BF16 combine; 24 SMs.
_DEEPEP_NVL = Table(200e9, (Row(8, 24, 153.0, 158.0),),  # Intranode, EP 8
                    "DeepEP README, H800 intranode EP 8 (24 SMs)")
_DEEPEP_RDMA = Table(50e9, (Row(2, 24, 43.0, 43.0),   # Internode, EP 16
                            Row(4, 24, 58.0, 57.0),   # Internode, EP 32
                            Row(8, 24, 51.0, 50.0)),  # Internode, EP 64
                     "DeepEP README, H800 + CX7 internode EP 16/32/64 (24 SMs)")
# HybridEP (DeepEP branch hybrid-ep @94a9f8f docs/README_Hybrid-EP.md), "Torch API"
# columns (what Megatron-Core calls), BF16 dispatch and combine; 4,096 tokens a
# rank, hidden 7168, top 8, uniform random router, 8 experts a rank.
# GB200 (NVLink 5: 900 GB/s per direction), one NVL72 rack, ranks 8-36, 16 and 32 SMs:
_HYBRIDEP_NVL = Table(900e9, (
    Row(8, 16, 550.10, 538.44), Row(16, 16, 472.84, 474.48), Row(24, 16, 441.89, 444.40),
    Row(32, 16, 485.50, 423.19), Row(36, 16, 469.96, 418.27),
    Row(8, 32, 545.71, 568.94), Row(16, 32, 523.48, 521.55), Row(24, 32, 507.32, 483.76),
    Row(32, 32, 484.22, 464.54), Row(36, 32, 479.02, 447.89)),
    "HybridEP README, GB200 NVL72 ranks 8-36 (16/32 SMs)")
# H100 with 400 Gb/s InfiniBand ("IB Bandwidth"), ranks 16/32/64 (2/4/8 nodes), 4/8/16 SMs:
_HYBRIDEP_RDMA = Table(50e9, (
    Row(2, 4, 37.08, 42.47), Row(4, 4, 44.88, 43.60), Row(8, 4, 40.63, 41.00),
    Row(2, 8, 57.74, 56.96), Row(4, 8, 46.54, 50.68), Row(8, 8, 41.46, 47.68),
    Row(2, 16, 54.47, 53.35), Row(4, 16, 47.36, 52.53), Row(8, 16, 41.24, 46.57)),
    "HybridEP README, H100 + IB ranks 16/32/64 (4/8/16 SMs)")
TABLES = {(Algorithm.DEEPEP, Transport.NVLINK): _DEEPEP_NVL,
          (Algorithm.DEEPEP, Transport.NET): _DEEPEP_RDMA,
          (Algorithm.HYBRIDEP, Transport.NVLINK): _HYBRIDEP_NVL,
          (Algorithm.HYBRIDEP, Transport.NET): _HYBRIDEP_RDMA}
DEEPEP_SMS = 20  # Megatron-Core's default (token_dispatcher.py, set_deepep_num_sms)
HYBRIDEP_SMS = {Transport.NVLINK: 24, Transport.NET: 8}  # hybrid_ep/config.cuh defaults
# DeepEP on B200 (HybridEP README's DeepEP rows, Torch API, EP 8, 24 SMs): BF16 dispatch
# 494 GB/s, combine 420 GB/s of NVLink 5's 900: bound by its SMs, 1/24 of that each
DEEPEP_PER_SM = {DISPATCH: 494.0 / 24 * GB, COMBINE: 420.0 / 24 * GB}


def sms(algorithm: Algorithm, transport: Transport, domains: int = 1) -> int:
    """The SMs the backend's kernel runs on: DeepEP's Megatron-Core default; HybridEP's
    own, 24 in one NVLink domain and 8 once its group spans ``domains`` > 1."""
    if algorithm is Algorithm.DEEPEP:
        return DEEPEP_SMS
    return HYBRIDEP_SMS[Transport.NVLINK if domains == 1 else Transport.NET]


def share(algorithm: Algorithm, transport: Transport, size: int, kernel: str,
          budget: int) -> float:
    """The logical bandwidth a kernel reaches as a share of its hop's line rate:
    the published rows interpolated in ``size`` (ranks of an NVLink hop, nodes of
    an RDMA hop) and in the SM ``budget``, clamped to the rows' range.

    >>> round(share(Algorithm.DEEPEP, Transport.NET, 4, DISPATCH, 24), 3)
    1.16
    >>> round(share(Algorithm.HYBRIDEP, Transport.NVLINK, 8, COMBINE, 24), 3)
    0.615
    """
    table = TABLES[(algorithm, transport)]
    levels = sorted({row.sms for row in table.rows})
    at_level = []
    for level in levels:
        rows = sorted((r for r in table.rows if r.sms == level), key=lambda r: r.size)
        at_level.append(float(np.interp(size, [r.size for r in rows],
                                        [getattr(r, kernel) for r in rows])))
    return float(np.interp(budget, levels, at_level)) * GB / table.line


def rate(algorithm: Algorithm, transport: Transport, size: int, kernel: str, line: float,
         domains: int = 1) -> float:
    """Logical bytes/s the kernel reaches on a hop of ``line`` bytes/s: its share of
    the line rate, DeepEP's NVLink hop at most its SMs' rate."""
    budget = sms(algorithm, transport, domains)
    out = share(algorithm, transport, size, kernel, budget) * line
    if algorithm is Algorithm.DEEPEP and transport is not Transport.NET:
        out = min(out, budget * DEEPEP_PER_SM[kernel])
    return out


def bottleneck(fabric: Fabric, routes: Sequence[tuple[int, ...]]) -> tuple[float, float]:
    """(line rate, capacity) of the lowest-capacity link the routes cross."""
    links = sorted({link for route in routes for link in route},
                   key=lambda link: (fabric.capacity[link], link))
    link = links[0]
    data = fabric.graph.edges[fabric.ends(link)]
    return float(data["bandwidth"]), float(fabric.capacity[link])


def expert_exchange(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """The flows of a DeepEP or HybridEP dispatch or combine (``KINDS``) over
    ``gpus``: an all-to-all's, at the kernel's rate on this hop. A group crossing
    servers is an RDMA hop (one rank per node: its size is the nodes), else an
    NVLink hop (its size: its ranks)."""
    algorithm, kernel = KINDS[kind]
    pairs = [(a, b) for a in gpus for b in gpus if a != b]
    routes, intra, inter = hop_classes(fabric, pairs)
    transport = Transport.NET if inter is not None else Transport.NVLINK
    n = len(gpus)
    line, capacity = bottleneck(fabric, routes)
    achieved = rate(algorithm, transport, n, kernel, line,
                    domains=n if transport is Transport.NET else 1)
    servers = len({fabric.node_of(g) for g in gpus})
    wire = inter if inter is not None else intra[1]
    return Plan(algorithm, routes, [1.0 / n] * len(routes), [(transport, 1, wire)], 1,
                servers > 1, wire_scale=n / (n - 1) * capacity / achieved)


NCCL_ALL_TO_ALL = ("NCCL all-to-all as n-1 point-to-point sends and receives at the "
                   "per-peer size, each under the protocol NCCL's p2p rule picks (LL up to "
                   "16 KiB a channel, Simple above; collectives.p2p)")


def describe(kinds: set) -> str:
    """The summary's ``token_exchange`` line: which backend's published rates time
    the flex dispatcher's exchanges, and how NCCL's all-to-all runs ("" where the
    run has neither)."""
    used = sorted({KINDS[k][0].value for k in kinds if k in KINDS})
    parts = [NCCL_ALL_TO_ALL] if Collective.ALL_TO_ALL in kinds else []
    for name in used:
        algorithm = Algorithm(name)
        sources = "; ".join(TABLES[(algorithm, t)].source for t in (Transport.NVLINK,
                                                                    Transport.NET))
        budget = (f"{DEEPEP_SMS} SMs" if algorithm is Algorithm.DEEPEP else
                  f"{HYBRIDEP_SMS[Transport.NVLINK]} SMs in one NVLink domain, "
                  f"{HYBRIDEP_SMS[Transport.NET]} across nodes")
        parts.append(f"{name} dispatch and combine at their published achieved bandwidths "
                     f"as shares of the hop's line rate ({sources}), {budget}")
    return "; ".join(parts)
