"""The op IR: what a workload hands the engine.

A ``Program`` is, for every rank, a tuple of ``Op`` in program order. Each op
runs on one stream of its rank (``compute``, or a communication stream named
after its parallel dimension such as ``dp``); ops on one stream run in order,
like a CUDA stream, and ``deps`` adds cross-stream dependencies (indices into
the same rank's tuple). Collectives name the parallel dimension whose group
they run in; the engine matches the n-th collective of a group across its
members, as NCCL requires every member to call collectives in the same order.
Point-to-point ops name a dimension whose groups are (sender, receiver)
pairs; the n-th send of a pair matches the receiver's n-th receive.

This module has no SimPy in it, so ``workloads`` may import it.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import NamedTuple

# Streams, declared once: compute, and one communication stream per parallel
# dimension, named after it (its collectives' groups carry the same name).
COMPUTE_STREAM = "compute"
TP_STREAM, CP_STREAM, DP_STREAM, PP_STREAM = "tp", "cp", "dp", "pp"
EP_STREAM = "ep"  # expert parallelism's token all-to-alls
# DeepEP's hop between NVLink domains (RDMA), beside its NVLink hop on ``ep``; its
# calls are named after the exchange with this suffix (``dispatch_rdma``)
EP_RDMA_STREAM, RDMA_HOP = "ep_rdma", "_rdma"
BG_STREAM = "bg"  # background traffic of another tenant (workloads.background)
# copies to host memory (activation and optimizer offloading) and the host's own
# optimizer work, and copies back: a GPU's copy engines move data each way at once
# (the CPU's work is not the SMs' either)
OFFLOAD_STREAM, RELOAD_STREAM = "offload", "reload"
EXCHANGE_STREAMS = (EP_STREAM, EP_RDMA_STREAM)  # a MoE layer's token exchanges
COMMUNICATION_STREAMS = (TP_STREAM, CP_STREAM, EP_STREAM, EP_RDMA_STREAM, DP_STREAM, PP_STREAM,
                         BG_STREAM, OFFLOAD_STREAM, RELOAD_STREAM)  # Gantt lanes
STREAMS = (COMPUTE_STREAM, *COMMUNICATION_STREAMS)
# Transformer Engine's userbuffers exchanges (``tp_comm_overlap``): copy-engine
# transfers, not NCCL kernels, so they take no SMs from compute.
COPY_ENGINE_EXCHANGE = "userbuffers_exchange"
# A backward GEMM split into its input and its weight gradient (delayed weight
# gradients): the two ops' names end so; each is one kernel launch, not two.
DGRAD, WGRAD = "_dgrad", "_wgrad"
# A routed expert's kernels are named so (workloads.kernels.is_expert); the host waits
# for the GPU before the first of a MoE layer's forward (compute.host.host_syncs).
ROUTED_EXPERT = "experts_"
# Background traffic's pacing ops (workloads.background): a fixed wait on the compute
# stream between messages, not a kernel; the Gantt leaves them out.
PACING = "background pacing"


class Symbol(Enum):
    """An enum whose members hash by identity, in C. Members are singletons, so
    identity is equality; Enum's own ``__hash__`` is a Python call, and the
    engine's dicts keyed by op kinds, phases and collectives pay it millions of
    times in a deep pipeline."""

    __hash__ = object.__hash__


class OpKind(Symbol):
    COMPUTE = "compute"
    COLLECTIVE = "collective"
    SEND = "send"  # eager: the transfer starts when the sender reaches it
    RECV = "recv"  # completes when the matching send's transfer has arrived


class KernelClass(Symbol):
    """Decides which efficiency curve of the compute model applies."""

    GEMM = "gemm"
    ATTENTION = "attention"
    ELEMENTWISE = "elementwise"
    # low precision (``workloads.precision``): a linear layer's GEMM in the run's
    # format, attention's core in FP8, and the casts that quantize their operands
    LOWP_GEMM = "lowp_gemm"
    LOWP_ATTENTION = "lowp_attention"
    QUANTIZE = "quantize"
    HOST_COPY = "host_copy"  # bytes over the GPU-host link (NVLink-C2C, PCIe)
    HOST_COMPUTE = "host_compute"  # the host CPU's work, bound by host memory bandwidth


HOST_KERNELS = (KernelClass.HOST_COPY, KernelClass.HOST_COMPUTE)  # not the GPU's kernels
GEMMS = (KernelClass.GEMM, KernelClass.LOWP_GEMM)
ATTENTIONS = (KernelClass.ATTENTION, KernelClass.LOWP_ATTENTION)
HOST_MEMORY = "host_"  # memory categories with this prefix are in host memory, not the GPU's


class Collective(Symbol):
    """Operations, named as nccl-tests names them (``all_reduce_perf`` ...)."""

    ALL_REDUCE = "all_reduce"
    ALL_GATHER = "all_gather"
    REDUCE_SCATTER = "reduce_scatter"
    BROADCAST = "broadcast"
    REDUCE = "reduce"
    ALL_TO_ALL = "all_to_all"
    SEND_RECV = "send_recv"
    RING_EXCHANGE = "ring_exchange"  # every member sends to its ring successor (ring attention)
    # The flex dispatcher's token exchanges (Megatron-Core's moe_token_dispatcher_type
    # flex): an all-to-all run by DeepEP's or HybridEP's own kernels, not NCCL's, at
    # the rate those kernels reach (simulator.collectives.expert_exchange)
    DEEPEP_DISPATCH = "deepep_dispatch"
    DEEPEP_COMBINE = "deepep_combine"
    HYBRIDEP_DISPATCH = "hybridep_dispatch"
    HYBRIDEP_COMBINE = "hybridep_combine"


class Phase(Symbol):
    FORWARD = "forward"
    BACKWARD = "backward"
    OPTIMIZER = "optimizer"


PHASE_NAME = {phase: phase.value for phase in Phase}  # for hot paths: a dict, not Enum.value


class Op(NamedTuple):
    """One kernel or one collective call of one rank. Immutable (programs share
    op tuples between ranks); a NamedTuple because a large run's program has
    millions of ops and a frozen dataclass takes twice as long to build."""

    kind: OpKind
    name: str
    stream: str
    phase: Phase
    deps: tuple[int, ...] = ()
    kernel: KernelClass | None = None  # compute ops
    flops: float = 0.0  # FLOPs the GPU executes (recompute and all)
    bytes: float = 0.0  # compute: HBM bytes moved; collective: buffer size S
    # GEMM (m, n, k), a grouped GEMM's (m, n, k, rows of each group), attention's
    # (batch x heads, queries, keys, head size, causal)
    shape: tuple[int, ...] | None = None
    collective: Collective | None = None
    group: str = ""  # parallel dimension of the collective's group, e.g. "dp"
    microbatch: int = -1
    layer: int = -1
    mem: tuple[tuple[float, str], ...] = ()  # (bytes allocated + / freed -, category) at end


@dataclass(frozen=True)
class Program:
    """Per-rank ops plus the facts the summary needs.

    ``ops[r]`` is rank r's program; ranks with the same program share one tuple.
    ``groups[dim]`` lists the rank groups of parallel dimension ``dim``.
    ``static_memory[r]`` maps a category (parameters, gradients, ...) to bytes
    held for the whole iteration; ``stage[r]`` is rank r's pipeline stage.
    ``steps[r]`` (optional) lists the pipeline steps of rank r's program as
    ``(first op, end op, key)``: the ops in ``range(first, end)`` are one forward
    or backward of one micro-batch through one model chunk (or, in the combined
    1F1B schedule, a forward and a backward together), and two steps of one
    program with equal keys hold the same ops but for their micro-batch and their
    dependencies on ops before the step (a template the engine may replay).
    """

    ops: tuple[tuple[Op, ...], ...]
    groups: Mapping[str, tuple[tuple[int, ...], ...]]
    static_memory: tuple[Mapping[str, float], ...]
    model_flops: float  # model FLOPs of one iteration, whole job, no recompute
    tokens: int  # tokens of one iteration (global batch x sequence length)
    stage: tuple[int, ...] = ()
    notes: Mapping[str, object] = field(default_factory=dict)
    steps: tuple[tuple[tuple[int, int, Hashable], ...], ...] = ()

    @property
    def ranks(self) -> int:
        return len(self.ops)
