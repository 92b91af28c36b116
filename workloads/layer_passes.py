"""A layer's pass and a chunk's layers: the kernels of one layer's forward or
backward with the tensor-, context- and expert-parallel communication its plan
holds (``pass_plan``, worked out once per program), and a pipeline chunk's
layers in order with ZeRO-3/FSDP's gathers, frees and reduce-scatters around
them (``chunk_layers``; DeepSpeed ZeRO-3's per-tensor gathers:
``chunk_layers_per_tensor``) and each layer's activation memory.
"""

from __future__ import annotations

from dataclasses import replace
from functools import lru_cache

from simulator.base.ir import GEMMS, TP_STREAM, Collective, Phase
from workloads import kernels as K
from workloads import offload
from workloads.dualpipe import halves
from workloads.memory import Recompute
from workloads.stage import Stage, kernel_cost
from workloads.stage_memory import layer_memory, memory_by_kind
from workloads.strategies import context, expert, sharded, tensor
from workloads.training import TrainingSpec


def pass_plan(sequence: list, shard: K.Shard, training: TrainingSpec,
              forward: bool, overlap: bool = False, delay_wgrad: bool = False
              ) -> tuple[tuple, ...]:
    """One layer pass's items in order, worked out once per program (a large run
    has hundreds of thousands of passes): ``("tp", collective or None)`` for
    Megatron's f/g, ``("attention", kernel)``, ``("kernel", kernel, flops, bytes)``
    (``"expert"`` for a routed expert's, scaled by its layer's load), ``("ep",
    step)`` for a MoE layer's token exchanges; with ``overlap``
    (``tp_comm_overlap``) an all-gather and the GEMM after it, or a GEMM and the
    reduce-scatter after it, become one ``("overlapped", collective, flops, bytes,
    collective)`` (``tensor.overlapped``); with ``delay_wgrad``
    (``parallelism.delay_wgrad_compute``) a backward's routed-expert GEMMs are
    split into their input gradients, where they were, and their weight
    gradients, after the layer's dispatch (``delayed_wgrad``)."""
    plan = []
    for item in sequence if forward else sequence[::-1]:
        if isinstance(item, str):  # a MoE layer's token all-to-all (``expert.sequence``)
            plan.append(("ep", item))
        elif isinstance(item, bool):
            kind = tensor.block_comm(forward, item, shard.sequence_parallel)
            plan.append(("tp", kind if shard.tp > 1 else None))
        elif item.name == "attention":
            plan.append(("attention", item))
        else:
            plan.append(("expert" if K.is_expert(item) else "kernel", item,
                         *kernel_cost(item, not forward, training)))
    if delay_wgrad and not forward:
        plan = delayed_wgrad(plan)
    return tuple(tensor.merge_overlaps(plan)) if overlap and shard.tp > 1 else tuple(plan)


def delayed_wgrad(plan: list) -> list:
    """Megatron-Core's ``--delay-wgrad-compute`` in a MoE layer's backward plan:
    each routed-expert GEMM's backward (2x its forward FLOPs) becomes its input
    gradient (half, no weights), where it was, and its weight gradient (the other
    half, the weights' gradients), moved after the layer's dispatch backward, so
    that all-to-all starts once the input gradients are there and the weight
    gradients run beside it (under the combined 1F1B schedule: under the other
    micro-batch's combine)."""
    out, held = [], []
    for item in plan:
        if item[0] == "expert" and item[1].cls in GEMMS and item[1].params:
            dgrad, wgrad = halves(item)
            out.append(dgrad)
            held.append(wgrad)
            continue
        out.append(item)
        if item[0] == "ep" and item[1] == expert.DISPATCH and held:
            out += held
            held = []
    return out + held


