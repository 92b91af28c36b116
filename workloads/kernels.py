"""Kernels of a transformer, with FLOPs, HBM bytes and the parameters they own.

Forward FLOPs count multiply-adds as 2 FLOPs and only matrix products, the
convention of Narayanan et al. (SC21, Appendix) and Korthikanti et al. (2022).
For one GPT layer with b*s = T tokens this gives 24*T*h^2 + 4*T*s*h, and with
the logits 2*T*h*V, so one iteration (forward + 2x backward) costs

    72 * B * s * L * h^2 * (1 + s/(6h) + V/(12*h*L))

which ``tests/test_flops.py`` checks against the kernel list.

Backward kernels execute twice the forward FLOPs (input and weight gradients);
fused (flash) attention's backward executes 2.5x, as it recomputes the scores.
Element-wise kernels (norms, activations, residual adds, softmax/loss) are
timed by bytes moved and contribute no model FLOPs.

``Shard``, ``Kernel`` and the shared constructors are ``workloads.kernel_types``'s,
the attention block's kernels ``workloads.attention_kernels``'s (both
re-exported here).
"""

from __future__ import annotations

from dataclasses import replace

from simulator.base.ir import ATTENTIONS, ROUTED_EXPERT, KernelClass
from workloads import elementwise_kernels as E
from workloads.attention_kernels import (  # noqa: F401 (re-exported)
    ATTENTION_BACKWARD_FACTOR,
    CAUSAL,
    attention_kernels,
    mla_kernels,
)
from workloads.kernel_types import (  # noqa: F401 (re-exported)
    Kernel,
    Shard,
    accumulating,
    elementwise,
    gemm,
    linear,
    low_precision,
    quantize_kernel,
)
from workloads.models import ModelSpec
from workloads.precision import FP32_BYTES


def layer_kernels(model: ModelSpec, micro_batch: int | Shard, seq: int = 0,
                  dtype_bytes: int = 2, *, layer: int | None = None, ep: int = 1,
                  window: int | None = None, etp: int = 1) -> list[Kernel]:
    """Forward kernels of one transformer layer on one rank, in execution order;
    a MoE layer of ``model`` (``layer`` given) has its experts split over ``ep``
    ranks (``moe_kernels``).

    Call with a ``Shard``, or with (micro_batch, seq, dtype_bytes) for one GPU.
    """
    sh = micro_batch if isinstance(micro_batch, Shard) else Shard(micro_batch, seq, dtype_bytes)
    if model.is_moe_layer(layer):
        dense = layer_kernels(model, sh, window=_window(model, layer))
        mlp = next(n for n, k in enumerate(dense) if k.name == "ln2") + 1
        return dense[:mlp] + moe_kernels(model, sh, ep, etp) + dense[-1:]
    return _dense_layer(model, sh, _window(model, layer) if window is None else window)


def _window(model: ModelSpec, layer: int | None) -> int | None:
    """The keys a query of ``layer`` sees (None: the whole sequence)."""
    return model.sliding_window if model.is_sliding_layer(layer) else None


