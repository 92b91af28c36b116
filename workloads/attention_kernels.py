"""The attention block's own kernels: the attention core (fused, or unfused as
Megatron-LM 2021 ran it) and multi-head latent attention's projections.

Fused (flash) attention's backward executes ``ATTENTION_BACKWARD_FACTOR`` x
its forward FLOPs, as it recomputes the scores (Dao 2023, FlashAttention-2).
"""

from __future__ import annotations

from simulator.base.ir import KernelClass
from workloads import elementwise_kernels as E
from workloads.kernel_types import Kernel, Shard, elementwise, linear
from workloads.models import ModelSpec

ATTENTION_BACKWARD_FACTOR = 2.5  # FlashAttention-2 backward recomputes QK^T
CAUSAL = 1  # decoder attention: each query sees the keys before it (attention shapes)


def mla_kernels(model: ModelSpec, sh: Shard) -> list[Kernel]:
    """Multi-head latent attention's projections (DeepSeek-AI 2024, DeepSeek-V2
    Sec. 2.1; Megatron-Core's MLASelfAttention): the queries through a latent
    of ``q_lora_rank`` (down-projection, RMSNorm, up-projection to every head's
    no-position and rotary parts), the keys and values through one of
    ``kv_lora_rank`` plus a rotary key shared by the heads (down-projection,
    RMSNorm of the latent, up-projection to each head's key and value), then
    rotary embedding of the queries' and keys' rotary parts (its backward
    moving the forward's bytes, as TE's fused RoPE; the latents' RMSNorms at
    TE's norm bytes, ``elementwise_kernels.norm``). The
    down-projections are whole on every tensor-parallel rank (Megatron's
    duplicated linears, on the gathered sequence), the up-projections split by
    heads."""
    t, h, e, tp = sh.tokens, model.hidden, sh.dtype_bytes, sh.tp
    heads, qk, rope = model.heads // tp, model.head_dim, model.qk_rope_head_dim
    kv, q = model.kv_lora_rank, model.q_lora_rank
    if q is None:
        queries = linear("q_proj", t, heads * qk, h, sh, False, norm_fed=True)
    else:
        queries = [*linear("q_down", t, q, h, sh, False, norm_fed=True),
                   E.norm("q_norm", t, q, e, False),
                   *linear("q_up", t, heads * qk, q, sh, False, norm_fed=True)]
    return [*queries,
            *linear("kv_down", t, kv + rope, h, sh, False, norm_fed=True),
            E.norm("kv_norm", t, kv, e, False),
            *linear("kv_up", t, heads * (model.qk_nope_head_dim + model.v_head_dim), kv, sh,
                    False, norm_fed=True),
            elementwise("mla_rope", t * rope * (heads + 1), t * rope * (heads + 1), e,
                        backward_bytes=2 * e * t * rope * (heads + 1))]  # (as ``E.rope``)


def attention_kernels(model: ModelSpec, sh: Shard, window: int | None = None
                      ) -> list[Kernel]:
    """The attention core: one fused kernel (FlashAttention, cuDNN), shaped
    (micro-batch x local heads, queries, keys, head size, causal) for the
    compute model's tables (``compute.attention``), or, unfused as in
    Megatron-LM 2021, a batched QK^T GEMM, a softmax (with dropout) over the
    s x s scores, and a batched GEMM with V, one GEMM per (sequence, head)
    (a grouped shape: ``experts_gemm``). Both count 4 b s^2 h FLOPs (h: the
    heads' width; their mean where queries and values differ in width, as
    MLA's), causal masking or not; a sliding window of w keys (fused only)
    4 b s min(s, w) h."""
    t, e, tp = sh.tokens, sh.dtype_bytes, sh.tp
    h = (model.heads * model.head_dim + model.attention_width) / 2
    kv = model.kv_width
    keys = sh.seq if window is None else min(sh.seq, window)
    flops = 4.0 * t * keys * h / tp
    heads, d = model.heads // tp, model.head_dim
    batch = sh.micro_batch * heads  # one GEMM per (sequence, head)
    queries = t // sh.micro_batch
    if sh.flash:
        nbytes = e * (t * 2 * h + sh.micro_batch * sh.seq * kv) / tp
        cls = KernelClass.LOWP_ATTENTION if sh.fp8_attention else KernelClass.ATTENTION
        return [Kernel("attention", cls, flops, nbytes, (batch, queries, keys, d, CAUSAL))]
    scores = batch * queries * sh.seq
    each = (queries,) * batch
    dv, qk_share = model.value_dim, model.head_dim / (model.head_dim + model.value_dim)
    qk = Kernel("attn_scores", KernelClass.GEMM, flops * qk_share,
                e * batch * (queries * d + sh.seq * d + queries * sh.seq),
                (batch * queries, sh.seq, d, *each))
    softmax = elementwise("softmax", scores, 2 * scores, e)  # scores in; probs and mask out
    av = Kernel("attn_values", KernelClass.GEMM, flops * (1 - qk_share),
                e * batch * (queries * sh.seq + sh.seq * dv + queries * dv),
                (batch * queries, dv, sh.seq, *each))
    return [qk, softmax, av]