def layer_pass(b: Stage, layer: int, mb: int, forward: bool, gather: tuple[int, ...] = (),
                mem_end: tuple = (), record: bool = False, fetch=None,
                only: tuple[int, ...] | None = None, plan: tuple | None = None,
                bucket: int | None = None) -> None:
    """One layer's forward (or backward) on one micro-batch, its first kernel
    after the ZeRO-3 ``gather``; ``fetch(layer, key)`` (DeepSpeed ZeRO-3's
    ``sharded.TensorFetcher.wait``) gives the all-gathers a kernel waits for, keyed
    by its plan position (``-1 - n`` in a backward); ``only``: the plan positions
    to run (a selective recompute's modules, ``Context.recomputed``); ``plan``: the
    items to run instead of the layer's pass plan (a zero-bubble split's:
    ``dualpipe.split_weights``); ``bucket``: the ``Stage.grads`` key of its recorded
    gradients (default ``layer``; an MTP depth's: the head's, ``mtp.depths``)."""
    ctx = b.ctx
    phase = Phase.FORWARD if forward else Phase.BACKWARD
    plan = ctx.pass_plan(layer, forward) if plan is None else plan
    comm_bytes, gathered = ctx.tp_bytes[forward]
    if gather and sharded.copy_out(b, layer, phase, mb, gather):
        gather = ()  # FSDP2's copy-out waited for it; the kernels wait for the copy
    extra = gather
    last = len(plan) - 1 if only is None else only[-1]
    for n, item in enumerate(plan):
        if only is not None and n not in only:
            continue
        what = item[0]
        if what == "tp":
            if item[1] is not None:
                b.collective(item[1], gathered if item[1] is Collective.ALL_GATHER
                             else comm_bytes, TP_STREAM, "tp", phase, mb, layer)
            continue
        if what == "attention":
            context.attention(b, item[1], forward, phase, mb, layer)
            continue
        if what == "ep":  # (DeepEP's two hops at once: both after the same ops)
            after = b.after_compute()
            for stream, group, kind, nbytes, name in expert.counts(ctx, item[1], forward):
                after = (*after, b.collective(kind, nbytes, stream, group, phase, mb, layer,
                                              deps=after, name=name))
            for stream, group, kind, nbytes, name in expert.hops(
                    ctx, item[1], forward, ctx.routing.exchange[layer][mb]):
                b.collective(kind, nbytes, stream, group, phase, mb, layer, deps=after,
                             name=name)
            continue
        kernel = item[1]
        if what == "expert":  # at the most loaded EP rank's pace
            scale = ctx.routing.scale[layer][mb]
            if ctx.routing.spread is not None and kernel.shape and len(kernel.shape) > 3:
                kernel = drawn_rows(kernel, ctx.routing.spread[layer][mb])
            item = (what, kernel, item[2] * scale, item[3] * scale)
        if fetch is not None:
            extra = fetch(layer, n if forward else -1 - n) or extra
        mem = mem_end if n == last else ()
        if what == "overlapped":
            i = tensor.overlapped(b, item, gathered if item[4] is Collective.ALL_GATHER
                                  else comm_bytes, phase, mb, layer, extra, mem)
        else:
            i = b.compute(kernel, phase, mb, layer, item[2], item[3], mem=mem, extra=extra)
        extra = ()
        if record and kernel.params:
            grads = b.expert_grads if what == "expert" else b.grads
            grads.setdefault(layer if bucket is None else bucket, []).append(
                (i, ctx.plan.reduce_bytes * kernel.params))


def chunk_layers_per_tensor(b: Stage, layers: range, mb: int, forward: bool,
                             record: bool, fetcher: sharded.TensorFetcher) -> None:
    """DeepSpeed ZeRO-3: a chunk's layers with one all-gather per module parameter
    not in memory, issued and released by the parameter coordinator
    (``sharded.Coordinator``); a full recompute's forward gathers what its
    backward then uses."""
    ctx = b.ctx
    kept, transient = layer_memory(ctx)
    full = ctx.training.recompute is Recompute.FULL
    for layer in (list(layers) if forward else list(layers)[::-1]):
        free = fetcher.release(layer)
        if forward:
            layer_pass(b, layer, mb, True, (), ((kept, "activations"),) + free,
                        fetch=fetcher.wait)
            continue
        if full or ctx.recomputed[layer]:
            layer_pass(b, layer, mb, True, (), ((transient, "activations"),),
                        fetch=fetcher.wait, only=None if full else ctx.recomputed[layer])
        layer_pass(b, layer, mb, False, (), ((-kept - transient, "activations"),) + free,
                    record, fetch=fetcher.wait)


