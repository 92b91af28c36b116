"""CUDA graph scopes as Megatron-Core captures them: which kernels of a pipeline
step are replayed from a graph (no per-kernel launch) and which stay eager.

``training.cuda_graph_scope`` takes the values of Megatron-LM's
``--cuda-graph-scope`` (``megatron/training/arguments.py``; renamed
``--cuda-graph-modules`` in 2026, the same values, ``CudaGraphModule`` in
``megatron/core/transformer/transformer_config.py``):

- ``full`` (the default, an empty list in Megatron): every transformer layer
  whole, one graph per layer (``_layer_is_graphable`` in
  ``megatron/core/transformer/cuda_graphs.py``: no modules listed, every layer
  graphed); what ``training.cuda_graphs: true`` alone means.
- ``attn``: ``TransformerLayer._forward_attention``: the input norm, QKV,
  core attention, the projection and its residual add.
- ``mlp``: ``_forward_mlp`` of a dense layer (pre-MLP norm to residual add).
- ``moe``: ``_forward_mlp`` of a MoE layer whole: only with drop-and-pad MoE
  (a capacity factor); a dropless layer's token counts vary per batch.
- ``moe_router``: ``_forward_mlp`` up to ``MoELayer.router()``: the pre-MLP norm,
  the shared experts, the router and its top-k and auxiliary loss.
- ``moe_preprocess`` (with ``moe_router``): ``MoELayer.preprocess()``, the
  dispatcher's preprocessing and permutation before the token exchange.
- ``full_iteration`` (alone): the whole forward and backward of every micro-batch
  as one graph (``cuda_graph_impl: full_iteration``), the optimizer eager.

The rules Megatron-Core enforces (``TransformerConfig.__post_init__``) refuse
the rest: ``moe`` with ``moe_router``, ``moe_preprocess`` without
``moe_router``, MoE scopes in a dense model, ``mlp`` where every layer is MoE,
``moe`` in a dropless model, full recompute with per-layer graphs, CPU
offloading with per-layer graphs. A dropless MoE layer cannot be captured
whole, so ``full`` with routed experts is refused too (the dispatcher's
host synchronisation cannot sit in a graph, ``compute.host``).

Which block a kernel belongs to is read from a layer's kernels in order, so
new kernels fall in place: a layer's forward up to its first residual add
(``residual1``) is the attention block, the rest its MLP block; in a MoE layer
the MLP block's kernels before the permutation (``permute``) and the routed
experts are the router's, those from the permutation to the experts the
preprocessing's, the rest (experts, unpermutation, residual) the experts'.
A backward runs its layer's kernels in reverse. Kernels outside transformer
layers (embedding, head, loss) are captured by ``full_iteration`` only.
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.fields import fail, says
from simulator.base.ir import ROUTED_EXPERT, Op, Phase

FULL, ITERATION = "full", "full_iteration"
SCOPES = (FULL, "attn", "mlp", "moe", "moe_router", "moe_preprocess", ITERATION)
ATTN, MLP, ROUTER, PREPROCESS, EXPERTS, OUTSIDE = ("attn", "mlp", "moe_router",
                                                  "moe_preprocess", "moe", "outside")
SPLIT = "residual1"  # the attention block's last kernel (its residual add)
PERMUTE = "permute"  # the MoE dispatcher's first kernel after the router's
CAPTURES = {FULL: {ATTN, MLP, ROUTER, PREPROCESS, EXPERTS}, "attn": {ATTN}, "mlp": {MLP},
            "moe": {ROUTER, PREPROCESS, EXPERTS}, "moe_router": {ROUTER},
            "moe_preprocess": {PREPROCESS},
            ITERATION: {ATTN, MLP, ROUTER, PREPROCESS, EXPERTS, OUTSIDE}}


def scope_list(path: str, value: object) -> tuple[str, ...]:
    """``training.cuda_graph_scope``: one of ``SCOPES`` or a list of them (each once)."""
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items:
        raise fail(path, value, f"must be one of {', '.join(SCOPES)} or a list of them")
    for n, item in enumerate(items):
        if item not in SCOPES:
            raise fail(f"{path}[{n}]" if isinstance(value, list) else path, item,
                       f"is not a scope Megatron-Core captures; allowed: {', '.join(SCOPES)}")
    if len(set(items)) < len(items):
        raise fail(path, value, "names a scope twice")
    return tuple(items)


says(scope_list, f"one of {', '.join(SCOPES)}, or a list of them (each once)")


def captured(scope: Sequence[str]) -> frozenset[str]:
    """The blocks (``ATTN`` ... ``OUTSIDE``) that ``scope`` replays from graphs."""
    return frozenset().union(*(CAPTURES[s] for s in scope or (FULL,)))


def refusal(scope: Sequence[str], moe: bool, dense_layers: bool, dropless: bool,
            full_recompute: bool, offload: bool) -> str | None:
    """Why Megatron-Core refuses ``scope`` for this model and training, or None."""
    scope = tuple(scope) or (FULL,)
    per_layer = ITERATION not in scope
    rules = [
        (ITERATION in scope and len(scope) > 1, "full_iteration must be alone"),
        ({"moe", "moe_router"} <= set(scope), "must not hold both moe and moe_router"),
        ("moe_preprocess" in scope and "moe_router" not in scope,
         "moe_preprocess needs moe_router"),
        (not moe and bool({"moe", "moe_router", "moe_preprocess"} & set(scope)),
         "names a MoE scope, but the model has no routed experts"),
        (moe and not dense_layers and "mlp" in scope,
         "names mlp, but every layer of the model is a MoE layer"),
        (moe and dropless and ("moe" in scope or FULL in scope or ITERATION in scope),
         "captures whole MoE layers, which needs drop-and-pad MoE (model.capacity_factor); "
         "a dropless layer's dispatcher synchronises with the host: capture "
         "[attn, moe_router, moe_preprocess] instead"),
        (per_layer and full_recompute,
         "is per layer, and full recompute needs full_iteration"),
        (per_layer and offload,
         "is per layer, and CPU offloading (activation_offload_layers) needs full_iteration"),
    ]
    return next((why for bad, why in rules if bad), None)


def blocks(ops: Sequence[Op], compute: Sequence[int]) -> list[str]:
    """The block of each kernel ``compute`` (indices into ``ops``, in order):
    runs of one layer and phase are labelled as the module docstring says."""
    out = [OUTSIDE] * len(compute)
    start = 0
    for n in range(1, len(compute) + 1):
        if n < len(compute) and _run_key(ops[compute[n]]) == _run_key(ops[compute[start]]):
            continue
        run = [ops[i] for i in compute[start:n]]
        backward = run[0].phase is Phase.BACKWARD
        labels = _layer_blocks(run[::-1] if backward else run)
        out[start:n] = labels[::-1] if backward else labels
        start = n
    return out


def _run_key(op: Op) -> tuple:
    return op.layer, op.phase


def _layer_blocks(run: Sequence[Op]) -> list[str]:
    """Blocks of one layer's kernels in forward order (``OUTSIDE`` if it is not a
    transformer layer: no ``residual1``)."""
    names = [op.name for op in run]
    if SPLIT not in names:
        return [OUTSIDE] * len(run)
    split = names.index(SPLIT) + 1
    tail = names[split:]
    if not any(name.startswith(ROUTED_EXPERT) for name in tail):
        return [ATTN] * split + [MLP] * len(tail)
    experts = next(k for k, name in enumerate(tail) if name.startswith(ROUTED_EXPERT))
    permute = next((k for k, name in enumerate(tail[:experts]) if name.startswith(PERMUTE)),
                   experts)
    return ([ATTN] * split + [ROUTER] * permute + [PREPROCESS] * (experts - permute)
            + [EXPERTS] * (len(tail) - experts))


def describe(scope: Sequence[str]) -> str:
    """The scope for the summary's line."""
    scope = tuple(scope) or (FULL,)
    if scope == (ITERATION,):
        return "the whole forward-backward (full_iteration)"
    if scope == (FULL,):
        return "every layer whole (full)"
    return "per layer: " + ", ".join(scope)
