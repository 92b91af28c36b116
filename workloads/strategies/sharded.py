"""Sharded data parallelism: ZeRO-3 (Rajbhandari et al. 2020) and PyTorch FSDP
(Zhao et al. 2023): the shard groups, layout checks, the parameter all-gathers
and gradient reduce-scatters.

FSDP (and ZeRO-3 under Megatron or PyTorch): each layer's parameters are
all-gathered as one flat unit before its forward (and again before its
backward when resharding), prefetching one layer ahead, and its gradients
reduce-scattered after its backward; hybrid sharding reduce-scatters inside
the shard group (a server) and all-reduces the shard across replicas. In a
model with experts a MoE layer is two units, as Megatron-FSDP and NeMo
AutoModel's FSDP2 wrap it: its dense parameters sharded over the data-parallel
group, its local experts over their replicas (``edp``; none to gather or
reduce when the expert-parallel group spans them all). With ``fsdp.no_sync``
gradients accumulate unsharded and are reduce-scattered after the last
micro-batch only, and the parameters gathered by the first micro-batch's
forward stay gathered until then (``gathers``, ``frees``).

DeepSpeed ZeRO-3 (``TensorFetcher``): one all-gather per module, prefetched by
element count, small tensors persistent; its gradients go through the
data-parallel buckets after every micro-batch (``data.bucket_reduces``). At a
thousand ranks each all-gather is latency-bound, so the call count, not the
bytes, sets its cost.
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads.frameworks import prefetch_points, reuse_plan
from workloads.layout import Layout
from workloads.memory import Recompute
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage, plan_kernels
from workloads.strategies.expert import expert_data_parallel
from workloads.training import ParallelSpec, Sharding, TrainingSpec

DIMENSIONS = ()  # ZeRO-3 and FSDP shard over the data-parallel ranks: a setting, not a dimension


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
    fsdp = parallel.fsdp
    if fsdp and fsdp.no_sync and (fsdp.reshard_after_forward or fsdp.zero < 3):
        raise LayoutError("parallelism.fsdp.no_sync: true keeps the gathered parameters "
                          "over the micro-batches: it needs fsdp.reshard_after_forward: false "
                          "and sharding full_shard or hybrid_shard")
    if model.experts and fsdp and fsdp.sharding is Sharding.HYBRID_SHARD:
        raise LayoutError("parallelism.fsdp.sharding: hybrid_shard is not modelled with "
                          "experts yet; allowed: full_shard, shard_grad_op")


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


def gathered_bytes(ctx: Context, params: int, shards: int | None = None) -> float:
    """Bytes a gathered unit of ``params`` parameters (over ``shards`` ranks: the
    data-parallel shard group's by default) adds on this rank."""
    return ctx.plan.param_bytes * params * (1 - 1 / (ctx.shards if shards is None else shards))


def freed(ctx: Context, params: int) -> tuple[tuple[float, str], ...]:
    """The memory event of releasing a gathered unit of ``params`` parameters."""
    return ((-gathered_bytes(ctx, params), "gathered_parameters"),)


def layer_units(ctx: Context, layer: int) -> tuple[tuple[int, str, int], ...]:
    """(parameters, group, shards) of the units a layer gathers: its dense
    parameters over the data-parallel shard group, and a MoE layer's local
    experts over their replicas (``edp``) where there are more than one."""
    dense, experts = ctx.params_of(layer)
    units = [(dense, "dp_shard" if hybrid(ctx) else ctx.dp_group, ctx.shards)]
    edp = expert_data_parallel(ctx.parallel)
    if experts and edp > 1:
        units.append((experts, "edp", edp))
    return tuple(units)


def freed_layer(ctx: Context, layer: int) -> tuple[tuple[float, str], ...]:
    """The memory event of releasing a layer's gathered units."""
    grown = sum(gathered_bytes(ctx, n, shards) for n, _, shards in layer_units(ctx, layer))
    return ((-grown, "gathered_parameters"),)


def no_sync(ctx: Context) -> bool:
    """Whether gradients accumulate unsharded, parameters staying gathered, over
    the micro-batches (``fsdp.no_sync``)."""
    fsdp = ctx.parallel.fsdp
    return fsdp is not None and fsdp.no_sync


def gathers(ctx: Context, forward: bool, mb: int) -> bool:
    """Whether a layer's pass on micro-batch ``mb`` gathers its parameters: every
    forward, and every backward when the forward resharded them; under
    ``no_sync`` the first micro-batch's forward only."""
    if no_sync(ctx):
        return forward and mb == 0
    fsdp = ctx.parallel.fsdp
    return forward or (fsdp.reshard_after_forward if fsdp else True)


def frees(ctx: Context, forward: bool, last: bool) -> bool:
    """Whether a layer's pass frees its gathered parameters after it: every
    backward, and every forward when resharding; under ``no_sync`` the last
    micro-batch's backward (``last``) only."""
    if no_sync(ctx):
        return not forward and last
    fsdp = ctx.parallel.fsdp
    return not forward or fsdp is None or fsdp.reshard_after_forward


def unit_frees(ctx: Context, forward: bool, last: bool, gathered: bool) -> bool:
    """Whether the embedding's or the head's unit is freed after this pass: after
    each use it was gathered for, or under ``no_sync`` the last backward."""
    return (not forward and last) if no_sync(ctx) else gathered


def gather(b: Stage, layer: int, phase: Phase, mb: int, after: int | None,
           params: int) -> int:
    """ZeRO-3/FSDP all-gather of a unit of ``params`` over the data-parallel shard
    group (the embedding: layer -1; the head: ``layers``), non-blocking."""
    full, grown = b.ctx.plan.param_bytes * params, gathered_bytes(b.ctx, params)
    group = "dp_shard" if hybrid(b.ctx) else b.ctx.dp_group
    return b.collective(Collective.ALL_GATHER, full, DP_STREAM, group, phase, mb, layer,
                        deps=(after,) if after is not None else (), blocking=False,
                        mem=((grown, "gathered_parameters"),))


def gather_layer(b: Stage, layer: int, phase: Phase, mb: int, after: int | None
                 ) -> tuple[int, ...]:
    """ZeRO-3/FSDP all-gathers of one layer's units (``layer_units``), non-blocking."""
    deps = (after,) if after is not None else ()
    size = b.ctx.plan.param_bytes
    return tuple(b.collective(Collective.ALL_GATHER, size * n, DP_STREAM, group, phase,
                              mb, layer, deps=deps, blocking=False,
                              mem=((gathered_bytes(b.ctx, n, shards), "gathered_parameters"),))
                 for n, group, shards in layer_units(b.ctx, layer))


def root_params(ctx: Context) -> int:
    """Parameters of FSDP1's root unit without a pipeline (0 elsewhere): what the
    layers' units leave, the embedding, the final norm and the output layer.
    FSDP1 does not free the root's gathered parameters after the forward, which
    its backward would gather again at once (``_post_forward_reshard``), so the
    root is gathered once per micro-batch and freed, and its gradients
    reduce-scattered, when the backward is done. (FSDP2 as TorchTitan applies it
    wraps the embedding and the output layer as units of their own.)"""
    parallel = ctx.parallel
    if parallel.fsdp is None or parallel.zero_stage < 3 or parallel.pp > 1 or parallel.fsdp2:
        return 0
    return embedding_params(ctx) + head_params(ctx)


def units(ctx: Context, k: int) -> tuple[tuple[int, int] | None, tuple[int, int] | None]:
    """(head, embedding) units, (unit id, parameters), that virtual stage ``k``
    gathers as flat units: the head on the last, the embedding on the first
    (none under FSDP1's root unit, ``root_params``)."""
    if not flat_units(ctx) or root_params(ctx):
        return None, None
    return ((ctx.model.layers, head_params(ctx, False)) if ctx.ends(k) else None,
            (-1, embedding_params(ctx)) if ctx.starts(k) else None)


def gather_unit(b: Stage, unit: tuple[int, int] | None, phase: Phase, mb: int) -> int | None:
    """The gather of a unit (unit id, parameters: the embedding or the head) used
    first in a pass, issued now; None without one."""
    return None if unit is None else gather(b, unit[0], phase, mb, b.last_compute, unit[1])


def copy_out(b: Stage, layer: int, phase: Phase, mb: int, gathers: tuple[int, ...]) -> bool:
    """FSDP2: the copy-out kernel that splits a layer's gathered buffer into its
    parameters (read and write them, on the compute stream, after the gathers);
    whether there is one (FSDP1 gathers into the flat parameter in place)."""
    if not b.ctx.parallel.fsdp2:
        return False
    params = sum(n for n, _, _ in layer_units(b.ctx, layer))
    copy = K.elementwise("fsdp_copy_out", params, params, b.ctx.plan.param_bytes)
    b.compute(copy, phase, mb, layer, 0.0, copy.bytes, extra=gathers)
    return True


def reduce_layer(b: Stage, layer: int, mb: int, params: int | None = None) -> None:
    """ZeRO-3/FSDP: reduce-scatter a layer's units' (or a unit of ``params``')
    gradients (and all-reduce the shard across replicas with hybrid sharding)
    after its backward."""
    units = layer_units(b.ctx, layer) if params is None else ((params, "", b.ctx.shards),)
    is_hybrid = hybrid(b.ctx)
    for n, group, _ in units:
        full = b.ctx.plan.reduce_bytes * n
        group = group if group == "edp" else "dp_shard" if is_hybrid else b.ctx.dp_group
        i = b.collective(Collective.REDUCE_SCATTER, full, DP_STREAM, group, Phase.BACKWARD,
                         mb, layer, deps=(b.last_compute,), blocking=False)
        b.reduces.append(i)
        if group == "dp_shard" and b.ctx.parallel.dp // b.ctx.shards > 1:
            b.reduces.append(b.collective(Collective.ALL_REDUCE, full / b.ctx.shards,
                                          DP_STREAM, "dp_replicate", Phase.BACKWARD, mb,
                                          layer, deps=(i,), blocking=False))


def coordinator_trace(ctx: Context) -> tuple[list[tuple], list[tuple]]:
    """DeepSpeed ZeRO-3's trace of one micro-batch (a single pipeline stage holds
    every layer): the (layer, kernel key, tensor, elements) of each kernel's
    parameters in the order the forward, then the backward, runs them. The
    embedding is layer -1 and the head ``layers``; a tied logits weight is the
    embedding's word table; a full recompute's forward precedes each backward."""
    m, sh, n = ctx.model, ctx.shard, ctx.model.layers
    word = ctx.vocab * m.hidden // sh.tp
    embedding = [(-1, "embedding", "word", word)]
    if m.learned_positions:
        embedding.append((-1, "embedding", "positions", sh.seq * m.hidden))
    head = []
    for kernel in K.head_kernels(m, sh, vocab=ctx.vocab, owns_logits=True):
        tied = kernel.name == "logits" and not ctx.owns_logits
        if kernel.params:
            head.append((n, kernel.name, "word" if tied else kernel.name,
                         word if tied else kernel.params))
    forward = [(layer, i, (layer, k.name), k.params) for layer in range(n)
               for i, k in plan_kernels(ctx.passes[True]) if k.params]
    recompute = ctx.training.recompute is Recompute.FULL
    backward = []
    for layer in range(n - 1, -1, -1):
        if recompute:
            backward += [u for u in forward if u[0] == layer]
        backward += [(layer, -1 - i, (layer, k.name), k.params)
                     for i, k in plan_kernels(ctx.passes[False]) if k.params]
    return embedding + forward + head, head[::-1] + backward + embedding


class Coordinator:
    """DeepSpeed ZeRO-3's parameter coordinator over one micro-batch: which uses
    gather their tensor and which release it (``frameworks.reuse_plan``), worked
    out once per stage; ``fetcher`` gives one pass's ``TensorFetcher``."""

    def __init__(self, ctx: Context) -> None:
        spec = ctx.parallel.deepspeed_zero3
        forward, backward = coordinator_trace(ctx)
        uses = forward + backward
        persistent = {u[2] for u in uses if u[3] < spec.stage3_param_persistence_threshold}
        gathers, releases = reuse_plan([(u[2], u[3]) for u in uses], persistent,
                                       spec.stage3_max_reuse_distance)
        flagged = [(*u, g, r) for u, g, r in zip(uses, gathers, releases, strict=True)]
        self.passes = {True: flagged[:len(forward)], False: flagged[len(forward):]}
        self.prefetch = spec.stage3_prefetch_bucket_size

    def fetcher(self, b: Stage, forward: bool, mb: int) -> TensorFetcher:
        return TensorFetcher(b, self.passes[forward], self.prefetch,
                             Phase.FORWARD if forward else Phase.BACKWARD, mb)


class TensorFetcher:
    """DeepSpeed ZeRO-3's parameter coordinator over one pass: one all-gather per
    module parameter that is not in memory (``Coordinator``), issued where
    ``frameworks.prefetch_points`` puts it (``stage3_prefetch_bucket_size``
    elements ahead); each kernel waits for its own gathers, and each layer's end
    releases what the coordinator releases there.

    ``wait(layer, key)`` is called as each kernel is appended: it appends the
    gathers due there and returns those the kernel waits for."""

    def __init__(self, b: Stage, uses: list[tuple], window: float, phase: Phase,
                 mb: int) -> None:
        self.b, self.phase, self.mb = b, phase, mb
        self.grown = b.ctx.plan.param_bytes * (1 - 1 / b.ctx.shards)  # gathered bytes per element
        gathered = [u for u in uses if u[4]]
        self.tensors = [(layer, numel) for layer, _, _, numel, *_ in gathered]
        self.at: dict[tuple, list[int]] = {}
        for t, (layer, key, *_) in enumerate(gathered):
            self.at.setdefault((layer, key), []).append(t)
        self.released: dict[int, float] = {}
        for layer, _, _, numel, _, release in uses:
            if release:
                self.released[layer] = self.released.get(layer, 0.0) + self.grown * numel
        points = prefetch_points([numel for _, numel in self.tensors], window)
        self.due: dict[int, list[int]] = {}
        for i, j in enumerate(points):
            self.due.setdefault(j, []).append(i)
        self.gathers: dict[int, int] = {}

    def release(self, layer: int) -> tuple[tuple[float, str], ...]:
        """The memory event of what the coordinator releases after ``layer``."""
        freed = self.released.get(layer, 0.0)
        return ((-freed, "gathered_parameters"),) if freed else ()

    def wait(self, layer: int, key: object) -> tuple[int, ...]:
        b = self.b
        for i in self.at.get((layer, key), ()):
            after = () if b.last_compute is None else (b.last_compute,)
            for t in self.due.pop(i, ()):
                lay, numel = self.tensors[t]
                self.gathers[t] = b.collective(
                    Collective.ALL_GATHER, b.ctx.plan.param_bytes * numel, DP_STREAM,
                    b.ctx.dp_group,
                    self.phase, self.mb, lay, deps=after, blocking=False,
                    mem=((self.grown * numel, "gathered_parameters"),),
                    name="param_all_gather")
        return tuple(self.gathers[i] for i in self.at.get((layer, key), ()))
