"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism,
Korthikanti et al. 2022): its group, its layout checks, and where its
communication goes in a layer.

Without sequence parallelism Megatron's f and g operators are an all-reduce
after the attention and MLP blocks in forward and before them in backward
(2 + 2 per layer); with it an all-gather before and a reduce-scatter after
each block, mirrored in backward. All run on the ``tp`` stream and block the
next kernel.

With ``tp_comm_overlap`` (Transformer Engine's userbuffers, as Megatron-Core's
``--tp-comm-overlap`` turns them on; sequence parallelism required) each
all-gather is pipelined with the GEMM that consumes it and each reduce-scatter
with the GEMM that produces it, as TE's ring-exchange overlap does: the GEMM
runs in tp pieces along the tokens, one piece per ring step, and the tp - 1
exchanges of one piece's worth of tokens (copy-engine transfers, so no SMs are
taken from the GEMM) run under the pieces; only a piece's worth of
communication stays exposed.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.base.ir import COPY_ENGINE_EXCHANGE, TP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage
from workloads.strategies.dimension import Bounds, Dimension, powers_within_domain
from workloads.training import ParallelSpec, TrainingSpec


def _inside_domain(sizes, bounds: Bounds) -> bool:
    """Tensor parallelism inside an NVLink domain, dividing the heads."""
    return sizes["tp"] <= bounds.domain and bounds.heads % sizes["tp"] == 0


DIMENSIONS = (Dimension("tp", TP_STREAM, "tensor-parallel sizes, e.g. 1,2,4,8",
                        powers_within_domain, _inside_domain, shown=True),)


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Heads, KV heads and the MLP split evenly over the tensor-parallel ranks."""
    tp = parallel.tp
    for key, value in (("model.heads", model.heads), ("model.kv_heads", model.kv_heads),
                       ("model.ffn_hidden", model.ffn_hidden)):
        if value % tp:
            raise LayoutError(f"{key} ({value}) must be divisible by parallelism.tp ({tp})")
    if parallel.tp_comm_overlap and tp > 1 and not parallel.sequence_parallel:
        raise LayoutError("parallelism.tp_comm_overlap needs parallelism.sequence_parallel: "
                          "Transformer Engine overlaps the sequence-parallel all-gathers and "
                          "reduce-scatters with their GEMMs")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {"tp": layout.groups("tp")}


def block_comm(forward: bool, before_block: bool, sp: bool) -> Collective | None:
    """Megatron's f (before a block) and g (after it) in forward or backward."""
    if not sp:
        return Collective.ALL_REDUCE if forward != before_block else None
    if before_block:
        return Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER
    return Collective.REDUCE_SCATTER if forward else Collective.ALL_GATHER


def layer_sequence(kernels: list[K.Kernel]) -> list[K.Kernel | bool]:
    """Forward order; a bool marks Megatron's f (True: before a block) or g (False):
    f before QKV (MLA: its first projection) and fc1, g after proj and fc2 (a MoE
    layer's shared experts likewise; its routed experts run on the rank's own tokens)."""
    out: list[K.Kernel | bool] = []
    for kernel in kernels:
        if kernel.name in ("qkv", "q_down", "q_proj", "fc1", "shared_fc1"):
            out.append(True)
        out.append(kernel)
        if kernel.name in ("proj", "fc2", "shared_fc2"):
            out.append(False)
    return out


def merge_overlaps(plan: list[tuple]) -> list[tuple]:
    """A pass plan with each (all-gather, GEMM) and (GEMM, reduce-scatter) pair
    made one ``("overlapped", kernel, flops, bytes, collective)`` item (the kernel
    where a plain kernel item has it)."""
    out: list[tuple] = []
    n = 0
    while n < len(plan):
        item, nxt = plan[n], plan[n + 1] if n + 1 < len(plan) else None
        if item[0] == "tp" and item[1] is Collective.ALL_GATHER and _gemm(nxt):
            out.append(("overlapped", *nxt[1:], Collective.ALL_GATHER))
            n += 2
        elif _gemm(item) and nxt is not None and nxt[0] == "tp" and \
                nxt[1] is Collective.REDUCE_SCATTER:
            out.append(("overlapped", *item[1:], Collective.REDUCE_SCATTER))
            n += 2
        else:
            out.append(item)
            n += 1
    return out


def _gemm(item: tuple | None) -> bool:
    return item is not None and item[0] == "kernel" and item[1].shape is not None


def overlapped(b: Stage, item: tuple, comm_bytes: float, phase: Phase, mb: int, layer: int,
               extra: tuple, mem: tuple) -> int:
    """Append a GEMM pipelined with its all-gather or reduce-scatter: tp pieces of
    the GEMM (1/tp of the tokens each) and tp - 1 ring exchanges of 1/tp of the
    tensor. All-gather: the first piece runs on the local tokens while the first
    exchange brings the next; piece s waits for exchange s. Reduce-scatter:
    exchange s sends piece s - 1's partial sums on while piece s runs; the next
    kernel waits for the last exchange. Returns the last piece's op index."""
    _, kernel, flops, nbytes, kind = item
    tp = b.ctx.shard.tp
    m, n, k = kernel.shape[:3]
    piece = replace(kernel, shape=(max(1, m // tp), n, k))
    chunk = comm_bytes / tp
    exchanges: list[int] = []
    if kind is Collective.ALL_GATHER:
        for s in range(tp):
            if s + 1 < tp:  # the next piece's tokens arrive while this one computes
                exchanges.append(b.collective(
                    Collective.RING_EXCHANGE, chunk, TP_STREAM, "tp", phase, mb, layer,
                    deps=(exchanges[-1],) if exchanges else None, blocking=False,
                    name=COPY_ENGINE_EXCHANGE))
            waits = extra if s == 0 else (exchanges[s - 1],)
            last = b.compute(piece, phase, mb, layer, flops / tp, nbytes / tp, extra=waits,
                             mem=mem if s == tp - 1 else ())
        return last
    last = b.compute(piece, phase, mb, layer, flops / tp, nbytes / tp, extra=extra)
    for s in range(1, tp):
        exchanges.append(b.collective(Collective.RING_EXCHANGE, chunk, TP_STREAM, "tp", phase,
                                      mb, layer, deps=(last,), blocking=False,
                                      name=COPY_ENGINE_EXCHANGE))
        last = b.compute(piece, phase, mb, layer, flops / tp, nbytes / tp,
                         mem=mem if s == tp - 1 else ())
    b.ready.append(exchanges[-1])
    return last
