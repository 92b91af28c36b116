"""The per-rank program of one training iteration for any tp x cp x dp x pp layout.

Megatron-LM's execution, op by op (Shoeybi et al. 2019; Narayanan et al. 2021;
Korthikanti et al. 2022), composed from the parallel strategies in
``workloads.strategies`` (each owns its groups, its layout checks and its
ops): every pipeline stage walks its schedule, each step a chunk of layers in
forward or backward, each layer its kernels with the tensor- and
context-parallel communication where Megatron puts it and ZeRO-3/FSDP's
gathers around it; the last micro-batch's gradients are reduced by the
data-parallel strategy; then the optimizer step.

- Recompute: full re-runs each layer's forward (with its tensor-parallel
  communication) before its backward; selective re-runs the attention core
  when it is not fused (fused attention always recomputes it).
- Memory: activations are allocated when a layer's forward ends and freed
  when its backward ends, so micro-batches in flight per stage come out of the
  schedule; gathered ZeRO-3 parameters and pipeline buffers are tracked too.
"""

from __future__ import annotations

from functools import partial

from simulator.base.ir import TP_STREAM, Collective, Phase, Program
from workloads import dualpipe, moe_overlap, mtp, offload, precision, recompute, stamping
from workloads import kernels as K
from workloads import routing as routes
from workloads.elementwise_kernels import loss_all_reduces
from workloads.layer_passes import chunk_layers, layer_pass, pass_plan
from workloads.layout import Layout, parse_order
from workloads.memory import Recompute
from workloads.models import ModelSpec, padded_vocab
from workloads.optimizer_step import amax_reduction, optimizer_pass
from workloads.schedules import ALL, INPUT, WEIGHT, Step, steps_for, warmups
from workloads.stage import Context, LayoutError, Stage, kernel_cost
from workloads.stage_memory import stage_param_split, static_memory
from workloads.strategies import context, data, expert, pipeline, sharded, tensor
from workloads.training import ParallelSpec, TrainingSpec

__all__ = ["LayoutError", "build_program", "check"]

STRATEGIES = (tensor, context, data, pipeline, sharded, expert)  # groups and checks, in order
DIMENSIONS = tuple(d for strategy in STRATEGIES for d in strategy.DIMENSIONS)  # declared once each


def _embedding(b: Stage, mb: int, forward: bool, record: bool,
               unit: int | None = None, fetcher: sharded.TensorFetcher | None = None,
               owns: bool = False) -> None:
    """Token embedding (and its tensor-parallel reduction); ``unit``: its ZeRO-3
    gather; ``owns``: whether it is a ZeRO-3 unit, freed after use (under
    ``fsdp.no_sync`` after the last backward) and reduce-scattered after a
    recorded backward; ``fetcher``: DeepSpeed ZeRO-3's, which gathers and releases
    its tables. Under FSDP1's root unit (``sharded.root_params``) the forward
    gathers the root and the backward frees it and reduce-scatters its gradients."""
    ctx = b.ctx
    sh, phase = ctx.shard, Phase.FORWARD if forward else Phase.BACKWARD
    kernel = K.embedding_kernels(ctx.model, sh, vocab=ctx.vocab)[0]
    nbytes = sh.tokens * ctx.model.hidden * sh.dtype_bytes
    kind = (Collective.REDUCE_SCATTER if sh.sequence_parallel else Collective.ALL_REDUCE) \
        if forward else (Collective.ALL_GATHER if sh.sequence_parallel else None)
    if not forward and sh.tp > 1 and kind is not None:
        b.collective(kind, nbytes, TP_STREAM, "tp", phase, mb, -1)
    flops, cost = kernel_cost(kernel, not forward, ctx.training)
    root = sharded.root_params(ctx)
    if root and sharded.gathers(ctx, True, mb) and forward:
        unit = sharded.gather(b, -1, phase, mb, b.last_compute, root)
    ready = b.param_ready.pop(-1, None) if forward else None
    extra = tuple(x for x in (ready, unit) if x is not None)
    owned = root or kernel.params  # what it frees and reduces
    frees = (not forward and sharded.frees(ctx, False, record)) if root else \
        owns and sharded.unit_frees(ctx, forward, record, unit is not None)
    free = sharded.freed(ctx, owned) if frees else ()
    if fetcher is not None:
        extra, free = extra + fetcher.wait(-1, "embedding"), fetcher.release(-1)
    i = b.compute(kernel, phase, mb, -1, flops, cost, mem=free, extra=extra)
    if record:
        b.grads.setdefault(-1, []).append((i, ctx.plan.reduce_bytes * kernel.params))
        if owns or root:
            sharded.reduce_layer(b, -1, mb, owned)
    if forward and sh.tp > 1:
        b.collective(kind, nbytes, TP_STREAM, "tp", phase, mb, -1)