def chunk_layers(b: Stage, layers: range, mb: int, forward: bool, record: bool,
                  then: tuple[int, int] | None = None,
                  fetcher: sharded.TensorFetcher | None = None,
                  held: list | None = None) -> int | None:
    """A chunk's layers in forward (or backward) order, with ZeRO-3 gathers and memory.
    ``then`` (unit id, parameters): the ZeRO-3 unit used after the last layer (the
    head forward, the embedding backward), prefetched as the next layer would be;
    returns its gather. ``fetcher``: DeepSpeed ZeRO-3's, for this pass. ``held``: a
    backward under the zero-bubble split (``dualpipe.split_weights``), which appends each
    layer's (layer, weight-gradient items) to it."""
    ctx = b.ctx
    if fetcher is not None:
        chunk_layers_per_tensor(b, layers, mb, forward, record, fetcher)
        return None
    fsdp, zero3 = ctx.parallel.fsdp, ctx.parallel.zero_stage >= 3
    regather = zero3 and sharded.gathers(ctx, forward, mb)
    frees = zero3 and sharded.frees(ctx, forward, record)
    prefetch = fsdp.prefetch if fsdp else True
    early = forward or fsdp is None or fsdp.backward_prefetch == "pre"
    memory = memory_by_kind(ctx)
    full = ctx.training.recompute is Recompute.FULL
    order = list(layers) if forward else list(layers)[::-1]
    phase = Phase.FORWARD if forward else Phase.BACKWARD
    pending = _gather_next(b, order[0], phase, mb, None) if regather and order else None
    reloads: dict[int, int] = {}  # offloaded layer -> its copy back (``offload.copy_in``)
    for n, layer in enumerate(order):
        kept, transient = memory[ctx.model.is_moe_layer(layer)]
        free = sharded.freed_layer(ctx, layer) if frees else ()
        nxt = order[n + 1] if n + 1 < len(order) else (then[0] if then else None)
        unit = then[1] if then and n + 1 == len(order) else None
        ahead = zero3 and (regather or unit is not None) and nxt is not None
        # Prefetch: the next layer's gather is issued as this layer's compute starts,
        # ahead of this layer's reduce-scatter (one layer ahead, as FSDP's forward
        # prefetch and its BACKWARD_PRE backward prefetch do); with BACKWARD_POST or
        # without prefetch, when this layer's compute ends, still ahead of the
        # reduce-scatter (FSDP runs them on two streams).
        upcoming = _gather_next(b, nxt, phase, mb, unit) if (
            ahead and prefetch and early) else None
        if forward:
            if pending is None and layer in b.param_ready:  # overlap_param_gather
                pending = (b.param_ready.pop(layer),)
            layer_pass(b, layer, mb, True, pending or (), ((kept, "activations"),) + free)
            if layer in b.offloaded:
                offload.copy_out(b, layer, mb, kept)
        else:
            back = reloads.pop(layer, None)
            if back is None and layer in b.offloaded:  # (no layer before it to hide it)
                back = offload.copy_in(b, layer, mb, kept)
            if nxt is not None and nxt in b.offloaded and n + 1 < len(order):
                reloads[nxt] = offload.copy_in(b, nxt, mb, memory[
                    ctx.model.is_moe_layer(nxt)][0])  # one layer ahead
            waits = (*(pending or ()), *(() if back is None else (back,)))
            if full or ctx.recomputed[layer]:  # the whole forward again, or the modules'
                layer_pass(b, layer, mb, True, waits, ((transient, "activations"),),
                           only=None if full else ctx.recomputed[layer])
                pending, waits = None, ()
            plan = None
            if held is not None:
                plan, weights = ctx.split_plans[layer]
                held.append((layer, weights))
            layer_pass(b, layer, mb, False, waits,
                        ((-kept - transient, "activations"),) + free, record, plan=plan)
        if ahead and upcoming is None:
            upcoming = _gather_next(b, nxt, phase, mb, unit)
        if zero3 and record and not forward:
            sharded.reduce_layer(b, layer, mb)
        pending = upcoming
    return pending


def _gather_next(b: Stage, nxt: int, phase: Phase, mb: int, unit: int | None):
    """The ZeRO-3 gathers of layer ``nxt`` (a tuple), or of the unit of ``unit``
    parameters used after a chunk's last layer (its one gather)."""
    if unit is not None:
        return sharded.gather(b, nxt, phase, mb, b.last_compute, unit)
    return sharded.gather_layer(b, nxt, phase, mb, b.last_compute)


@lru_cache(maxsize=4096)
def drawn_rows(kernel: K.Kernel, factors: tuple[float, ...]) -> K.Kernel:
    """An expert grouped GEMM ``kernel`` with each local expert's rows as the
    routing draw gave the most loaded rank (``Routing.spread``; cached: a pass
    of each layer and micro-batch asks again)."""
    routed, n, k, *rows = kernel.shape
    counts = K.expert_rows(routed, len(rows), factors)
    return replace(kernel, shape=(sum(counts), n, k, *counts))
