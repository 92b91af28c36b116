"""PAT, NCCL's Parallel Aggregated Trees (all-gather, reduce-scatter; NCCL 2.23+).

- pat: with one GPU per server (a data-parallel group under 8-way tensor
  parallelism, say), a ring pays one network step per server, which at a
  thousand servers is milliseconds of latency. PAT, a variant of the Bruck
  algorithm, needs log2(N) network steps: in round k each rank sends the
  2^k shards it holds to the rank 2^k places away (all-gather; reduce-scatter
  runs it backwards), so every rank still sends and receives (n-1)/n S.
  NCCL enables it by default only at one GPU per server (``ncclPatEnable``) and
  runs it under Simple; its tuner gives it 0.75 of the ring's bus bandwidth and
  a latency of log2(N) steps of a third of the tree's network latency plus a
  part still linear in the ranks, 2.8 us each (``tuning.cc``; ``nccl``).
  The flows of all rounds are put on the fabric at once, as the ring's are:
  each rank's NIC carries its (n-1)/n S, and the longer hops of later rounds
  cross the spines.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives import nccl
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import AlgorithmUnavailable, Plan, hop_classes
from simulator.network.fabric import Fabric, Transport


def bruck_rounds(n: int) -> list[tuple[int, int]]:
    """(distance, shards sent) of each round of a Bruck all-gather over ``n``
    ranks: round k sends min(2^k, n - 2^k) shards 2^k places away.

    >>> bruck_rounds(6)
    [(1, 1), (2, 2), (4, 2)]
    """
    return [(1 << k, min(1 << k, n - (1 << k))) for k in range(math.ceil(math.log2(n)))]


def pat(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """Bruck all-gather (or reduce-scatter) over one GPU per server."""
    if kind not in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER):
        raise AlgorithmUnavailable(f"pat runs all_gather and reduce_scatter, not {kind.value}")
    n = len(gpus)
    if len({fabric.node_of(g) for g in gpus}) != n or n < 2:
        raise AlgorithmUnavailable("pat needs one GPU on each of two or more servers")
    rounds = bruck_rounds(n)
    hops, payload = [], []
    for distance, shards in rounds:
        for r in range(n):
            hops.append((gpus[r], gpus[(r - distance) % n]))
            payload.append(shards * size / n)
    routes, _, inter = hop_classes(fabric, hops)
    return Plan(Algorithm.PAT, routes, payload, [(Transport.NET, len(rounds), inter or 0.0)],
                1, True, wire_scale=1 / nccl.PAT_EFFICIENCY, ranks=n, one_per_server=True,
                fixed_latency=n * nccl.PAT_PER_RANK)
