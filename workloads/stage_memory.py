"""What one rank of a pipeline stage holds in memory: its parameters (dense and
its experts'), its model states by ZeRO stage and NCCL buffers (``static_memory``),
and the activations one layer keeps for its backward (``layer_memory``:
Korthikanti et al. 2022, a MoE layer's MLP block its own, ``moe_mlp_bytes``).
"""

from __future__ import annotations

from simulator.base.ir import KernelClass
from workloads import kernels as K
from workloads import offload
from workloads.memory import (
    PARAM_BYTES,
    Recompute,
    activation_bytes_per_layer,
    communication_buffer_bytes,
    model_state_bytes,
)
from workloads.stage import Context
from workloads.strategies import expert


def layer_memory(ctx: Context, layer: int | None = None) -> tuple[float, float]:
    """(bytes kept between forward and backward, bytes while recomputing) of a
    layer (a MoE layer's MLP block its own: ``moe_mlp_bytes``)."""
    m, sh, t = ctx.model, ctx.shard, ctx.training
    stored_mode = t.recompute
    if stored_mode is Recompute.SELECTIVE and "core_attn" not in t.modules:
        stored_mode = Recompute.NONE  # the scores stay (other modules: ``freed``)
    if stored_mode is Recompute.NONE and t.flash_attention:
        stored_mode = Recompute.SELECTIVE  # fused attention keeps no score matrix
    mlp = moe_mlp_bytes(ctx) if m.is_moe_layer(layer) else None
    args = (ctx.training.seq_len // sh.cp, sh.micro_batch, m.hidden, m.heads, sh.tp,
            sh.sequence_parallel)
    saved = linear_input_bytes(sh)
    attention = mla_bytes(ctx) if m.mla else None
    kept = activation_bytes_per_layer(*args, recompute=stored_mode, mlp_bytes=mlp,
                                      linear_input_bytes=saved, attention_bytes=attention)
    if stored_mode is not Recompute.FULL:
        again = freed(ctx, mlp) if t.rerun else 0.0
        return kept - again, again
    return kept, activation_bytes_per_layer(*args, recompute=Recompute.SELECTIVE,
                                            mlp_bytes=mlp, linear_input_bytes=saved,
                                            attention_bytes=attention) - kept


def mla_bytes(ctx: Context) -> float:
    """Bytes multi-head latent attention keeps for its backward on one rank, in
    place of Korthikanti et al.'s 11 s b h (``workloads.kernels.mla_kernels``):
    the down-projections' input (whole: duplicated linears), the query and
    key-value latents before and after their norms (the rotary key with them),
    each head's query, key and value (the fused attention's inputs), the output
    projection's input and the dropout mask; linear inputs at ``linear_input_bytes``."""
    m, sh = ctx.model, ctx.shard
    t, e, q = ctx.training.seq_len // sh.cp * sh.micro_batch, sh.dtype_bytes, \
        linear_input_bytes(sh)
    latents = (e + q) * (m.q_lora_rank or 0) + e * (m.kv_lora_rank + m.qk_rope_head_dim) \
        + q * m.kv_lora_rank
    heads = (e * _mla_qkv(m) + q * m.attention_width) / sh.tp
    return t * (q * m.hidden + latents + heads + m.hidden / sh.norm_split)


def _mla_qkv(m) -> int:
    """Elements per token of MLA's up-projected queries, keys and values."""
    return m.heads * (2 * m.head_dim + m.v_head_dim)


