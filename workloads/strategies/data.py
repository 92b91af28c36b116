"""Data parallelism (PyTorch DDP / Megatron; ZeRO-1/2 and Megatron-Core's
distributed optimizer, Rajbhandari et al. 2020): its group, the gradient
buckets and the parameter all-gather.

Gradients of the last micro-batch (of every one with DeepSpeed ZeRO-2/3, whose
partitioned gradients cannot accumulate unreduced) are packed into buckets
(``workloads.buckets``, sized and typed by the framework's ``GradientPlan``) and
all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1/2) over the dp (x cp) group
on the ``dp`` stream as soon as their backward op ends
(``overlap_grad_reduce``). ZeRO 1/2 all-gather the updated parameters, bucket
by bucket: after the optimizer step, or, with ``overlap_param_gather``
(Megatron-Core), at the start of the iteration in the order the forward needs
them, each layer's first forward waiting for its bucket, so that only the
first bucket is exposed (the steady state of one iteration: the gather of
step i's parameters runs under step i+1's forward).
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads.buckets import make_buckets
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage, plan_kernels
from workloads.strategies.dimension import Dimension
from workloads.strategies.expert import expert_data_parallel
from workloads.training import ParallelSpec, TrainingSpec

DIMENSIONS = (Dimension("dp", DP_STREAM, "derived: the GPUs the other dimensions leave"),)


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Every data-parallel rank gets whole micro-batches."""
    per_step = parallel.dp * training.micro_batch
    if training.global_batch % per_step:
        raise LayoutError(f"training.global_batch: {training.global_batch!r} must be "
                          f"divisible by dp x micro_batch = {parallel.dp} x "
                          f"{training.micro_batch} = {per_step}")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {"dp": layout.groups(("cp", "dp"))}


def bucket_reduces(b: Stage, chunk: int) -> None:
    """Bucketed all-reduce (ZeRO 0) or reduce-scatter (ZeRO 1/2, DeepSpeed ZeRO-3) of
    a chunk's gradients: the last micro-batch's, or each one's with DeepSpeed ZeRO-2/3;
    experts' gradients in buckets of their own over their replicas (``edp``), as
    Megatron-Core keeps a separate buffer for them."""
    ctx = b.ctx
    mine = chunk_keys(ctx, ctx.virtual(b.stage, chunk))
    grads = [g for layer in sorted(b.grads, reverse=True) if layer in mine
             for g in b.grads.pop(layer)]
    experts = [g for layer in sorted(b.expert_grads, reverse=True) if layer in mine
               for g in b.expert_grads.pop(layer)]
    if ctx.parallel.zero_stage >= 3 and ctx.parallel.deepspeed_zero3 is None:
        return  # FSDP-style ZeRO-3 reduces layer by layer (sharded.reduce_layer)
    if ctx.parallel.dp * ctx.shard.cp > 1:
        _reduce(b, chunk, sorted(grads), ctx.dp_group, "")
    if experts and expert_data_parallel(ctx.parallel) > 1:
        _reduce(b, chunk, sorted(experts), "edp", "experts ")


def _reduce(b: Stage, chunk: int, grads: list, group: str, label: str) -> None:
    ctx = b.ctx
    kind = Collective.ALL_REDUCE if ctx.parallel.zero_stage == 0 else Collective.REDUCE_SCATTER
    for n, bucket in enumerate(make_buckets(grads, bucket_cap(ctx, chunk))):
        ready = bucket.ready_after if ctx.parallel.overlap_grad_reduce else b.last_compute
        b.reduces.append(b.collective(kind, bucket.bytes, DP_STREAM, group,
                                      Phase.BACKWARD, -1, -1, deps=(ready,), blocking=False,
                                      name=f"{label}{kind.value}[{chunk}.{n}]"))


def chunk_keys(ctx: Context, k: int) -> frozenset[int]:
    """The layers whose gradients virtual stage ``k`` holds (as ``Stage.grads`` keys
    them): its own, the embedding's (-1) where it begins a pipeline, the head's
    (``model.layers``) where it ends one. (Under DualPipe's zero-bubble split a
    chunk's weight gradients may come after the other chunk's backward.)"""
    extra = ({-1} if ctx.starts(k) else set()) | ({ctx.model.layers} if ctx.ends(k) else set())
    return frozenset(ctx.chunks[k]) | extra


def bucket_cap(ctx: Context, chunk: int) -> float:
    """Bucket cap of a stage's model chunk: Megatron-Core buckets only the first."""
    plan = ctx.plan
    return plan.bucket_bytes if chunk == 0 or plan.bucket_later_chunks else float("inf")


def gathers_parameters(ctx: Context) -> bool:
    """Whether the sharded optimizer all-gathers updated parameters (ZeRO 1/2)."""
    return ctx.parallel.zero_stage in (1, 2) and ctx.shards > 1


def gathers_ahead(ctx: Context) -> bool:
    """Whether that all-gather overlaps the next forward (``overlap_param_gather``)."""
    return gathers_parameters(ctx) and ctx.plan.overlap_param_gather