def _head(b: Stage, mb: int, forward: bool, record: bool, unit: int | None = None,
          fetcher: sharded.TensorFetcher | None = None, owns: bool = False) -> None:
    """Final norm, vocabulary-parallel logits and cross-entropy (with its small
    tensor-parallel all-reduces, ``loss_all_reduces``); ``unit``: its ZeRO-3
    gather; ``owns``: whether it is a ZeRO-3 unit, freed after use (under
    ``fsdp.no_sync`` after the last backward) and reduce-scattered after a
    recorded backward; ``fetcher``: DeepSpeed ZeRO-3's, which gathers and releases
    its weights."""
    ctx = b.ctx
    sh, m = ctx.shard, ctx.model
    phase, layer = Phase.FORWARD if forward else Phase.BACKWARD, m.layers
    kernels = K.head_kernels(m, sh, vocab=ctx.vocab, owns_logits=ctx.owns_logits)
    held = sh.tokens * (ctx.vocab // sh.tp) * (sh.dtype_bytes + 4)
    sequence = kernels if forward else kernels[::-1]
    frees = owns and sharded.unit_frees(ctx, forward, record, unit is not None)
    if not forward:
        mtp.depths(b, mb, False, record)
    for n, kernel in enumerate(sequence):
        if kernel.name == "logits" and sh.tp > 1 and sh.sequence_parallel:
            kind = Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER
            b.collective(kind, sh.tokens * m.hidden * sh.dtype_bytes, TP_STREAM, "tp", phase,
                         mb, layer)
        flops, nbytes = kernel_cost(kernel, not forward, ctx.training)
        mem = ((held if forward else -held, "activations"),) if n == len(sequence) - 1 else ()
        if frees and n == len(sequence) - 1:
            mem += sharded.freed(ctx, sharded.head_params(ctx, False))
        ready = b.param_ready.pop(layer, None) if forward else None
        extra = tuple(x for x in (ready, unit if n == 0 else None) if x is not None)
        if fetcher is not None:
            extra += fetcher.wait(layer, kernel.name)
            mem += fetcher.release(layer) if n == len(sequence) - 1 else ()
        i = b.compute(kernel, phase, mb, layer, flops, nbytes, mem=mem, extra=extra)
        if record and kernel.params:
            b.grads.setdefault(layer, []).append((i, ctx.plan.reduce_bytes * kernel.params))
        for each in loss_all_reduces(sh.fused_loss) if (
                kernel.name == "loss" and forward and sh.tp > 1) else ():
            b.collective(Collective.ALL_REDUCE, each * sh.tokens, TP_STREAM, "tp", phase, mb,
                         layer)
    if forward:
        mtp.depths(b, mb, True, record)
    if record and owns:
        sharded.reduce_layer(b, layer, mb, sharded.head_params(ctx))


def _step(b: Stage, step: Step) -> None:
    """One forward or backward of one micro-batch through one chunk of this stage
    (or a zero-bubble backward's weight gradients: ``_weights``)."""
    if step.part == WEIGHT:
        _weights(b, step)
        return
    ctx = b.ctx
    k = ctx.virtual(b.stage, step.chunk)
    layers, mb = ctx.chunks[k], step.microbatch
    record = _records(ctx, step)[1]
    head, embedding = sharded.units(ctx, k)  # ZeRO-3: the embedding and the head are units
    gathers = sharded.gathers(ctx, step.forward, mb)  # their gathers, as the layers'
    fetcher = _fetcher(b, step.forward, mb)
    if step.forward:
        if not ctx.starts(k):
            pipeline.receive(b, k, True, mb, layers.start)
        else:
            _embedding(b, mb, True, False, sharded.gather_unit(
                b, embedding if gathers else None, Phase.FORWARD, mb), fetcher, bool(embedding))
        ready = chunk_layers(b, layers, mb, True, False, head if gathers else None, fetcher)
        if ctx.ends(k):
            _head(b, mb, True, False, ready, fetcher, bool(head))
        else:
            pipeline.send(b, k, True, mb, layers.stop - 1)
        return
    if not ctx.ends(k):
        pipeline.receive(b, k, False, mb, layers.stop - 1)
    else:
        _head(b, mb, False, record, sharded.gather_unit(
            b, head if gathers else None, Phase.BACKWARD, mb), fetcher, bool(head))
    held = [] if step.part == INPUT else None  # (its weight gradients: a later W step's)
    if held is not None:
        b.held.append((step, held))
    ready = chunk_layers(b, layers, mb, False, record, embedding if gathers else None,
                          fetcher, held)
    if ctx.starts(k):
        _embedding(b, mb, False, record, ready, fetcher, bool(embedding))
    else:
        pipeline.send(b, k, False, mb, layers.start)
    if held is None:
        _recorded(b, step)


def _records(ctx: Context, step: Step) -> tuple[bool, bool]:
    """(whether a backward step is its chunk's last, whether it records gradients)."""
    last = not step.forward and step.microbatch == ctx.microbatches(step.chunk)[-1]
    return last, last or (not step.forward and ctx.parallel.reduces_every_micro_batch)


def _recorded(b: Stage, step: Step) -> None:
    """After a backward's gradients are all computed: the chunk's last backward
    noted, and its gradients reduced when the step records them."""
    last, record = _records(b.ctx, step)
    if last:
        b.last_backward[step.chunk] = b.last_compute
    if record:
        data.bucket_reduces(b, step.chunk)


def _weights(b: Stage, step: Step) -> None:
    """A zero-bubble W step (``workloads.dualpipe``): the weight gradients the
    backward of the same micro-batch and chunk held back (first in, first out),
    then what follows that backward's gradients (``_recorded``)."""
    done, layers = b.held.pop(0)
    assert (done.microbatch, done.chunk) == (step.microbatch, step.chunk), (done, step)
    record = _records(b.ctx, step)[1]
    for layer, items in layers:
        layer_pass(b, layer, step.microbatch, False, record=record, plan=items)
    _recorded(b, step)


def _fetcher(b: Stage, forward: bool, mb: int) -> sharded.TensorFetcher | None:
    """DeepSpeed ZeRO-3's parameter coordinator for one pass (its single pipeline
    stage runs every layer), or None elsewhere."""
    if b.ctx.parallel.deepspeed_zero3 is None:
        return None
    if b.coordinator is None:
        b.coordinator = sharded.Coordinator(b.ctx)
    return b.coordinator.fetcher(b, forward, mb)


def _finish_stage(b: Stage) -> None:
    """Tied-embedding sync (DualPipe: the mirror reduction), optimizer step and
    ZeRO 1/2 parameter all-gather."""
    ctx = b.ctx
    pipeline.tied_embedding_sync(b)
    zero = ctx.parallel.zero_stage
    dense, experts = stage_param_split(ctx, b.stage)
    edp = expert.expert_data_parallel(ctx.parallel)
    owned = dense / (ctx.shards if zero >= 1 else 1) + experts / (edp if zero >= 1 else 1)
    assert not b.grads and not b.expert_grads and not b.held, "gradients never reduced"
    dualpipe.mirror_reduce(b, owned)
    b.ready = list(b.reduces)
    amax_reduction(b)
    optimizer_pass(b, owned)
    data.gather_updated_parameters(b, dense, experts)


STAMP = True  # steps of one kind copied from the first (tests turn it off to compare)


def build_stage(ctx: Context, stage: int) -> Stage:
    b = Stage(ctx, stage, offloaded=offload.offloaded(ctx, stage))
    if data.gathers_ahead(ctx):
        data.gather_parameters_ahead(b)
    made: dict[tuple, stamping.Pattern | None] = {}  # step key -> its first instance, as a pattern
    stampable = STAMP and stamping.stampable(ctx)
    for pair in _schedule(ctx, stage):
        first = len(b.ops)
        combined = len(pair) == 2  # a forward and a backward as one step
        key = moe_overlap.key(pair, partial(_step_key, ctx)) if combined else \
            _step_key(ctx, pair[0])
        mbs = tuple(s.microbatch for s in reversed(pair))  # (combined: the backward's first)
        stamps = stampable and all(s.part == ALL for s in pair)  # (held weights are state)
        pattern = made.get(key) if stamps else None
        if pattern is None or not pattern.stamp(b, mbs[0]):
            entry = (*b.ready, b.last_compute)
            if combined:
                moe_overlap.combine(b, *pair, _step)
            else:
                _step(b, pair[0])
            if stamps and key not in made:
                made[key] = stamping.Pattern.of(b, first, mbs, entry)
        b.steps.append((first, len(b.ops), key))
    _finish_stage(b)
    return b


def _schedule(ctx: Context, stage: int) -> list[tuple[Step, ...]]:
    """Stage ``stage``'s steps, one at a time or two as one combined step: the
    schedule's, paired by the expert-parallel overlap (``moe_overlap``), or
    DualPipe's (``dualpipe.schedule``)."""
    parallel, m = ctx.parallel, ctx.micro_batches
    if ctx.dualpipe:
        return dualpipe.schedule(parallel.pp, m, stage)
    overlap = parallel.moe_overlap != "none"
    extra = moe_overlap.extra_warmup(parallel, m) if overlap else 0
    p, v = parallel.pp, parallel.virtual_stages
    steps = steps_for(parallel.schedule, p, m, v, stage, extra)
    if not overlap:
        return [(step,) for step in steps]
    return moe_overlap.pairs(steps, warmups(parallel.schedule, p, m, v, stage, extra))


def _step_key(ctx: Context, step: Step) -> tuple:
    """What a step's ops depend on besides its micro-batch (``Program.steps``):
    direction, chunk, and whether it is the micro-batch that records gradients
    (or, forward, the first, which waits for overlapped parameter all-gathers)."""
    mine = ctx.microbatches(step.chunk)
    edge = step.microbatch == mine[-1] if not step.forward else \
        step.microbatch == mine[0] and data.gathers_ahead(ctx)
    key = (step.forward, step.chunk, edge) + ((step.part,) if step.part != ALL else ())
    if ctx.routing is not None and ctx.routing.varies:  # each micro-batch's loads differ
        return (*key, step.microbatch)
    return key


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Raise LayoutError naming the scenario keys of the first impossible setting."""
    for strategy in STRATEGIES:
        strategy.check(model, training, parallel)
    offload.check(model, training, parallel)
    recompute.check(model, training)
    for why in (moe_overlap.check(model, training, parallel), precision.check(training, parallel)):
        if why:
            raise LayoutError(why)


def _groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {name: group for strategy in STRATEGIES
            for name, group in strategy.groups(ctx, layout).items()}


def _layer_sequence(model: ModelSpec, shard: K.Shard, parallel: ParallelSpec,
                    layer: int | None) -> list:
    """Transformer layer ``layer``'s kernels with its tensor-parallel collectives,
    and, in a MoE layer only, its experts' all-to-alls (any kind of layer: dense or
    MoE, full or sliding-window attention; None: a dense full-attention layer)."""
    kernels = tensor.layer_sequence(K.layer_kernels(model, shard, layer=layer, ep=parallel.ep,
                                                    etp=parallel.etp))
    return expert.sequence(kernels, parallel.etp) if model.is_moe_layer(layer) else kernels


def make_context(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec,
                 seed: int = 0) -> Context:
    """What every stage's builder needs, checked and worked out once (``seed``: the
    scenario's, for MoE routing draws)."""
    check(model, training, parallel)
    vocab = padded_vocab(model.vocab, parallel.tp)
    micro_batches, plan = parallel.micro_batches(training), parallel.gradient_plan(training)
    shard = K.Shard(training.micro_batch, training.seq_len, training.dtype_bytes, parallel.tp,
                    parallel.cp, parallel.sequence_parallel, training.flash_attention,
                    training.low_precision(micro_batches), training.fp8_attention,
                    training.hidden_dropout, parallel.megatron_fusions,
                    plan.reduce_bytes if parallel.megatron_fusions else 0)
    sequence = _layer_sequence(model, shard, parallel, None)
    kinds = {}
    for n in range(model.layers):  # each other kind of layer: its own plans, made once
        kind = model.layer_kind(n)
        if kind != (False, False) and kind not in kinds:
            layer = _layer_sequence(model, shard, parallel, n)
            kinds[kind] = {f: pass_plan(layer, shard, training, f, parallel.tp_comm_overlap,
                                        parallel.delay_wgrad_compute) for f in (True, False)}
    routing = routes.draw(model, parallel.ep, shard.tokens // shard.norm_split * model.top_k,
                          micro_batches, seed, expert.domains(parallel)) if model.experts \
        else None
    passes = {f: pass_plan(sequence, shard, training, f, parallel.tp_comm_overlap)
              for f in (True, False)}
    again = {kind: recompute.positions(plans[True], training.rerun, kind[0]) for kind, plans in
             (((False, False), passes), *kinds.items())} if training.rerun else {}
    return Context(model, training, parallel, shard, vocab,
                   dualpipe.chunks(parallel, pipeline.virtual_stage_layers(model, parallel)),
                   micro_batches, "dp", sharded.shard_size(parallel), passes, plan, kinds,
                   routing, again)


