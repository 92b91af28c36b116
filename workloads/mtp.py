"""Multi-token prediction on the last pipeline stage (DeepSeek-AI 2024,
DeepSeek-V3 Sec. 2.2; Megatron-Core's MultiTokenPredictionBlock).

Each of ``model.mtp_layers`` depths takes the main model's last hidden state
and the next token's embedding, normalises both, projects their concatenation
back to the hidden size (``kernels.mtp_kernels``), runs one transformer layer
of the last layer's kind (with its tensor- and expert-parallel communication:
``layer_passes.layer_pass``) and the output head with the main head's weight
and its own final norm, then its own loss. Its forward follows the main
head's; its backward precedes it. What it keeps for its backward: the
layer's activations (``stage_memory.layer_memory``) and its logits, as the
main head's. Left out: the copy of the embedding the last stage holds for it
(Megatron's embedding group shares it with the first stage) and, under full
recompute, the layer's forward again.
"""

from __future__ import annotations

from simulator.base.ir import Phase
from workloads import kernels as K
from workloads.layer_passes import layer_pass
from workloads.stage import Stage, kernel_cost
from workloads.stage_memory import memory_by_kind


def depths(b: Stage, mb: int, forward: bool, record: bool) -> None:
    """Every depth's forward (after the main head's) or backward (before it) of
    micro-batch ``mb``; ``record``: its gradients are reduced after this backward."""
    ctx = b.ctx
    m, sh = ctx.model, ctx.shard
    if not m.mtp_layers:
        return
    last = m.layers - 1
    kept = memory_by_kind(ctx)[m.is_moe_layer(last)][0]
    held = sh.tokens * (ctx.vocab // sh.tp) * (sh.dtype_bytes + 4)
    own = K.mtp_kernels(m, sh)
    head = K.head_kernels(m, sh, vocab=ctx.vocab, owns_logits=False)
    for _ in range(m.mtp_layers):
        if forward:
            _kernels(b, own, mb, True, record, ())
            layer_pass(b, last, mb, True, mem_end=((kept, "activations"),))
            _kernels(b, head, mb, True, record, ((held, "activations"),))
        else:
            _kernels(b, head[::-1], mb, False, record, ((-held, "activations"),))
            layer_pass(b, last, mb, False, mem_end=((-kept, "activations"),), record=record,
                       bucket=m.layers)  # (its module sits after the head: the head's bucket)
            _kernels(b, own[::-1], mb, False, record, ())


def _kernels(b: Stage, kernels: list, mb: int, forward: bool, record: bool,
             mem_end: tuple) -> None:
    """``kernels`` in order, ``mem_end`` on the last; gradients to the head's bucket."""
    ctx = b.ctx
    phase, layer = Phase.FORWARD if forward else Phase.BACKWARD, ctx.model.layers
    for n, kernel in enumerate(kernels):
        flops, nbytes = kernel_cost(kernel, not forward, ctx.training)
        i = b.compute(kernel, phase, mb, layer, flops, nbytes,
                      mem=mem_end if n == len(kernels) - 1 else ())
        if record and kernel.params and not forward:
            b.grads.setdefault(layer, []).append((i, ctx.plan.reduce_bytes * kernel.params))