def chunk_tensors(ctx: Context, k: int) -> list[tuple[int, int]]:
    """(layer, parameters) of virtual stage ``k``'s tensors in the order their
    gradients become ready (the order buckets are packed in): the head's, each
    layer's from last to first, the embedding's; -1 is the embedding, ``layers``
    the head, as in the program's ops. Experts' tensors are not among them
    (``expert_tensors``)."""
    m, tensors = ctx.model, []
    if ctx.ends(k):
        head = K.head_kernels(m, ctx.shard, vocab=ctx.vocab, owns_logits=ctx.owns_logits)
        tensors += [(m.layers, kernel.params) for kernel in head[::-1] if kernel.params]
    for layer in reversed(ctx.chunks[k]):
        tensors += [(layer, kernel.params) for _, kernel in
                    plan_kernels(ctx.pass_plan(layer, False))
                    if kernel.params and not K.is_expert(kernel)]
    if ctx.starts(k):
        tensors.append((-1, K.embedding_kernels(m, ctx.shard, vocab=ctx.vocab)[0].params))
    return tensors


def expert_tensors(ctx: Context, k: int) -> list[tuple[int, int]]:
    """(layer, parameters) of virtual stage ``k``'s expert tensors, in gradient order."""
    return [(layer, kernel.params) for layer in reversed(ctx.chunks[k])
            for _, kernel in plan_kernels(ctx.pass_plan(layer, False))
            if kernel.params and K.is_expert(kernel)]


def gather_parameters_ahead(b: Stage) -> None:
    """Megatron-Core ``overlap_param_gather``: each model chunk's parameter
    buckets all-gathered at the iteration's start, in the order the forward
    needs them (the gradient buckets reversed, chunk after chunk); each layer's
    first forward waits for the last-issued bucket holding its parameters
    (``Stage.param_ready``)."""
    ctx = b.ctx
    for chunk in range(ctx.chunks_per_stage):
        k = ctx.virtual(b.stage, chunk)
        ready = _gather_ahead(b, chunk, chunk_tensors(ctx, k), ctx.dp_group, "")
        if expert_data_parallel(ctx.parallel) > 1:  # a MoE layer's first forward waits for
            # both its dense and its experts' gathers
            for layer, i in _gather_ahead(b, chunk, expert_tensors(ctx, k), "edp",
                                          "experts ").items():
                ready[layer] = i if layer not in ready else max(ready[layer], i)
        b.param_ready.update(ready)


def _gather_ahead(b: Stage, chunk: int, tensors: list, group: str, label: str
                  ) -> dict[int, int]:
    """The parameter all-gathers of ``tensors`` over ``group``, buckets in forward
    order; layer -> the last-issued gather holding its parameters."""
    ctx, ready = b.ctx, {}
    buckets = make_buckets([(i, ctx.plan.reduce_bytes * n) for i, (_, n) in
                            enumerate(tensors)], bucket_cap(ctx, chunk))
    ends = [bucket.ready_after for bucket in buckets]
    for n in range(len(buckets) - 1, -1, -1):
        first = ends[n - 1] + 1 if n else 0
        held = tensors[first:ends[n] + 1]
        i = b.collective(Collective.ALL_GATHER, ctx.plan.param_bytes * sum(c for _, c in held),
                         DP_STREAM, group, Phase.FORWARD, 0, -1, deps=(),
                         blocking=False, name=f"{label}param_all_gather[{chunk}.{n}]")
        for layer, _ in held:
            ready[layer] = i
    return ready


def gather_updated_parameters(b: Stage, params: int, experts: int = 0) -> None:
    """ZeRO 1/2 without ``overlap_param_gather``: all-gather the updated
    parameter shards after the optimizer step, in buckets of the gradient cap
    (experts' over their replicas)."""
    ctx = b.ctx
    if ctx.plan.overlap_param_gather or ctx.parallel.zero_stage not in (1, 2):
        return
    cap = ctx.plan.bucket_bytes * ctx.plan.param_bytes / ctx.plan.reduce_bytes
    for count, group, label, size in ((params, ctx.dp_group, "", ctx.shards),
                                      (experts, "edp", "experts ",
                                       expert_data_parallel(ctx.parallel))):
        if count == 0 or size <= 1:
            continue
        for n, part in enumerate(split_bytes(ctx.plan.param_bytes * count, cap)):
            b.collective(Collective.ALL_GATHER, part, DP_STREAM, group, Phase.OPTIMIZER,
                         -1, -1, deps=(b.last_compute,), blocking=False,
                         name=f"{label}param_all_gather[{n}]")


def split_bytes(total: float, bucket: float) -> list[float]:
    """``total`` in equal parts of about ``bucket`` bytes (one part for an infinite cap).

    >>> split_bytes(100.0, 30.0)
    [33.333333333333336, 33.333333333333336, 33.333333333333336]
    """
    count = max(1, round(total / bucket))
    return [total / count] * count
