"""The per-rank program of one training iteration for any tp x cp x dp x pp layout.

Megatron-LM's execution, op by op (Shoeybi et al. 2019; Narayanan et al. 2021;
Korthikanti et al. 2022):

- Each pipeline stage runs its schedule (``workloads.schedules``); a forward
  step receives activations from the previous virtual stage and sends its
  output on; a backward step receives the output gradient and sends the input
  gradient back. Point-to-point groups are named ``pp.f<k>`` / ``pp.b<k>`` for
  the boundary after virtual stage k.
- Inside a layer, tensor parallelism adds Megatron's f and g operators on the
  ``tp`` stream: without sequence parallelism an all-reduce after the attention
  and MLP blocks in forward and before them in backward (2 + 2 per layer); with
  it an all-gather before and a reduce-scatter after each block, mirrored in
  backward. Context parallelism runs attention as ``cp`` chunks, exchanging
  K/V around the cp ring on the ``cp`` stream while the previous chunk
  computes (K/V and their gradients in backward).
- Recompute: full re-runs each layer's forward (with its tensor-parallel
  communication) before its backward; selective re-runs the attention core
  when it is not fused (fused attention always recomputes it).
- Data parallelism over the dp (x cp) group: gradient buckets of the last
  micro-batch are all-reduced (ZeRO 0) or reduce-scattered (ZeRO 1/2) on the
  ``dp`` stream as soon as their backward op ends; ZeRO 1/2 all-gather the
  updated parameters after the optimizer step. ZeRO-3 / FSDP all-gather each
  layer's parameters before its forward (and again before its backward when
  resharding), prefetching one layer ahead, and reduce-scatter its gradients
  after its backward; hybrid sharding reduce-scatters inside the shard group
  and all-reduces the shard across replicas.
- Tied embeddings on different stages all-reduce their gradients (``embd``).
- Memory: activations are allocated when a layer's forward ends and freed
  when its backward ends, so micro-batches in flight per stage come out of the
  schedule; gathered ZeRO-3 parameters and pipeline buffers are tracked too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from simulator.base.ir import COMPUTE_STREAM, Collective, KernelClass, Op, OpKind, Phase, Program
from workloads import kernels as K
from workloads.buckets import make_buckets
from workloads.layout import Layout, parse_order
from workloads.memory import (
    GRAD_BYTES,
    PARAM_BYTES,
    Recompute,
    activation_bytes_per_layer,
    communication_buffer_bytes,
    model_state_bytes,
)
from workloads.models import ModelSpec, padded_vocab
from workloads.schedules import Step, steps_for
from workloads.training import ParallelSpec, Sharding, TrainingSpec

ADAM_BYTES_PER_PARAM = 28  # read fp32 master, m, v and the grad; write them and the weight
PP_STREAM, TP_STREAM, CP_STREAM, DP_STREAM = "pp", "tp", "cp", "dp"


class LayoutError(ValueError):
    """A parallel layout that cannot run; the message names the keys."""


def split_even(total: int, parts: int) -> list[int]:
    """``total`` into ``parts`` near-equal counts, larger ones first.

    >>> split_even(10, 4)
    [3, 3, 2, 2]
    """
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def virtual_stage_layers(layers: int, pp: int, v: int,
                         stage_layers: Sequence[int] | None) -> list[range]:
    """Layers of each virtual stage k = chunk * pp + stage, numbered in model order.

    Even by default (Megatron needs layers divisible by pp * v); with
    ``stage_layers`` each stage's layers are split over its v chunks.

    >>> virtual_stage_layers(8, 2, 2, None)
    [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    """
    if stage_layers is None:
        if layers % (pp * v):
            raise LayoutError(f"model.layers ({layers}) must be divisible by parallelism.pp x "
                              f"virtual_stages ({pp * v}); or give parallelism.stage_layers")
        counts = [layers // pp] * pp
    else:
        counts = list(stage_layers)
    per_chunk = [split_even(c, v) for c in counts]  # per stage, per chunk
    out, start = [], 0
    for chunk in range(v):
        for stage in range(pp):
            n = per_chunk[stage][chunk]
            out.append(range(start, start + n))
            start += n
    return out


@dataclass(frozen=True)
class _Context:
    """Everything a stage's builder needs, computed once."""

    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    shard: K.Shard
    vocab: int
    chunks: list[range]  # virtual stage -> layers
    micro_batches: int
    dp_group: str  # the data-parallel group dimension for gradients
    shards: int  # ZeRO/FSDP shard count

    @property
    def last_virtual(self) -> int:
        return len(self.chunks) - 1

    @cached_property
    def layer_sequence(self) -> list[K.Kernel | bool]:
        """One layer's forward kernels with Megatron's f/g markers (same for every layer)."""
        return _layer_sequence(K.layer_kernels(self.model, self.shard))

    @cached_property
    def layer_params(self) -> int:
        """Parameters of one layer on one rank."""
        return sum(k.params for k in K.layer_kernels(self.model, self.shard))

    @property
    def act_bytes(self) -> float:
        """Bytes one micro-batch's activation tensor has when crossing a stage."""
        sh = self.shard
        return sh.tokens * self.model.hidden * sh.dtype_bytes / sh.norm_split


@dataclass
class _Stage:
    """Appends one stage's ops, tracking what the next op must wait for."""

    ctx: _Context
    stage: int
    ops: list[Op] = field(default_factory=list)
    last_compute: int | None = None
    ready: list[int] = field(default_factory=list)  # non-compute ops the next compute waits for
    grads: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # chunk -> grads
    last_backward: dict[int, int] = field(default_factory=dict)  # chunk -> op index
    reduces: list[int] = field(default_factory=list)

    def _add(self, op: Op) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def compute(self, kernel: K.Kernel, phase: Phase, mb: int, layer: int, flops: float,
                nbytes: float, mem: tuple = (), extra: Sequence[int] = ()) -> int:
        deps = tuple(self.ready) + tuple(extra)
        i = self._add(Op(OpKind.COMPUTE, kernel.name, COMPUTE_STREAM, phase, deps, kernel.cls,
                         flops, nbytes, kernel.shape, microbatch=mb, layer=layer, mem=mem))
        self.last_compute, self.ready = i, []
        return i

    def _after_compute(self) -> tuple[int, ...]:
        return tuple(self.ready) + ((self.last_compute,) if self.last_compute is not None else ())

    def collective(self, kind: Collective, nbytes: float, stream: str, group: str, phase: Phase,
                   mb: int, layer: int, deps: tuple[int, ...] | None = None,
                   blocking: bool = True, mem: tuple = (), name: str = "") -> int:
        i = self._add(Op(OpKind.COLLECTIVE, name or kind.value, stream, phase,
                         self._after_compute() if deps is None else deps, bytes=nbytes,
                         collective=kind, group=group, microbatch=mb, layer=layer, mem=mem))
        if blocking:
            self.ready.append(i)
        return i

    def p2p(self, kind: OpKind, dim: str, phase: Phase, mb: int, layer: int) -> int:
        i = self._add(Op(kind, "send" if kind is OpKind.SEND else "recv", PP_STREAM, phase,
                         self._after_compute(), bytes=self.ctx.act_bytes, group=dim,
                         microbatch=mb, layer=layer))
        if kind is OpKind.RECV:
            self.ready.append(i)
        return i


def _tp_comm(forward: bool, before_block: bool, sp: bool) -> Collective | None:
    """Megatron's f (before a block) and g (after it) in forward or backward."""
    if not sp:
        return Collective.ALL_REDUCE if forward != before_block else None
    if before_block:
        return Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER
    return Collective.REDUCE_SCATTER if forward else Collective.ALL_GATHER


UNFUSED_ATTENTION = ("attn_scores", "softmax", "attn_values")


def _kernel_cost(kernel: K.Kernel, backward: bool, training: TrainingSpec) -> tuple[float, float]:
    """(FLOPs, bytes) a kernel executes. Selective recompute re-runs the unfused
    attention core's forward inside its backward (Korthikanti et al. 2022)."""
    if not backward:
        return kernel.flops, kernel.bytes
    flops, nbytes = K.backward_flops(kernel), 2.0 * kernel.bytes
    if kernel.name in UNFUSED_ATTENTION and training.recompute is Recompute.SELECTIVE:
        flops, nbytes = flops + kernel.flops, nbytes + kernel.bytes
    return flops, nbytes


def _attention(b: _Stage, kernel: K.Kernel, forward: bool, phase: Phase, mb: int,
               layer: int) -> None:
    """Attention, as cp chunks with a K/V ring exchange before each but the first."""
    ctx = b.ctx
    cp = ctx.shard.cp
    flops, nbytes = _kernel_cost(kernel, not forward, ctx.training)
    if cp == 1:
        b.compute(kernel, phase, mb, layer, flops, nbytes)
        return
    m = ctx.model
    kv = ctx.shard.tokens * 2 * m.kv_heads * m.head_dim * ctx.shard.dtype_bytes / ctx.shard.tp
    exchange = kv if forward else 2 * kv  # backward also rotates dK, dV
    b.compute(kernel, phase, mb, layer, flops / cp, nbytes / cp)
    for _ in range(cp - 1):
        i = b.collective(Collective.RING_EXCHANGE, exchange, CP_STREAM, "cp", phase, mb, layer,
                         blocking=False)
        b.compute(kernel, phase, mb, layer, flops / cp, nbytes / cp, extra=(i,))


def _layer_sequence(kernels: list[K.Kernel]) -> list[K.Kernel | bool]:
    """Forward order; a bool marks Megatron's f (True: before a block) or g (False):
    f before QKV and fc1, g after proj and fc2."""
    out: list[K.Kernel | bool] = []
    for kernel in kernels:
        if kernel.name in ("qkv", "fc1"):
            out.append(True)
        out.append(kernel)
        if kernel.name in ("proj", "fc2"):
            out.append(False)
    return out


def _layer_pass(b: _Stage, layer: int, mb: int, forward: bool, gather: int | None = None,
                mem_end: tuple = (), record: bool = False, recompute: bool = False) -> None:
    """One layer's forward (or backward) on one micro-batch."""
    ctx = b.ctx
    sh, phase = ctx.shard, Phase.FORWARD if forward else Phase.BACKWARD
    sequence = ctx.layer_sequence
    if not forward:
        sequence = sequence[::-1]
    comm_bytes = sh.tokens * ctx.model.hidden * sh.dtype_bytes
    extra = (gather,) if gather is not None else ()
    last = len(sequence) - 1
    for n, item in enumerate(sequence):
        if isinstance(item, bool):
            kind = _tp_comm(forward, item, sh.sequence_parallel)
            if sh.tp > 1 and kind is not None:
                b.collective(kind, comm_bytes, TP_STREAM, "tp", phase, mb, layer)
            continue
        if item.name == "attention":
            _attention(b, item, forward, phase, mb, layer)
            continue
        flops, nbytes = _kernel_cost(item, not forward, ctx.training)
        i = b.compute(item, phase, mb, layer, flops, nbytes, mem=mem_end if n == last else (),
                      extra=extra)
        extra = ()
        if record and item.params:
            b.grads.setdefault(layer, []).append((i, GRAD_BYTES * item.params))


def _layer_memory(ctx: _Context) -> tuple[float, float]:
    """(bytes kept between forward and backward, bytes while recomputing) per layer."""
    m, sh, t = ctx.model, ctx.shard, ctx.training
    stored_mode = t.recompute
    if stored_mode is Recompute.NONE and t.flash_attention:
        stored_mode = Recompute.SELECTIVE  # fused attention keeps no score matrix
    args = (ctx.training.seq_len // sh.cp, sh.micro_batch, m.hidden, m.heads, sh.tp,
            sh.sequence_parallel)
    kept = activation_bytes_per_layer(*args, recompute=stored_mode)
    if stored_mode is not Recompute.FULL:
        return kept, 0.0
    return kept, activation_bytes_per_layer(*args, recompute=Recompute.SELECTIVE) - kept


def _gather(b: _Stage, layer: int, phase: Phase, mb: int, after: int | None) -> int:
    """ZeRO-3/FSDP all-gather of one layer's parameters (non-blocking)."""
    full = PARAM_BYTES * b.ctx.layer_params
    grown = full * (1 - 1 / b.ctx.shards)
    group = "dp_shard" if _hybrid(b.ctx) else b.ctx.dp_group
    return b.collective(Collective.ALL_GATHER, full, DP_STREAM, group, phase, mb, layer,
                        deps=(after,) if after is not None else (), blocking=False,
                        mem=((grown, "gathered_parameters"),))


def _hybrid(ctx: _Context) -> bool:
    fsdp = ctx.parallel.fsdp
    return fsdp is not None and fsdp.sharding is Sharding.HYBRID_SHARD


def _chunk_layers(b: _Stage, layers: range, mb: int, forward: bool, record: bool) -> None:
    """A chunk's layers in forward (or backward) order, with ZeRO-3 gathers and memory."""
    ctx = b.ctx
    fsdp, zero3 = ctx.parallel.fsdp, ctx.parallel.zero_stage >= 3
    regather = forward or (fsdp.reshard_after_forward if fsdp else True)
    prefetch = fsdp.prefetch if fsdp else True
    kept, transient = _layer_memory(ctx)
    gathered = PARAM_BYTES * ctx.layer_params * (1 - 1 / ctx.shards) if zero3 else 0.0
    order = list(layers) if forward else list(layers)[::-1]
    pending = _gather(b, order[0], Phase.FORWARD if forward else Phase.BACKWARD, mb,
                      b.last_compute) if zero3 and regather and order else None
    for n, layer in enumerate(order):
        before = b.last_compute  # the kernel before this layer's pass starts
        free = ((-gathered, "gathered_parameters"),) if zero3 and (
            not forward or (fsdp is None or fsdp.reshard_after_forward)) else ()
        if forward:
            _layer_pass(b, layer, mb, True, pending, ((kept, "activations"),) + free)
        else:
            if ctx.training.recompute is Recompute.FULL:
                _layer_pass(b, layer, mb, True, pending, ((transient, "activations"),))
                pending = None
            _layer_pass(b, layer, mb, False, pending,
                        ((-kept - transient, "activations"),) + free, record)
            if zero3 and record:
                _reduce_layer(b, layer, mb)
        nxt = order[n + 1] if n + 1 < len(order) else None
        if zero3 and regather and nxt is not None:
            # Prefetch: the next layer's gather is issued as this layer's compute starts
            # (one layer ahead, as FSDP's forward/backward prefetch and its limit of
            # in-flight all-gathers do); without it, when this layer's compute ends.
            after = before if prefetch else b.last_compute
            pending = _gather(b, nxt, Phase.FORWARD if forward else Phase.BACKWARD, mb, after)
        else:
            pending = None


def _reduce_layer(b: _Stage, layer: int, mb: int) -> None:
    """ZeRO-3/FSDP: reduce-scatter a layer's gradients (and all-reduce the shard
    across replicas with hybrid sharding) after its last backward."""
    full = GRAD_BYTES * b.ctx.layer_params
    hybrid = _hybrid(b.ctx)
    i = b.collective(Collective.REDUCE_SCATTER, full, DP_STREAM,
                     "dp_shard" if hybrid else b.ctx.dp_group, Phase.BACKWARD, mb, layer,
                     deps=(b.last_compute,), blocking=False)
    b.reduces.append(i)
    if hybrid and b.ctx.parallel.dp // b.ctx.shards > 1:
        b.reduces.append(b.collective(Collective.ALL_REDUCE, full / b.ctx.shards, DP_STREAM,
                                      "dp_replicate", Phase.BACKWARD, mb, layer, deps=(i,),
                                      blocking=False))


def _embedding(b: _Stage, mb: int, forward: bool, record: bool) -> None:
    ctx = b.ctx
    sh, phase = ctx.shard, Phase.FORWARD if forward else Phase.BACKWARD
    kernel = K.embedding_kernels(ctx.model, sh, vocab=ctx.vocab)[0]
    nbytes = sh.tokens * ctx.model.hidden * sh.dtype_bytes
    kind = (Collective.REDUCE_SCATTER if sh.sequence_parallel else Collective.ALL_REDUCE) \
        if forward else (Collective.ALL_GATHER if sh.sequence_parallel else None)
    if not forward and sh.tp > 1 and kind is not None:
        b.collective(kind, nbytes, TP_STREAM, "tp", phase, mb, -1)
    flops, cost = _kernel_cost(kernel, not forward, ctx.training)
    i = b.compute(kernel, phase, mb, -1, flops, cost)
    if record:
        b.grads.setdefault(-1, []).append((i, GRAD_BYTES * kernel.params))
    if forward and sh.tp > 1:
        b.collective(kind, nbytes, TP_STREAM, "tp", phase, mb, -1)


def _head(b: _Stage, mb: int, forward: bool, record: bool) -> None:
    """Final norm, vocabulary-parallel logits and cross-entropy (with its small
    tensor-parallel all-reduces of per-token maxima and sums)."""
    ctx = b.ctx
    sh, m = ctx.shard, ctx.model
    phase, layer = Phase.FORWARD if forward else Phase.BACKWARD, m.layers
    owns = (not m.tied_embeddings) or ctx.parallel.pp > 1
    kernels = K.head_kernels(m, sh, vocab=ctx.vocab, owns_logits=owns)
    held = sh.tokens * (ctx.vocab // sh.tp) * (sh.dtype_bytes + 4)
    sequence = kernels if forward else kernels[::-1]
    for n, kernel in enumerate(sequence):
        if kernel.name == "logits" and sh.tp > 1 and sh.sequence_parallel:
            kind = Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER
            b.collective(kind, sh.tokens * m.hidden * sh.dtype_bytes, TP_STREAM, "tp", phase,
                         mb, layer)
        flops, nbytes = _kernel_cost(kernel, not forward, ctx.training)
        mem = ((held if forward else -held, "activations"),) if n == len(sequence) - 1 else ()
        i = b.compute(kernel, phase, mb, layer, flops, nbytes, mem=mem)
        if record and kernel.params:
            b.grads.setdefault(layer, []).append((i, GRAD_BYTES * kernel.params))
        if kernel.name == "loss" and forward and sh.tp > 1:
            b.collective(Collective.ALL_REDUCE, 3 * 4 * sh.tokens, TP_STREAM, "tp", phase, mb,
                         layer)


def _step(b: _Stage, step: Step) -> None:
    """One forward or backward of one micro-batch through one chunk of this stage."""
    ctx = b.ctx
    p = ctx.parallel.pp
    k = step.chunk * p + b.stage
    layers, mb = ctx.chunks[k], step.microbatch
    record = not step.forward and mb == ctx.micro_batches - 1
    if step.forward:
        if k > 0:
            b.p2p(OpKind.RECV, f"pp.f{k - 1}", Phase.FORWARD, mb, layers.start)
        else:
            _embedding(b, mb, True, False)
        _chunk_layers(b, layers, mb, True, False)
        if k == ctx.last_virtual:
            _head(b, mb, True, False)
        else:
            b.p2p(OpKind.SEND, f"pp.f{k}", Phase.FORWARD, mb, layers.stop - 1)
        return
    if k < ctx.last_virtual:
        b.p2p(OpKind.RECV, f"pp.b{k}", Phase.BACKWARD, mb, layers.stop - 1)
    else:
        _head(b, mb, False, record)
    _chunk_layers(b, layers, mb, False, record)
    if k == 0:
        _embedding(b, mb, False, record)
    else:
        b.p2p(OpKind.SEND, f"pp.b{k - 1}", Phase.BACKWARD, mb, layers.start)
    if record:
        b.last_backward[step.chunk] = b.last_compute
        _bucket_reduces(b, step.chunk)


def _bucket_reduces(b: _Stage, chunk: int) -> None:
    """ZeRO 0-2: bucketed all-reduce / reduce-scatter of a chunk's last gradients."""
    ctx = b.ctx
    grads = [g for layer in sorted(b.grads, reverse=True) for g in b.grads[layer]]
    b.grads = {}
    if ctx.parallel.zero_stage >= 3 or ctx.parallel.dp * ctx.shard.cp == 1:
        return
    grads.sort()
    kind = Collective.ALL_REDUCE if ctx.parallel.zero_stage == 0 else Collective.REDUCE_SCATTER
    for n, bucket in enumerate(make_buckets(grads, ctx.parallel.bucket_bytes)):
        ready = bucket.ready_after if ctx.parallel.overlap_grad_reduce else b.last_compute
        b.reduces.append(b.collective(kind, bucket.bytes, DP_STREAM, ctx.dp_group,
                                      Phase.BACKWARD, -1, -1, deps=(ready,), blocking=False,
                                      name=f"{kind.value}[{chunk}.{n}]"))


def _stage_params(ctx: _Context, stage: int) -> int:
    """Parameters one rank of ``stage`` holds (tensor-parallel shard)."""
    p = ctx.parallel.pp
    owned = [k for k in range(len(ctx.chunks)) if k % p == stage]
    total = sum(len(ctx.chunks[k]) for k in owned) * ctx.layer_params
    if 0 in owned:
        total += K.embedding_kernels(ctx.model, ctx.shard, vocab=ctx.vocab)[0].params
    if ctx.last_virtual in owned:
        owns = (not ctx.model.tied_embeddings) or p > 1
        total += sum(k.params for k in K.head_kernels(ctx.model, ctx.shard, vocab=ctx.vocab,
                                                       owns_logits=owns))
    return total


def _finish_stage(b: _Stage) -> None:
    """Tied-embedding sync, optimizer step and ZeRO 1/2 parameter all-gather."""
    ctx, p = b.ctx, b.ctx.parallel.pp
    if ctx.model.tied_embeddings and p > 1 and b.stage in (0, p - 1):
        size = GRAD_BYTES * ctx.vocab * ctx.model.hidden // ctx.shard.tp
        b.reduces.append(b.collective(Collective.ALL_REDUCE, size, PP_STREAM, "embd",
                                      Phase.BACKWARD, -1, -1, deps=(b.last_compute,),
                                      blocking=False, name="embedding_grads"))
    params = _stage_params(ctx, b.stage)
    zero = ctx.parallel.zero_stage
    optimizer = K.Kernel("optimizer", KernelClass.ELEMENTWISE, 0.0,
                         ADAM_BYTES_PER_PARAM * params / (ctx.shards if zero >= 1 else 1))
    b.ready = list(b.reduces)
    b.compute(optimizer, Phase.OPTIMIZER, -1, -1, 0.0, optimizer.bytes)
    if zero in (1, 2) and ctx.shards > 1:
        for n, size in enumerate(_split_bytes(PARAM_BYTES * params, ctx.parallel.bucket_bytes)):
            b.collective(Collective.ALL_GATHER, size, DP_STREAM, ctx.dp_group, Phase.OPTIMIZER,
                         -1, -1, deps=(b.last_compute,), blocking=False,
                         name=f"param_all_gather[{n}]")


def _split_bytes(total: float, bucket: float) -> list[float]:
    count = max(1, round(total / bucket))
    return [total / count] * count


def build_stage(ctx: _Context, stage: int) -> _Stage:
    b = _Stage(ctx, stage)
    p, v = ctx.parallel.pp, ctx.parallel.virtual_stages
    for step in steps_for(ctx.parallel.schedule, p, ctx.micro_batches, v, stage):
        _step(b, step)
    _finish_stage(b)
    return b


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Raise LayoutError naming the scenario keys of the first impossible setting."""
    tp, cp, pp, v = parallel.tp, parallel.cp, parallel.pp, parallel.virtual_stages
    for key, value in (("model.heads", model.heads), ("model.kv_heads", model.kv_heads),
                       ("model.ffn_hidden", model.ffn_hidden)):
        if value % tp:
            raise LayoutError(f"{key} ({value}) must be divisible by parallelism.tp ({tp})")
    per_rank = training.seq_len // cp
    if training.seq_len % cp or (parallel.sequence_parallel and per_rank % tp):
        raise LayoutError(f"training.seq_len ({training.seq_len}) must be divisible by "
                          f"parallelism.cp x tp with sequence parallelism ({cp * tp})"
                          if parallel.sequence_parallel else
                          f"training.seq_len ({training.seq_len}) must be divisible by "
                          f"parallelism.cp ({cp})")
    if parallel.stage_layers is not None:
        layers = parallel.stage_layers
        if len(layers) != pp or sum(layers) != model.layers or min(layers) < v:
            raise LayoutError(f"parallelism.stage_layers {list(layers)} must have pp ({pp}) "
                              f"entries of at least virtual_stages ({v}) layers summing to "
                              f"model.layers ({model.layers})")
    if v > 1 and pp < 2:
        raise LayoutError("parallelism.virtual_stages > 1 needs parallelism.pp >= 2")
    if cp > 1 and not training.flash_attention:
        raise LayoutError("parallelism.cp > 1 needs training.flash_attention: ring attention "
                          "runs fused attention chunk by chunk")
    steps_for(parallel.schedule, pp, parallel.micro_batches(training), v, 0)
    virtual_stage_layers(model.layers, pp, v, parallel.stage_layers)
    if parallel.fsdp and parallel.fsdp.sharding is Sharding.HYBRID_SHARD and \
            parallel.dp % _shard_size(parallel):
        raise LayoutError(f"fsdp hybrid_shard: parallelism.dp ({parallel.dp}) must be a "
                          f"multiple of the shard group ({_shard_size(parallel)} ranks per "
                          "server)")


def _shard_size(parallel: ParallelSpec) -> int:
    fsdp = parallel.fsdp
    if fsdp and fsdp.sharding is Sharding.HYBRID_SHARD:
        return max(1, min(parallel.dp, parallel.ranks_per_node // (parallel.tp * parallel.cp)))
    return parallel.dp * parallel.cp


def _groups(ctx: _Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    groups = {"tp": layout.groups("tp"), "cp": layout.groups("cp"),
              "dp": layout.groups(("cp", "dp"))}
    pipelines = layout.groups("pp")
    p = ctx.parallel.pp
    for k in range(ctx.last_virtual):
        a, b = k % p, (k + 1) % p
        groups[f"pp.f{k}"] = tuple((g[a], g[b]) for g in pipelines)
        groups[f"pp.b{k}"] = tuple((g[b], g[a]) for g in pipelines)
    if p > 1:
        groups["embd"] = tuple((g[0], g[-1]) for g in pipelines)
    if _hybrid(ctx):
        size = ctx.shards
        groups["dp_shard"] = tuple(g[i:i + size] for g in groups["dp"]
                                   for i in range(0, len(g), size))
        groups["dp_replicate"] = tuple(g[i::size] for g in groups["dp"] for i in range(size))
    return groups


def build_program(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> Program:
    """One iteration of ``model`` trained as ``training`` says, split as ``parallel`` says."""
    check(model, training, parallel)
    vocab = padded_vocab(model.vocab, parallel.tp)
    shard = K.Shard(training.micro_batch, training.seq_len, training.dtype_bytes, parallel.tp,
                    parallel.cp, parallel.sequence_parallel, training.flash_attention)
    ctx = _Context(model, training, parallel, shard, vocab,
                   virtual_stage_layers(model.layers, parallel.pp, parallel.virtual_stages,
                                        parallel.stage_layers),
                   parallel.micro_batches(training), "dp", _shard_size(parallel))
    layout = Layout({"tp": parallel.tp, "cp": parallel.cp, "dp": parallel.dp,
                     "pp": parallel.pp}, parse_order(parallel.order))
    stages = [build_stage(ctx, s) for s in range(parallel.pp)]
    stage_ops = [tuple(b.ops) for b in stages]
    zero = parallel.zero_stage
    communicators = sum(1 for size in (parallel.tp, parallel.cp, parallel.dp * parallel.cp,
                                        parallel.pp) if size > 1)
    memory = [{**model_state_bytes(_stage_params(ctx, s), zero, ctx.shards),
               "communication_buffers": communication_buffer_bytes(communicators)}
              for s in range(parallel.pp)]
    stage_of = [layout.coords(r)["pp"] for r in range(layout.world)]
    return Program(
        ops=tuple(stage_ops[s] for s in stage_of),
        groups=_groups(ctx, layout),
        static_memory=tuple(memory[s] for s in stage_of),
        model_flops=K.model_flops(model, training.global_batch, training.seq_len),
        tokens=training.global_batch * training.seq_len,
        stage=tuple(stage_of),
        notes={"micro_batches": ctx.micro_batches,
               "parameters": K.parameter_count(model, training.seq_len),
               "buckets": sum(1 for op in stage_ops[0] if op.name.startswith(
                   ("all_reduce[", "reduce_scatter["))),
               "hardware_flops": _hardware_flops(ctx)},
    )


def _hardware_flops(ctx: _Context) -> float:
    """FLOPs the GPUs execute in one iteration, recompute included, whole job."""
    b = ctx.training.global_batch
    flops = K.model_flops(ctx.model, b, ctx.training.seq_len)
    if ctx.training.recompute is Recompute.FULL:
        layers = K.layer_kernels(ctx.model, ctx.training.micro_batch, ctx.training.seq_len)
        per_mb = sum(k.flops for k in layers) * ctx.model.layers
        flops += per_mb * b / ctx.training.micro_batch
    return flops