def build_program(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec,
                  seed: int = 0) -> Program:
    """One iteration of ``model`` trained as ``training`` says, split as ``parallel`` says
    (``seed``: the scenario's, for MoE routing draws)."""
    ctx = make_context(model, training, parallel, seed)
    layout = Layout({"tp": parallel.tp, "cp": parallel.cp, "dp": parallel.dp,
                     "pp": parallel.pp}, parse_order(parallel.order))
    stages = [build_stage(ctx, s) for s in range(parallel.pp)]
    stage_ops = [tuple(b.ops) for b in stages]
    stage_steps = [tuple(b.steps) for b in stages]
    memory = [static_memory(ctx, s) for s in range(parallel.pp)]
    stage_of = [layout.coords(r)["pp"] for r in range(layout.world)]
    return Program(
        ops=tuple(stage_ops[s] for s in stage_of),
        groups=_groups(ctx, layout),
        static_memory=tuple(memory[s] for s in stage_of),
        model_flops=K.model_flops(model, training.global_batch, training.seq_len, _kept(ctx)),
        tokens=training.global_batch * training.seq_len,
        stage=tuple(stage_of),
        steps=tuple(stage_steps[s] for s in stage_of),
        notes={"micro_batches": ctx.micro_batches,
               "parameters": K.parameter_count(model, training.seq_len),
               "buckets": sum(1 for op in stage_ops[0] if op.name.startswith(
                   ("all_reduce[", "reduce_scatter["))),
               "hardware_flops": _hardware_flops(ctx), **_moe_notes(ctx)},
    )


