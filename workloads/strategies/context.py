"""Context parallelism (ring attention): its group, layout checks and attention chunks.

Attention runs as ``cp`` chunks; before each chunk but the first, K/V (and in
backward their gradients too) move one step around the cp ring on the ``cp``
stream while the previous chunk computes.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.base.ir import CP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage, kernel_cost
from workloads.strategies.dimension import Dimension, only_one
from workloads.training import ParallelSpec, TrainingSpec

DIMENSIONS = (Dimension("cp", CP_STREAM, "context-parallel sizes (default 1)", only_one),)


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """The sequence splits over cp (and tp with sequence parallelism); ring attention
    needs fused attention."""
    tp, cp = parallel.tp, parallel.cp
    per_rank = training.seq_len // cp
    if training.seq_len % cp or (parallel.sequence_parallel and per_rank % tp):
        raise LayoutError(f"training.seq_len ({training.seq_len}) must be divisible by "
                          f"parallelism.cp x tp with sequence parallelism ({cp * tp})"
                          if parallel.sequence_parallel else
                          f"training.seq_len ({training.seq_len}) must be divisible by "
                          f"parallelism.cp ({cp})")
    if cp > 1 and not training.flash_attention:
        raise LayoutError("parallelism.cp > 1 needs training.flash_attention: ring attention "
                          "runs fused attention chunk by chunk")
    if model.sliding_window is not None:
        if not training.flash_attention:
            raise LayoutError("model.sliding_window needs training.flash_attention: fused "
                              "attention kernels run the window (unfused ones are not modelled)")
        if cp > 1:
            raise LayoutError("model.sliding_window with parallelism.cp > 1 is not modelled "
                              "yet; allowed: cp 1")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {"cp": layout.groups("cp")}


def attention(b: Stage, kernel: K.Kernel, forward: bool, phase: Phase, mb: int,
               layer: int) -> None:
    """Attention, as cp chunks with a K/V ring exchange before each but the first."""
    ctx = b.ctx
    cp = ctx.shard.cp
    flops, nbytes = kernel_cost(kernel, not forward, ctx.training)
    if cp == 1:
        b.compute(kernel, phase, mb, layer, flops, nbytes)
        return
    m = ctx.model
    kv = ctx.shard.tokens * m.kv_width * ctx.shard.dtype_bytes / ctx.shard.tp
    exchange = kv if forward else 2 * kv  # backward also rotates dK, dV
    if kernel.shape:  # each chunk: this rank's queries against one rank's keys
        heads, queries, keys, *rest = kernel.shape
        kernel = replace(kernel, shape=(heads, queries, max(1, keys // cp), *rest))
    b.compute(kernel, phase, mb, layer, flops / cp, nbytes / cp)
    for _ in range(cp - 1):
        i = b.collective(Collective.RING_EXCHANGE, exchange, CP_STREAM, "cp", phase, mb, layer,
                         blocking=False)
        b.compute(kernel, phase, mb, layer, flops / cp, nbytes / cp, extra=(i,))
