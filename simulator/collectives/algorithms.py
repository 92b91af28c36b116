"""Collective algorithms as NCCL runs them, lowered to flows on the fabric.

Each algorithm is a module (``ring``, ``tree``, ``nvls``, ``pat``, ``direct``, ``collnet``;
``expert_exchange`` for DeepEP's and HybridEP's kernels) whose
planner returns a ``Plan`` (``plan``): the flows (route, payload bytes) an algorithm
puts on the fabric and the pipeline steps it pays latency for; a protocol then
turns the plan into wire bytes and a latency (``simulator.collectives.tuner``).
S is the nccl-tests buffer size: the full buffer for all-reduce, broadcast and
reduce, the gathered buffer for all-gather and reduce-scatter, each rank's send
buffer for all-to-all.

Adding an algorithm = one module with its planner + one line in ``PLANNERS``
(and its name in ``nccl.Algorithm`` with NCCL's latencies, and the collectives
it may run in ``tuner.CANDIDATES``).
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.collectives.collnet import collnet
from simulator.collectives.direct import direct
from simulator.collectives.expert_exchange import expert_exchange
from simulator.collectives.nccl import Algorithm
from simulator.collectives.nvls import nvls
from simulator.collectives.pat import pat
from simulator.collectives.plan import AlgorithmUnavailable, Plan
from simulator.collectives.ring import ring
from simulator.collectives.tree import tree

__all__ = ["PLANNERS", "AlgorithmUnavailable", "Plan"]

PLANNERS: dict[Algorithm, Callable[..., Plan]] = {
    Algorithm.RING: ring,
    Algorithm.TREE: tree,
    Algorithm.NVLS: nvls,
    Algorithm.PAT: pat,
    Algorithm.DIRECT: direct,
    Algorithm.COLLNET: collnet,
    Algorithm.DEEPEP: expert_exchange,
    Algorithm.HYBRIDEP: expert_exchange,
}
