"""NCCL's double binary tree (all-reduce).

- tree: all-reduce. NCCL's double binary tree over servers, each tree carrying
  half the data, with a chain through each server's GPUs (inside one server it
  is just the chain), one tree pair per channel, channel c's chains headed by a
  GPU on the server's c-th NIC; reduce flows go up while broadcast flows come down.
  Latency 2((n/N-1) intra + log2(N) inter) steps.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import (
    AlgorithmUnavailable,
    Plan,
    channel_runs,
    channels_for,
    hop_classes,
    nics_of,
)
from simulator.network.fabric import Fabric, Transport


def btree_parents(n: int) -> list[int]:
    """Parents in NCCL's in-order binary tree over ranks 0..n-1 (root 0: -1).

    A rank's parent clears its lowest set bit and sets the next one up, or just
    clears it when that would leave the range.

    >>> btree_parents(4)
    [-1, 2, 0, 2]
    """
    parents = [-1] * n
    for rank in range(1, n):
        bit = rank & -rank
        up = (rank ^ bit) | (bit << 1)
        parents[rank] = up if up < n else rank ^ bit
    return parents


def double_binary_tree(n: int) -> tuple[list[int], list[int]]:
    """NCCL's two complementary trees: the second mirrors (n even) or shifts
    (n odd) the first, so a rank that is a leaf in one is inside the other.

    >>> double_binary_tree(4)
    ([-1, 2, 0, 2], [1, 3, 1, -1])
    """
    first = btree_parents(n)
    label = [n - 1 - r if n % 2 == 0 else (r - 1) % n for r in range(n)]
    unlabel = {v: r for r, v in enumerate(label)}
    second = [-1 if first[label[r]] < 0 else unlabel[first[label[r]]] for r in range(n)]
    return first, second


def tree(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """NCCL double binary tree all-reduce across servers (chains inside them)."""
    if kind is not Collective.ALL_REDUCE:
        raise AlgorithmUnavailable(f"tree runs all_reduce only, not {kind.value}")
    nodes = [fabric.node_of(g) for g in gpus]
    channels = channels_for(fabric, gpus)
    hops: list[tuple[str, str]] = []
    for runs in channel_runs(nodes, channels, nics_of(fabric, gpus)):
        chains = [[gpus[m] for m in run] for run in runs]  # headed by a GPU on NIC c
        for parents in double_binary_tree(len(chains)):
            for chain in chains:  # reduce up the chain to its head, broadcast back down
                for a, b in zip(chain[1:], chain[:-1], strict=True):
                    hops += [(a, b), (b, a)]
            for child, parent in enumerate(parents):
                if parent >= 0:
                    hops += [(chains[child][0], chains[parent][0]),
                             (chains[parent][0], chains[child][0])]
    routes, intra, inter = hop_classes(fabric, hops)
    per_server = max(len(run) for run in chains)
    servers = len(chains)
    depth = math.ceil(math.log2(servers))
    return Plan(Algorithm.TREE, routes, [size / (2 * channels)] * len(routes),
                [(intra[0], 2 * (per_server - 1), intra[1]),
                 (Transport.NET, 2 * depth, inter or 0.0)],
                channels, servers > 1)