def _dense_layer(model: ModelSpec, sh: Shard, window: int | None) -> list[Kernel]:
    """A dense layer's kernels; ``window``: sliding-window attention's keys. The
    norms, rotary embedding (standard attention without learned positions),
    bias-dropout-adds and activation at their kernels' bytes
    (``workloads.elementwise_kernels``)."""
    t, h, f, e, tp = sh.tokens, model.hidden, model.ffn_hidden, sh.dtype_bytes, sh.tp
    qkv_out = (model.heads + 2 * model.kv_heads) * model.head_dim
    up = 2 * f if model.mlp.gated else f
    rows = t / sh.norm_split
    qkv = mla_kernels(model, sh) if model.mla else linear(
        "qkv", t, qkv_out // tp, h, sh, model.bias, norm_fed=True) + _rope(model, sh)
    return [
        E.norm("ln1", rows, h, e, model.bias),
        *qkv,
        *attention_kernels(model, sh, window),
        *linear("proj", t, h, model.attention_width // tp, sh, model.bias),
        E.bias_dropout_add("residual1", rows * h, h, e, model.bias, sh.dropout),
        E.norm("ln2", rows, h, e, model.bias),
        *linear("fc1", t, up // tp, h, sh, model.bias, norm_fed=True),
        E.activation("act", t, f / tp, e, model.mlp.gated, model.bias),
        *linear("fc2", t, h, f // tp, sh, model.bias),
        E.bias_dropout_add("residual2", rows * h, h, e, model.bias, sh.dropout),
    ]


def _rope(model: ModelSpec, sh: Shard) -> list[Kernel]:
    """Rotary embedding of this rank's queries and keys, where the model has no
    learned position table."""
    if model.learned_positions:
        return []
    d = model.head_dim
    return [E.rope("rope", sh, model.heads // sh.tp * d, max(model.kv_heads // sh.tp, 1) * d, d)]


def moe_kernels(model: ModelSpec, sh: Shard, ep: int = 1, etp: int = 1) -> list[Kernel]:
    """A MoE layer's MLP block on one rank (Megatron-Core's MoE layer with the
    all-to-all dispatcher; Fedus et al. 2022, Jiang et al. 2024): the shared
    experts (a dense MLP as wide as they are together, tensor-parallel like
    the dense one), then the router GEMM over the experts and its top-k, the
    permutation of each token's k copies by expert, the local experts' grouped
    GEMMs, and the un-permutation that weights and sums the copies. The rank
    routes its own tokens (sequence-parallel: 1/tp of them); with every expert
    equally loaded its ``experts / ep`` local experts receive as many token
    copies as it sends, ``tokens * top_k``. A grouped GEMM's shape lists every
    local expert's rows (``experts_gemm``). The all-to-alls around the experts are the
    program's (``strategies.expert``). With expert tensor parallelism ``etp`` each
    rank holds 1/etp of every local expert's width and runs the token copies of
    its etp group (gathered): etp x the copies on 1/etp of the width."""
    h, e, k = model.hidden, sh.dtype_bytes, model.top_k
    f = model.expert_ffn // etp
    up = 2 * f if model.mlp.gated else f
    local = model.experts // ep
    n = sh.tokens // sh.norm_split  # tokens this rank routes
    own = n * k  # copies of its own tokens (permuted, sent, received back)
    routed = own * etp  # copies its experts' slices process
    out: list[Kernel] = []
    if model.shared_experts:
        fs = model.shared_experts * model.expert_ffn  # tensor-parallel, not expert-
        ups = 2 * fs if model.mlp.gated else fs
        t, tp = sh.tokens, sh.tp
        out += [*linear("shared_fc1", t, ups // tp, h, sh, model.bias, norm_fed=True),
                elementwise("shared_act", t * ups / tp, t * fs / tp, e),
                *linear("shared_fc2", t, h, fs // tp, sh, model.bias)]
    out += [
        *router_kernels(model, n, e),
        elementwise("permute", n * h, own * h, e),
        *experts_gemm("experts_fc1", routed, up, h, local, sh),
        elementwise("experts_act", routed * up, routed * f, e),
        *experts_gemm("experts_fc2", routed, h, f, local, sh),
        elementwise("unpermute", own * h + own, n * h, e),
    ]
    return out


def router_kernels(model: ModelSpec, n: int, e: int) -> list[Kernel]:
    """The router over ``n`` tokens (Megatron-Core's TopKRouter): the gating GEMM,
    its score function (softmax or sigmoid, in FP32) over the E logits, the
    top-k selection (values and indices of k experts), and the load-balancing
    loss over the probabilities where the recipe computes it (Fedus et al. 2022:
    each expert's mean probability and token share), each a memory-bound kernel
    with the bytes it moves."""
    scores, own = n * model.experts, n * model.top_k
    out = [gemm("router", n, model.experts, model.hidden, e, bias=False),
           Kernel(f"router_{model.router}", KernelClass.ELEMENTWISE, 0.0,
                  e * scores + FP32_BYTES * scores),
           Kernel("topk", KernelClass.ELEMENTWISE, 0.0, FP32_BYTES * scores + 2 * e * own)]
    if model.router_aux_loss:
        out.append(Kernel("router_aux_loss", KernelClass.ELEMENTWISE, 0.0,
                          FP32_BYTES * (scores + own + 2 * model.experts)))
    return out


def experts_gemm(name: str, routed: int, n: int, k: int, local: int,
                 sh: Shard) -> list[Kernel]:
    """The local experts' grouped GEMM over ``routed`` token copies, output width
    ``n`` and input ``k``: all their FLOPs, each expert's weight read once, and the
    shape (routed, n, k, rows of each of the ``local`` experts), which the compute
    model tiles expert by expert (``compute.gemm``; the routing draw's counts
    replace the even split per pass); under low precision at
    the format's peak after its cast."""
    params = local * k * n
    kernel = Kernel(name, KernelClass.GEMM, 2.0 * routed * n * k,
                    sh.dtype_bytes * (routed * k + params + routed * n),
                    (routed, n, k, *expert_rows(routed, local)), params)
    return [kernel] if sh.lowp is None else low_precision(kernel, routed, params, sh.lowp)


def expert_rows(routed: int, local: int, factors=None) -> tuple[int, ...]:
    """Token copies of each of ``local`` experts: ``routed`` split evenly, or each
    expert's even share times its ``factors`` entry (a routing draw's, rounded).

    >>> expert_rows(10, 4)
    (3, 3, 2, 2)
    >>> expert_rows(8, 2, (1.5, 0.25))
    (6, 1)
    """
    if factors is not None:
        return tuple(int(round(routed / local * f)) for f in factors)
    q, r = divmod(routed, local)
    return (q + 1,) * r + (q,) * (local - r)


def is_expert(kernel: Kernel) -> bool:
    """A routed expert's kernel (``moe_kernels``): run at the busiest EP rank's load,
    its weights reduced over the expert-data-parallel group."""
    return kernel.name.startswith(ROUTED_EXPERT)


def embedding_kernels(model: ModelSpec, micro_batch: int | Shard, seq: int = 0,
                      dtype_bytes: int = 2, vocab: int | None = None) -> list[Kernel]:
    """Token (and learned position) embedding lookup; owns the embedding tables.

    With tensor parallelism each rank looks up its vocabulary shard and the
    partial results are summed (an all-reduce, or reduce-scatter with sequence
    parallelism, added by the program builder).
    """
    sh = micro_batch if isinstance(micro_batch, Shard) else Shard(micro_batch, seq, dtype_bytes)
    t, h = sh.tokens, model.hidden
    v = vocab or model.vocab
    params = v * h // sh.tp + (sh.seq * h if model.learned_positions else 0)
    return [elementwise("embedding", 2 * t * h, t * h, sh.dtype_bytes, params)]


def head_kernels(model: ModelSpec, micro_batch: int | Shard, seq: int = 0,
                 dtype_bytes: int = 2, vocab: int | None = None,
                 owns_logits: bool | None = None) -> list[Kernel]:
    """Final norm, logits projection (vocabulary-parallel) and cross-entropy.

    ``owns_logits``: whether the logits weight is counted here (untied, or tied
    with the embedding on another pipeline stage, which keeps its own copy).
    """
    sh = micro_batch if isinstance(micro_batch, Shard) else Shard(micro_batch, seq, dtype_bytes)
    t, h = sh.tokens, model.hidden
    v = (vocab or model.vocab) // sh.tp
    logits = accumulating(gemm("logits", t, v, h, sh.dtype_bytes, bias=False), sh)
    owns = (not model.tied_embeddings) if owns_logits is None else owns_logits
    if not owns:
        logits = replace(logits, params=0)  # (its gradient still accumulated: the tied weight's)
    return [E.norm("final_ln", t / sh.norm_split, h, sh.dtype_bytes, model.bias), logits,
            E.loss(t * v, sh.fused_loss)]


def mtp_kernels(model: ModelSpec, micro_batch: int | Shard, seq: int = 0,
                dtype_bytes: int = 2) -> list[Kernel]:
    """One multi-token-prediction depth's own kernels (DeepSeek-AI 2024, DeepSeek-V3
    Sec. 2.2; Megatron-Core's MultiTokenPredictionLayer): the RMSNorms of the
    hidden state and of the next token's embedding, and the projection of the
    two concatenated (2h -> h, whole on every tensor-parallel rank). Its
    transformer layer is one of the last layer's kind and its output head the
    main one's weight with its own final norm (``mtp_block``)."""
    sh = micro_batch if isinstance(micro_batch, Shard) else Shard(micro_batch, seq, dtype_bytes)
    t, h = sh.tokens, model.hidden
    norm = 2 * t * h / sh.norm_split
    return [elementwise("mtp_norm", norm, norm, sh.dtype_bytes, 2 * h),
            *linear("mtp_proj", t, h, 2 * h, sh, False, norm_fed=True)]


def mtp_block(model: ModelSpec, micro_batch: int | Shard, seq: int = 0,
              dtype_bytes: int = 2, vocab: int | None = None) -> list[Kernel]:
    """Every kernel of one multi-token-prediction depth: its own, a layer of the
    last layer's kind, the head (its logits weight the main head's)."""
    sh = micro_batch if isinstance(micro_batch, Shard) else Shard(micro_batch, seq, dtype_bytes)
    return (mtp_kernels(model, sh) + layer_kernels(model, sh, layer=model.layers - 1)
            + head_kernels(model, sh, vocab=vocab, owns_logits=False))


def all_layer_kernels(model: ModelSpec, batch: int, seq: int) -> list[Kernel]:
    """Every layer's kernels on one GPU (each kind of layer built once)."""
    kinds = {model.layer_kind(layer): layer_kernels(model, batch, seq, 2, layer=layer)
             for layer in range(model.layers)}
    return [k for layer in range(model.layers) for k in kinds[model.layer_kind(layer)]]


def parameter_count(model: ModelSpec, seq: int) -> int:
    """Trainable parameters, from the kernels that own them (every expert)."""
    kernels = (embedding_kernels(model, 1, seq, 2) + head_kernels(model, 1, seq, 2)
               + all_layer_kernels(model, 1, seq) + mtp_block(model, 1, seq) * model.mtp_layers)
    return sum(k.params for k in kernels)


def model_flops(model: ModelSpec, batch: int, seq: int, kept: float = 1.0) -> float:
    """Model FLOPs of one iteration on ``batch`` sequences: 3x the forward matmuls
    (a MoE layer's: each token's ``top_k`` experts, its shared ones and the router);
    ``kept``: the share of routed copies the experts keep (below 1 when
    ``capacity_factor`` drops some: a dropped copy is no work done).

    Attention counts the full s^2 score matrix (4 b s^2 h per layer, Narayanan
    et al.'s convention), while causal kernels compute about half of it (the
    compute model times that half, ``compute.attention.visible``): where
    attention dominates, at contexts of millions of tokens, MFU counted this
    way approaches or passes 100 % though the GPUs do half the attention work."""
    kernels = all_layer_kernels(model, batch, seq) + head_kernels(model, batch, seq, 2) \
        + mtp_block(model, batch, seq) * model.mtp_layers
    return 3.0 * sum(k.flops * (kept if is_expert(k) else 1.0) for k in kernels)


def megatron_hardware_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Narayanan et al. (SC21) Eq. 3: FLOPs per iteration counted with the extra
    forward pass of full activation recomputation, 96 B s l h^2 (1 + s/6h + V/16lh);
    the paper's TFLOP/s figures count this way."""
    b, s, layers, h, v = batch, seq, model.layers, model.hidden, model.vocab
    return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * h * layers))


def megatron_model_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Closed form of Narayanan et al. (SC21) without recompute, for GPT shapes."""
    b, s, layers, h, v = batch, seq, model.layers, model.hidden, model.vocab
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers))


def backward_flops(kernel: Kernel) -> float:
    """FLOPs the backward of ``kernel`` executes."""
    if kernel.cls in ATTENTIONS:
        return ATTENTION_BACKWARD_FACTOR * kernel.flops
    return 2.0 * kernel.flops
