"""Data parallelism (PyTorch DDP / Megatron; ZeRO-1/2, Rajbhandari et al. 2020):
its group, the gradient buckets and the parameter all-gather.

Gradients of the last micro-batch are packed into buckets
(``workloads.buckets``) and all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1/2)
over the dp (x cp) group on the ``dp`` stream as soon as their backward op ends
(``overlap_grad_reduce``); ZeRO 1/2 all-gather the updated parameters after the
optimizer step.
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, Phase
from workloads.buckets import make_buckets
from workloads.layout import Layout
from workloads.memory import PARAM_BYTES
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage
from workloads.training import ParallelSpec, TrainingSpec


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
    """ZeRO 0-2: bucketed all-reduce / reduce-scatter of a chunk's last gradients."""
    ctx = b.ctx
    grads = [g for layer in sorted(b.grads, reverse=True) for g in b.grads[layer]]
    b.grads = {}
    if ctx.parallel.zero_stage >= 3 or ctx.parallel.dp * ctx.shard.cp == 1:
        return
    grads.sort()
    kind = Collective.ALL_REDUCE if ctx.parallel.zero_stage == 0 else Collective.REDUCE_SCATTER
    for n, bucket in enumerate(make_buckets(grads, ctx.parallel.bucket_size)):
        ready = bucket.ready_after if ctx.parallel.overlap_grad_reduce else b.last_compute
        b.reduces.append(b.collective(kind, bucket.bytes, DP_STREAM, ctx.dp_group,
                                      Phase.BACKWARD, -1, -1, deps=(ready,), blocking=False,
                                      name=f"{kind.value}[{chunk}.{n}]"))



def gather_updated_parameters(b: Stage, params: int) -> None:
    """ZeRO 1/2: all-gather the updated parameter shards, bucket by bucket."""
    ctx = b.ctx
    if ctx.parallel.zero_stage in (1, 2) and ctx.shards > 1:
        for n, size in enumerate(split_bytes(PARAM_BYTES * params, ctx.parallel.bucket_size)):
            b.collective(Collective.ALL_GATHER, size, DP_STREAM, ctx.dp_group, Phase.OPTIMIZER,
                         -1, -1, deps=(b.last_compute,), blocking=False,
                         name=f"param_all_gather[{n}]")


def split_bytes(total: float, bucket: float) -> list[float]:
    count = max(1, round(total / bucket))
    return [total / count] * count
