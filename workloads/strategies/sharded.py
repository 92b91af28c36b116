"""Sharded data parallelism: ZeRO-3 (Rajbhandari et al. 2020) and PyTorch FSDP
(Zhao et al. 2023): the shard groups, layout checks, the per-layer parameter
all-gather and gradient reduce-scatter.

Each layer's parameters are all-gathered before its forward (and again before
its backward when resharding), prefetching one layer ahead, and its gradients
reduce-scattered after its backward; hybrid sharding reduce-scatters inside
the shard group (a server) and all-reduces the shard across replicas.
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, Phase
from workloads.layout import Layout
from workloads.memory import PARAM_BYTES
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage
from workloads.training import ParallelSpec, Sharding, TrainingSpec


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Hybrid sharding's shard groups tile the data-parallel group."""
    if parallel.fsdp and parallel.fsdp.sharding is Sharding.HYBRID_SHARD and \
            parallel.dp % shard_size(parallel):
        raise LayoutError(f"fsdp hybrid_shard: parallelism.dp ({parallel.dp}) must be a "
                          f"multiple of the shard group ({shard_size(parallel)} ranks per "
                          "server)")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    """With hybrid sharding: the shard groups and the replica groups."""
    if not hybrid(ctx):
        return {}
    size, dp = ctx.shards, layout.groups(("cp", "dp"))
    return {"dp_shard": tuple(g[i:i + size] for g in dp for i in range(0, len(g), size)),
            "dp_replicate": tuple(g[i::size] for g in dp for i in range(size))}


def shard_size(parallel: ParallelSpec) -> int:
    fsdp = parallel.fsdp
    if fsdp and fsdp.sharding is Sharding.HYBRID_SHARD:
        return max(1, min(parallel.dp, parallel.ranks_per_node // (parallel.tp * parallel.cp)))
    return parallel.dp * parallel.cp


def hybrid(ctx: Context) -> bool:
    fsdp = ctx.parallel.fsdp
    return fsdp is not None and fsdp.sharding is Sharding.HYBRID_SHARD


def gather(b: Stage, layer: int, phase: Phase, mb: int, after: int | None) -> int:
    """ZeRO-3/FSDP all-gather of one layer's parameters (non-blocking)."""
    full = PARAM_BYTES * b.ctx.layer_params
    grown = full * (1 - 1 / b.ctx.shards)
    group = "dp_shard" if hybrid(b.ctx) else b.ctx.dp_group
    return b.collective(Collective.ALL_GATHER, full, DP_STREAM, group, phase, mb, layer,
                        deps=(after,) if after is not None else (), blocking=False,
                        mem=((grown, "gathered_parameters"),))


def reduce_layer(b: Stage, layer: int, mb: int) -> None:
    """ZeRO-3/FSDP: reduce-scatter a layer's gradients (and all-reduce the shard
    across replicas with hybrid sharding) after its last backward."""
    full = b.ctx.plan.reduce_bytes * b.ctx.layer_params
    is_hybrid = hybrid(b.ctx)
    i = b.collective(Collective.REDUCE_SCATTER, full, DP_STREAM,
                     "dp_shard" if is_hybrid else b.ctx.dp_group, Phase.BACKWARD, mb, layer,
                     deps=(b.last_compute,), blocking=False)
    b.reduces.append(i)
    if is_hybrid and b.ctx.parallel.dp // b.ctx.shards > 1:
        b.reduces.append(b.collective(Collective.ALL_REDUCE, full / b.ctx.shards, DP_STREAM,
                                      "dp_replicate", Phase.BACKWARD, mb, layer, deps=(i,),
                                      blocking=False))
