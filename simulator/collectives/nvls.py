"""NVLink SHARP (NVLS) inside one NVSwitch: all-reduce, all-gather, reduce-scatter.

NCCL runs NVLS (Simple protocol only) through the switch's multicast objects
(``src/device/all_reduce.h``, ``all_gather.h``, ``reduce_scatter.h``,
``RunWorkColl<..., NCCL_ALGO_NVLS, NCCL_PROTO_SIMPLE>``; all three since NCCL
2.17.1, the release that added NVLS). For S bytes over n GPUs (S the
nccl-tests buffer: the whole buffer for all-reduce, the gathered one for
all-gather and reduce-scatter) each GPU moves over its own NVLink:

- all-reduce: the switch pulls and reduces each GPU's whole buffer
  (``multimem.ld_reduce``) and multicasts the reduced shards back
  (``multimem.st``): S(n+1)/n bytes each way.
- all-gather: each GPU multicasts its shard once, the switch writes every
  shard to every GPU: S/n out, S in.
- reduce-scatter: the switch reads every GPU's whole buffer and returns each
  its reduced shard: S out, S/n in.

The gather and the scatter are NCCL's maintainer's figures ("NVLS: Send S/N,
Receive S" and "Send S, Receive S/N", NCCL issue #1083): the busier direction
carries S, more than a ring's (n-1)/n S, so on an idle switch NVLS all-gather
and reduce-scatter are slower than the ring (measured on one H100 server, NCCL
issue #1047). NCCL's own model agrees: its NVLS bus bandwidth for them is the
switch's times ``nvlsEfficiency`` and (n-1)/n (``tuning.cc``,
``ncclTopoTuneModel``), below the ring's, and it takes NVLS for them by itself
only with registered buffers under ``NCCL_CTA_POLICY_EFFICIENCY`` (NCCL 2.27+,
``enqueue.cc``) -- to free SMs, not to go faster. The tuner here takes NVLS
for them only where it beats the ring as NCCL's cost model prices the ring
(``tuner.unchosen_nvls``: without the ring's pipeline fill): on an 8-GPU server
the ring wins at every size (fewer bytes, and a lower latency than NVLS's
under each protocol), so sequence-parallel and data-parallel gathers stay on the ring as
NCCL's do; over 16 to 32 GPUs of a rack's NVLink domain the ring's n-1 steps
cost more than NVLS's one and NVLS takes the mid sizes, as NCCL's model has it
(its ring latency grows by a step per rank, its NVLS latency does not).
``network.algorithm: nvls`` forces it (``NCCL_ALGO=nvls``).

NCCL skips NVLS for every collective but all-reduce over more than
``NCCL_MAX_NVLS_ARITY`` (32, ``src/include/device.h``) GPUs of one NVLink
domain (``enqueue.cc``, ``topoGetAlgoInfo``): a 72-GPU rack's all-gathers
never take it.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.plan import (
    AlgorithmUnavailable,
    Plan,
)
from simulator.network.fabric import Fabric, Transport

MAX_ARITY = 32  # NCCL_MAX_NVLS_ARITY (src/include/device.h): NVLS's limit but for all-reduce


def nvls_bytes(kind: Collective, n: int, size: float) -> tuple[float, float]:
    """(bytes each GPU sends to the switch, bytes it receives) for a call of
    ``size`` bytes over ``n`` GPUs (NCCL issue #1083; the kernels above).

    >>> nvls_bytes(Collective.ALL_REDUCE, 8, 8.0)
    (9.0, 9.0)
    >>> nvls_bytes(Collective.ALL_GATHER, 8, 8.0), nvls_bytes(Collective.REDUCE_SCATTER, 8, 8.0)
    ((1.0, 8.0), (8.0, 1.0))
    """
    if kind is Collective.ALL_REDUCE:
        return size * (n + 1) / n, size * (n + 1) / n
    if kind is Collective.ALL_GATHER:
        return size / n, size
    if kind is Collective.REDUCE_SCATTER:
        return size, size / n
    raise AlgorithmUnavailable(f"nvls runs all_reduce, all_gather and reduce_scatter, not "
                               f"{kind.value}")


def nvls(fabric: Fabric, kind: Collective, gpus: Sequence[str], size: float) -> Plan:
    """NVLink SHARP: GPU -> NVSwitch (reduce, or multicast) -> GPU."""
    n = len(gpus)
    up, down = nvls_bytes(kind, n, size)
    if kind is not Collective.ALL_REDUCE and n > MAX_ARITY:
        raise AlgorithmUnavailable(f"nvls runs {kind.value} over at most {MAX_ARITY} GPUs "
                                   f"(NCCL_MAX_NVLS_ARITY), not {n}")
    servers = {fabric.node_of(g) for g in gpus}
    switch = fabric.nvswitch(next(iter(servers))) if len(servers) == 1 else None
    if switch is None:
        raise AlgorithmUnavailable("nvls needs the whole group on one NVSwitch with NVLS")
    graph = fabric.graph  # (this state of the fabric: a link may fail during the run)
    if not all(graph.has_edge(g, switch) and graph.has_edge(switch, g) for g in gpus):
        raise AlgorithmUnavailable("nvls needs every member's own NVLink to the NVSwitch (one "
                                   "is down)")
    routes = [(fabric.link(g, switch),) for g in gpus] + [(fabric.link(switch, g),) for g in gpus]
    wire = max(float(fabric.latency[r[0]]) for r in routes) * 2
    efficiency = float(fabric.graph.nodes[switch].get("nvls_efficiency", 1.0))
    return Plan(Algorithm.NVLS, routes, [up] * n + [down] * n,
                [(Transport.NVLINK, 1, wire)], 1, False, wire_scale=1.0 / efficiency)