def freed(ctx: Context, mlp: float | None) -> float:
    """Bytes of a layer's saved activations that its recomputed modules
    (``training.modules``, ``workloads.recompute``) do not keep, in Korthikanti
    et al.'s terms (per s b h: the norms' outputs 2 + 2, the MLP's activation
    input 8 and output 8 and dropout mask 1) or a MoE block's own
    (``moe_mlp_bytes``; ``mlp``: it, None for a dense layer). They exist again
    while the layer's backward runs."""
    m, sh, modules = ctx.model, ctx.shard, ctx.training.modules
    sbh = ctx.training.seq_len // sh.cp * sh.micro_batch * m.hidden
    q = linear_input_bytes(sh)
    split = sh.tp if sh.sequence_parallel else 1
    out = 0.0
    if "mla_up_proj" in modules and m.mla:  # the heads' queries, keys and values
        out += ctx.training.seq_len // sh.cp * sh.micro_batch * sh.dtype_bytes \
            * _mla_qkv(m) / sh.tp
    if "layernorm" in modules:  # the QKV input, and a dense MLP's fc1 input
        out += sbh * q * (1 if mlp is not None else 2) / split
    if mlp is None:
        if "mlp" in modules:
            out += sbh * (8.0 + 4.0 * q) / sh.tp + sbh / split
        return out
    if "moe" in modules:
        return out + mlp
    if "moe_act" in modules:  # the second grouped GEMM's input, as moe_mlp_bytes counts it
        out += sh.tokens // sh.norm_split * m.top_k * q * m.expert_ffn
    if "shared_experts" in modules and m.shared_experts:
        fs = m.shared_experts * m.expert_ffn
        ups = 2 * fs if m.mlp.gated else fs
        out += sh.tokens * (sh.dtype_bytes * ups + q * fs) / sh.tp
    return out


def linear_input_bytes(sh: K.Shard) -> float:
    """Bytes of a saved linear-layer input element: the activations' precision, or
    under low precision the quantized copy the weight gradient reads (Transformer
    Engine saves it, one orientation, in place of the BF16 input)."""
    return sh.dtype_bytes if sh.lowp is None else sh.lowp.recipe.quantized_bytes


def memory_by_kind(ctx: Context) -> dict[bool, tuple[float, float]]:
    """``layer_memory`` of a dense layer (False) and, in a model with experts, of a
    MoE layer (True)."""
    out = {False: layer_memory(ctx)}
    if ctx.model.experts:
        out[True] = layer_memory(ctx, ctx.model.first_moe_layer)
    return out


def moe_mlp_bytes(ctx: Context) -> float:
    """Bytes a MoE layer's MLP block keeps for its backward on one rank, in place of
    Korthikanti et al.'s 19 s b h / t of a dense MLP: each routed token copy's
    expert input, first GEMM's output and activation output (2 bytes an
    element, as the dense MLP's 2h + 2(4h) + 2(4h) + h per token, its dropout
    mask aside), the router's fp32 probabilities, and the shared experts' MLP."""
    m, sh, etp = ctx.model, ctx.shard, ctx.parallel.etp
    f = m.expert_ffn
    up = 2 * f if m.mlp.gated else f
    routed = sh.tokens // sh.norm_split * m.top_k
    e, q = sh.dtype_bytes, linear_input_bytes(sh)  # the GEMMs' inputs at q bytes
    # with expert tensor parallelism: the gathered inputs of etp ranks, 1/etp of the widths
    out = routed * (q * etp * m.hidden + e * up + q * f) + 4.0 * sh.tokens \
        // sh.norm_split * m.experts
    if m.shared_experts:
        fs = m.shared_experts * f
        ups = 2 * fs if m.mlp.gated else fs
        out += sh.tokens * (q * m.hidden / sh.norm_split + (e * ups + q * fs) / sh.tp)
    return out


def stage_params(ctx: Context, stage: int) -> int:
    """Parameters one rank of ``stage`` holds (tensor-parallel shard; its local
    experts included)."""
    return sum(stage_param_split(ctx, stage))


def stage_param_split(ctx: Context, stage: int) -> tuple[int, int]:
    """(dense, expert) parameters one rank of ``stage`` holds."""
    owned = [k for k in range(len(ctx.chunks)) if ctx.owner(k) == stage]
    split = [ctx.params_of(layer) for k in owned for layer in ctx.chunks[k]]
    total, experts = sum(d for d, _ in split), sum(e for _, e in split)
    for k in owned:
        dense, expert_params = _ends_params(ctx, k)
        total, experts = total + dense, experts + expert_params
    return total, experts


