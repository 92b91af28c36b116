"""Sharded data parallelism: ZeRO-3 (Rajbhandari et al. 2020) and PyTorch FSDP
(Zhao et al. 2023): the shard groups, layout checks, the parameter all-gathers
and gradient reduce-scatters.

FSDP (and ZeRO-3 under Megatron or PyTorch): each layer's parameters are
all-gathered as one flat unit before its forward (and again before its
backward when resharding), prefetching one layer ahead, and its gradients
reduce-scattered after its backward; hybrid sharding reduce-scatters inside
the shard group (a server) and all-reduces the shard across replicas.

DeepSpeed ZeRO-3 (``TensorFetcher``): one all-gather per module, prefetched by
element count, small tensors persistent; its gradients go through the
data-parallel buckets after every micro-batch (``data.bucket_reduces``). At a
thousand ranks each all-gather is latency-bound, so the call count, not the
bytes, sets its cost.
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads.frameworks import prefetch_points
from workloads.layout import Layout
from workloads.memory import PARAM_BYTES
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage
from workloads.training import ParallelSpec, Sharding, TrainingSpec


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Hybrid sharding's shard groups tile the data-parallel group; DeepSpeed's
    pipeline engine refuses ZeRO-2/3 ("ZeRO-2 and ZeRO-3 are incompatible with
    pipeline parallelism", ``deepspeed/runtime/pipe/engine.py``)."""
    if parallel.reduces_every_micro_batch and parallel.pp > 1:
        raise LayoutError(f"parallelism.zero: {parallel.zero} with parallelism.pp: "
                          f"{parallel.pp} is not possible with parallelism.framework: "
                          "deepspeed (its pipeline engine runs ZeRO-0/1 only)")
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


def flat_units(ctx: Context) -> bool:
    """Whether ZeRO-3 runs as flat units gathered whole (FSDP, and ``zero: 3``
    outside DeepSpeed): each layer, and the embedding and the head as their own."""
    return ctx.parallel.zero_stage >= 3 and ctx.parallel.deepspeed_zero3 is None


def embedding_params(ctx: Context) -> int:
    """Parameters of the embedding unit (this rank's tensor-parallel shard)."""
    return K.embedding_kernels(ctx.model, ctx.shard, vocab=ctx.vocab)[0].params


def head_params(ctx: Context, owned: bool = True) -> int:
    """Parameters of the head unit: those it owns (its gradients), or all it
    computes with (``owned`` False: a tied logits weight must be gathered too)."""
    kernels = K.head_kernels(ctx.model, ctx.shard, vocab=ctx.vocab,
                             owns_logits=ctx.owns_logits if owned else True)
    return sum(k.params for k in kernels)


def gathered_bytes(ctx: Context, params: int) -> float:
    """Bytes a gathered unit of ``params`` parameters adds on this rank."""
    return PARAM_BYTES * params * (1 - 1 / ctx.shards)


def freed(ctx: Context, params: int) -> tuple[tuple[float, str], ...]:
    """The memory event of releasing a gathered unit of ``params`` parameters."""
    return ((-gathered_bytes(ctx, params), "gathered_parameters"),)


def gather(b: Stage, layer: int, phase: Phase, mb: int, after: int | None,
           params: int | None = None) -> int:
    """ZeRO-3/FSDP all-gather of one layer's parameters, or of a unit of
    ``params`` (the embedding: layer -1; the head: ``layers``), non-blocking."""
    params = b.ctx.layer_params if params is None else params
    full, grown = PARAM_BYTES * params, gathered_bytes(b.ctx, params)
    group = "dp_shard" if hybrid(b.ctx) else b.ctx.dp_group
    return b.collective(Collective.ALL_GATHER, full, DP_STREAM, group, phase, mb, layer,
                        deps=(after,) if after is not None else (), blocking=False,
                        mem=((grown, "gathered_parameters"),))