def _moe_notes(ctx: Context) -> dict:
    """What routing came to, in a model with experts: one private note, which the
    summary turns into its MoE keys all together (``analysis.summary.moe_keys``)."""
    r = ctx.routing
    if r is None:
        return {}
    return {"_moe": {"moe_routing": ctx.model.routing, "moe_rank_imbalance": r.imbalance,
                     "moe_expert_imbalance": r.expert_imbalance,
                     "moe_dropped_fraction": r.dropped, "load_factors": expert.load_factors(ctx)}}


def _kept(ctx: Context) -> float:
    """The share of routed token copies the experts keep (1: dropless)."""
    return 1.0 - ctx.routing.dropped if ctx.routing is not None else 1.0


def _hardware_flops(ctx: Context) -> float:
    """FLOPs the GPUs execute in one iteration, recompute included, whole job
    (the kept token copies' expert FLOPs)."""
    b, kept = ctx.training.global_batch, _kept(ctx)
    flops = K.model_flops(ctx.model, b, ctx.training.seq_len, kept)
    if ctx.training.recompute is Recompute.FULL:
        layers = K.all_layer_kernels(ctx.model, ctx.training.micro_batch, ctx.training.seq_len)
        flops += sum(k.flops * (kept if K.is_expert(k) else 1.0)
                     for k in layers) * b / ctx.training.micro_batch
    elif ctx.training.rerun:
        flops += recompute.flops(ctx.model, ctx.training, kept) * b / ctx.training.micro_batch
    return flops