def _ends_params(ctx: Context, k: int) -> tuple[int, int]:
    """(dense, expert) parameters virtual stage ``k`` holds besides its layers: the
    embedding where it begins a pipeline, the head (and the MTP modules) where it
    ends one."""
    total, experts = 0, 0
    if ctx.starts(k):
        total += K.embedding_kernels(ctx.model, ctx.shard, vocab=ctx.vocab)[0].params
    if ctx.ends(k):
        head = K.head_kernels(ctx.model, ctx.shard, vocab=ctx.vocab,
                              owns_logits=ctx.owns_logits)
        total += sum(kernel.params for kernel in head)
        if ctx.model.mtp_layers:  # its own kernels, its layer, its final norm
            dense, expert_params = ctx.params_of(ctx.model.layers - 1)
            own = sum(k.params for k in K.mtp_kernels(ctx.model, ctx.shard)) + ctx.model.hidden
            total += ctx.model.mtp_layers * (own + dense)
            experts += ctx.model.mtp_layers * expert_params
    return total, experts


def static_memory(ctx: Context, stage: int) -> dict[str, float]:
    """Bytes a rank of ``stage`` holds all iteration: model states and NCCL's buffers."""
    parallel = ctx.parallel
    edp = expert.expert_data_parallel(parallel)
    sizes = (parallel.tp, parallel.cp, parallel.dp * parallel.cp, parallel.pp) + (
        (parallel.ep, edp, parallel.etp) if ctx.model.experts else ())
    communicators = sum(1 for size in sizes if size > 1)
    dense, experts = stage_param_split(ctx, stage)
    states = model_state_bytes(dense, parallel.zero_stage, ctx.shards, ctx.plan.reduce_bytes)
    if experts:  # the distributed optimizer shards expert states over their replicas
        for key, value in model_state_bytes(experts, parallel.zero_stage, edp,
                                            ctx.plan.reduce_bytes).items():
            states[key] += value
    if parallel.fsdp is not None and parallel.fsdp.no_sync:  # accumulated unsharded
        states["gradients"] = ctx.plan.reduce_bytes * (dense + experts)
    states.update(lowp_weight_bytes(ctx, stage, states))
    states = offload.host_states(states, ctx.training, ctx.plan.reduce_bytes)
    return {**states, "communication_buffers": communication_buffer_bytes(communicators)}


def lowp_weight_bytes(ctx: Context, stage: int, states: dict[str, float]) -> dict[str, float]:
    """Under low precision, the cached quantized copies of the stage's linear
    weights (``lowp_weights``: one per orientation the GEMMs read; under
    ZeRO-3/FSDP only the gathered share) and, with ``fp8_param_gather``, the
    parameters those weights no longer hold in BF16 (the FP8 copy is the
    parameter, one of the orientations)."""
    lowp = ctx.shard.lowp
    if lowp is None:
        return {}
    params = stage_lowp(ctx, stage)[0]
    share = 1.0 / ctx.shards if ctx.parallel.zero_stage >= 3 else 1.0
    copies = lowp.weight_bytes(params) * share
    out = {"lowp_weights": copies}
    if ctx.training.fp8_param_gather:  # the row-wise copy is the parameter
        held = params * lowp.recipe.quantized_bytes * share
        out["lowp_weights"] = copies - held
        out["parameters"] = states["parameters"] - (PARAM_BYTES * params * share - held)
    return out


def stage_lowp(ctx: Context, stage: int) -> tuple[int, int]:
    """(weights, GEMMs) of the low-precision GEMMs one rank of ``stage`` holds."""
    per_kind, params, gemms = {}, 0, 0
    for k in [k for k in range(len(ctx.chunks)) if ctx.owner(k) == stage]:
        for layer in ctx.chunks[k]:
            kind = ctx.model.is_moe_layer(layer)
            if kind not in per_kind:
                lowp = [x for x in K.layer_kernels(ctx.model, ctx.shard, layer=layer,
                                                   ep=ctx.parallel.ep, etp=ctx.parallel.etp)
                        if x.cls is KernelClass.LOWP_GEMM]
                per_kind[kind] = (sum(x.params for x in lowp), len(lowp))
            params, gemms = params + per_kind[kind][0], gemms + per_kind[kind][1]
    return params, gemms
