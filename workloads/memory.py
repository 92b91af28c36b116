"""Memory accounting formulas.

Model states for mixed-precision Adam (Rajbhandari et al., ZeRO, SC20):
2 bytes/param of half-precision weights, 2 of gradients and 12 of optimizer
states (fp32 master weights, momentum, variance): 16 bytes/param in all. With
data-parallel degree d, ZeRO stage 1 shards the optimizer states (4 + 12/d),
stage 2 also the gradients (2 + 14/d), stage 3 also the parameters (16/d).
PyTorch FSDP's full_shard is stage 3, shard_grad_op stage 2, and hybrid_shard
stage 3 within the shard group.

Activations per transformer layer (Korthikanti et al., "Reducing Activation
Recomputation in Large Transformer Models", 2022, Sec. 4), in bytes, for
sequence s, micro-batch b, hidden h, heads a and tensor parallel degree t:

    none:                 s*b*h*(34 + 5*a*s/h)
    TP:                   s*b*h*(10 + 24/t + 5*a*s/(h*t))
    TP + SP:              s*b*h*(34 + 5*a*s/h) / t
    selective (TP + SP):  34*s*b*h / t           (attention scores recomputed)
    full:                 2*s*b*h                (only the layer input is kept)

Fused (flash) attention never stores the scores, so it needs the selective
figure without any recompute; the 5as/h term is the stored score matrix.
"""

from __future__ import annotations

from enum import Enum

PARAM_BYTES = 2
GRAD_BYTES = 2
OPTIMIZER_BYTES = 12


class Recompute(Enum):
    NONE = "none"
    SELECTIVE = "selective"
    FULL = "full"


# a selective recompute's modules (Megatron-Core's names; workloads.recompute)
RECOMPUTE_MODULES = ("core_attn", "layernorm", "mlp", "moe", "moe_act", "shared_experts",
                     "mla_up_proj")


def model_state_bytes(params: float, zero: int = 0, shards: int = 1,
                      grad_bytes: int = GRAD_BYTES) -> dict[str, float]:
    """Bytes of parameters, gradients and optimizer states one rank holds;
    ``grad_bytes`` is 4 where gradients are accumulated in fp32 (Megatron's
    ``main_grad`` with bf16: 6 + 12/d bytes per parameter with the distributed
    optimizer, Megatron-Core's distributed-optimizer documentation).

    >>> model_state_bytes(1e9, zero=2, shards=4)
    {'parameters': 2000000000.0, 'gradients': 500000000.0, 'optimizer_states': 3000000000.0}
    """
    d = max(1, shards)
    return {
        "parameters": PARAM_BYTES * params / (d if zero >= 3 else 1),
        "gradients": grad_bytes * params / (d if zero >= 2 else 1),
        "optimizer_states": OPTIMIZER_BYTES * params / (d if zero >= 1 else 1),
    }


MLP_PER_SBH = 19.0  # of the 34: the dense MLP block's share (Korthikanti et al., Sec. 4.1)


LINEAR_INPUTS_UNSPLIT = 4.0  # of the 34: the QKV and fc1 inputs (2 + 2), where TP
LINEAR_INPUTS_SPLIT = 10.0  # alone does not split them; the proj and fc2 inputs (2 + 8)


def activation_bytes_per_layer(seq: int, micro_batch: int, hidden: int, heads: int,
                               tp: int = 1, sequence_parallel: bool = False,
                               recompute: Recompute = Recompute.NONE,
                               mlp_bytes: float | None = None,
                               linear_input_bytes: float = 2.0,
                               attention_bytes: float | None = None) -> float:
    """Activation bytes one layer keeps for its backward (Korthikanti et al. 2022);
    ``mlp_bytes`` replaces the dense MLP block's share (a MoE layer's own),
    ``attention_bytes`` the attention block's (11 s b h: QKV input 2, Q and K 4,
    V 2, projection input 2, dropout mask 1; MLA's own);
    ``linear_input_bytes``: bytes of a saved linear-layer input element (below 2
    under low precision, which saves the quantized copy its weight gradient reads)."""
    sbh = seq * micro_batch * hidden
    if recompute is Recompute.FULL:
        return 2.0 * sbh
    scores = 0.0 if recompute is Recompute.SELECTIVE else 5.0 * heads * seq / (hidden * tp)
    linear = 34.0 / tp if sequence_parallel else 10.0 + 24.0 / tp
    unsplit = LINEAR_INPUTS_UNSPLIT / (tp if sequence_parallel else 1)
    if mlp_bytes is None:
        saved = (1.0 - linear_input_bytes / 2.0) * (unsplit + LINEAR_INPUTS_SPLIT / tp)
        out = sbh * (linear + scores - saved)
    else:  # the MLP's inputs are in mlp_bytes: the attention block's (QKV, proj) only
        saved = (1.0 - linear_input_bytes / 2.0) * (unsplit / 2.0 + 2.0 / tp)
        out = sbh * (linear - MLP_PER_SBH / tp + scores - saved) + mlp_bytes
    if attention_bytes is None:
        return out
    split = tp if sequence_parallel else 1  # the attention block's terms above, scores too
    block = 8.0 / tp + 3.0 / split + scores - (1.0 - linear_input_bytes / 2.0) * (
        2.0 / split + 2.0 / tp)
    return out - sbh * block + attention_bytes


def head_activation_bytes(seq: int, micro_batch: int, vocab: int, dtype_bytes: int) -> float:
    """Logits kept for the backward: half precision plus the fp32 copy of the loss."""
    return seq * micro_batch * vocab * (dtype_bytes + 4)


NCCL_BUFFER_BYTES = 4 * 2**20  # NCCL_BUFFSIZE default, per channel and peer connection
NCCL_CHANNELS = 8


def communication_buffer_bytes(communicators: int, channels: int = NCCL_CHANNELS) -> float:
    """NCCL's staging buffers: each communicator a rank belongs to connects to a
    previous and a next peer on every channel, with NCCL_BUFFSIZE (4 MiB) each.
    An estimate (NCCL sizes them per protocol and transport).

    >>> communication_buffer_bytes(2) / 2**20
    128.0
    """
    return communicators * channels * 2 * NCCL_BUFFER_BYTES