def units(ctx: Context, k: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(head, embedding) units, (unit id, parameters), that virtual stage ``k``
    gathers as flat units: the head on the last, the embedding on the first."""
    if not flat_units(ctx):
        return None, None
    return ((ctx.model.layers, head_params(ctx, False)) if k == ctx.last_virtual else None,
            (-1, embedding_params(ctx)) if k == 0 else None)


def gather_unit(b: Stage, unit: tuple[int, int] | None, phase: Phase, mb: int) -> int | None:
    """The gather of a unit (unit id, parameters: the embedding or the head) used
    first in a pass, issued now; None without one."""
    return None if unit is None else gather(b, unit[0], phase, mb, b.last_compute, unit[1])


def copy_out(b: Stage, layer: int, phase: Phase, mb: int, gather: int) -> bool:
    """FSDP2: the copy-out kernel that splits a layer's gathered buffer into its
    parameters (read and write them, on the compute stream, after the gather);
    whether there is one (FSDP1 gathers into the flat parameter in place)."""
    if not b.ctx.parallel.fsdp2:
        return False
    params = b.ctx.layer_params
    copy = K.elementwise("fsdp_copy_out", params, params, PARAM_BYTES)
    b.compute(copy, phase, mb, layer, 0.0, copy.bytes, extra=(gather,))
    return True


def reduce_layer(b: Stage, layer: int, mb: int, params: int | None = None) -> None:
    """ZeRO-3/FSDP: reduce-scatter a layer's (or a unit's) gradients (and
    all-reduce the shard across replicas with hybrid sharding) after its backward."""
    full = b.ctx.plan.reduce_bytes * (b.ctx.layer_params if params is None else params)
    is_hybrid = hybrid(b.ctx)
    i = b.collective(Collective.REDUCE_SCATTER, full, DP_STREAM,
                     "dp_shard" if is_hybrid else b.ctx.dp_group, Phase.BACKWARD, mb, layer,
                     deps=(b.last_compute,), blocking=False)
    b.reduces.append(i)
    if is_hybrid and b.ctx.parallel.dp // b.ctx.shards > 1:
        b.reduces.append(b.collective(Collective.ALL_REDUCE, full / b.ctx.shards, DP_STREAM,
                                      "dp_replicate", Phase.BACKWARD, mb, layer, deps=(i,),
                                      blocking=False))


class TensorFetcher:
    """DeepSpeed ZeRO-3's parameter coordinator over one pass through a chunk's
    layers: one all-gather per module with partitioned parameters (tensors under
    ``stage3_param_persistence_threshold`` elements stay whole), issued where
    ``frameworks.prefetch_points`` puts it (``stage3_prefetch_bucket_size``
    elements ahead); each module's kernel waits for its own gather.

    ``order`` lists (layer, pass-plan position, kernel) in the order the pass uses
    them (a full recompute's forward first, in a backward); ``wait`` is called as
    each kernel is appended: it appends the gathers due there and returns the one
    the kernel waits for."""

    def __init__(self, b: Stage, order: list[tuple[int, int, object]], phase: Phase,
                 mb: int) -> None:
        spec = b.ctx.parallel.deepspeed_zero3
        tensors = [(layer, n, kernel.params) for layer, n, kernel in order
                   if kernel.params >= spec.stage3_param_persistence_threshold]
        points = prefetch_points([numel for *_, numel in tensors],
                                 spec.stage3_prefetch_bucket_size)
        self.b, self.phase, self.mb, self.tensors = b, phase, mb, tensors
        self.grown = PARAM_BYTES * (1 - 1 / b.ctx.shards)  # gathered bytes per element
        self.at = {(layer, n): i for i, (layer, n, _) in enumerate(tensors)}
        self.due: dict[int, list[int]] = {}
        for i, j in enumerate(points):
            self.due.setdefault(j, []).append(i)
        self.per_layer: dict[int, float] = {}
        for layer, _, numel in tensors:
            self.per_layer[layer] = self.per_layer.get(layer, 0.0) + self.grown * numel
        self.gathers: dict[int, int] = {}

    def layer_bytes(self, layer: int) -> float:
        """Bytes the layer's gathered (partitioned) tensors add on this rank."""
        return self.per_layer.get(layer, 0.0)

    def wait(self, layer: int, n: int) -> int | None:
        i = self.at.get((layer, n))
        if i is None:
            return None
        b = self.b
        after = () if b.last_compute is None else (b.last_compute,)
        for t in self.due.pop(i, ()):
            lay, _, numel = self.tensors[t]
            self.gathers[t] = b.collective(
                Collective.ALL_GATHER, PARAM_BYTES * numel, DP_STREAM, b.ctx.dp_group,
                self.phase, self.mb, lay, deps=after, blocking=False,
                mem=((self.grown * numel, "gathered_parameters"),), name="param_all_gather")
        return self.gathers[i]
