"""A layer's memory-bound kernels at the bytes the framework's own kernels move,
forward and backward: norms, rotary embedding, bias-dropout-add with the
residual's gradient, the MLP's activation, the vocabulary-parallel loss.

Each is timed by the roofline's memory term (``compute.model``: bytes /
(HBM x memory efficiency) + the launch overhead), so at small hidden sizes,
where GEMMs shrink as h^2 and these as h, they take a growing share of a step.
``e``: the activations' element bytes (BF16: 2); ``n``: elements of one
rank's tensor. Sources, per kernel:

- Norms: Transformer Engine's LayerNorm and RMSNorm kernels
  (``transformer_engine/common/normalization``; ``layer_norm/ln_fwd_*`` and
  ``ln_bwd_semi_cuda_kernel.cu``), as Megatron-Core's TE spec runs them
  inside ``LayerNormLinear``. Forward reads x and gamma (and beta), writes y
  and the FP32 1/rms (and mean) of each row. Backward reads dy, x, gamma and
  the saved statistics, writes dx, and each CTA writes an FP32 partial dgamma
  (and dbeta) row, ``ctas_per_col = multiprocessorCount x ctas_per_sm`` of
  them, which a finalize kernel reads back and reduces into dgamma.
- Rotary embedding: TE's fused RoPE (``fused_rope.cu``, ``FusedRoPEFunc``),
  Megatron-Core's default (``--no-rope-fusion`` turns it off): one call each on
  q and k, reading the tensor and the FP32 frequencies [s, d], writing the
  rotated tensor; the backward rotates dy back with the same bytes.
- Bias-dropout-add: Megatron-Core ``fusions/fused_bias_dropout.py``
  (``_bias_dropout_add_func`` under ``jit_fuser``): out = residual +
  dropout(x + bias). Forward reads x, the residual (and the bias), writes out
  and, where ``hidden_dropout`` > 0, the 1-byte mask (PyTorch's fused
  dropout saves a bool mask; with p = 0 ``F.dropout`` returns its input, no
  kernel). Backward: the residual's gradient is dout itself, but the layer's
  input feeds both the residual and the norm, so autograd adds the two
  gradients (an add: two reads, one write); dropout's backward reads dout and
  the mask and writes dx; a bias's gradient is dx summed over the tokens
  (autograd's ``sum_to``: one read).
- Activations: Megatron-Core ``fusions/fused_bias_swiglu.py`` (SwiGLU: forward
  reads [t, 2f], writes [t, f]; ``swiglu_back`` reads dy [t, f] and the input
  [t, 2f], writes its gradient [t, 2f]) and ``fused_bias_gelu.py`` (forward
  reads [t, f] and the bias, writes [t, f]; ``bias_gelu_back`` reads dy and
  the input, writes dx, and the bias's gradient sums dx: one more read).
  Megatron-LM fuses both by default (``--no-bias-swiglu-fusion``,
  ``--no-bias-gelu-fusion``); GeGLU moves SwiGLU's bytes.
- Loss: Megatron-Core's vocabulary-parallel cross entropy
  (``tensor_parallel/cross_entropy.py``, N = tokens x vocab / tp logits).
  Unfused: the BF16 logits cast to FP32 (2N read, 4N written), their max
  (4N), the in-place subtraction of it (8N), exp in place (8N), its sum (4N),
  the in-place division into the softmax (8N): 38N forward; backward the
  in-place multiply by the loss gradient (8N) and the cast back to BF16
  (autograd of ``.float()``: 6N), 14N. Fused (``fusions/fused_cross_entropy.py``,
  ``cross_entropy_loss_fusion``, on in NeMo's and Megatron-Bridge's
  ``GPTConfig``): cast and max in one kernel (6N), subtraction, exp and sum in
  one (8N), the division (8N): 22N; backward one kernel, multiply and cast
  (6N). The per-token maxima, target logits and sums are all-reduced over tp
  (``loss_all_reduces``: three calls, or two fused; the program issues them).
"""

from __future__ import annotations

from simulator.base.ir import KernelClass
from workloads.kernel_types import Kernel, Shard
from workloads.precision import FP32_BYTES

# TE's norm backward: one FP32 partial dgamma row per CTA, ctas_per_col =
# multiprocessorCount x ctas_per_sm (ln_bwd_semi_cuda_kernel.cu, launch_tuned_):
# 132, an H100 SXM's SMs at one CTA each, stands for every GPU (108 to 148 SMs:
# the partials are ~2 % of a norm backward's bytes at 8k tokens of 4096).
NORM_PARTIALS = 132
MEMORY = KernelClass.ELEMENTWISE  # timed by its bytes
# the kernels this module makes (the run's compute_model line names those a program has)
OVERHEADS = ("ln1", "ln2", "final_ln", "q_norm", "kv_norm", "rope", "residual1", "residual2",
             "act", "loss")
MASK_BYTES = 1  # PyTorch's fused dropout keeps a bool mask (one byte an element)
UNFUSED_LOSS_FORWARD, UNFUSED_LOSS_BACKWARD = 38, 14  # bytes per logit (cross_entropy.py)
FUSED_LOSS_FORWARD, FUSED_LOSS_BACKWARD = 22, 6  # bytes per logit (fused_cross_entropy.py)


def norm(name: str, rows: float, width: int, e: int, layer_norm: bool) -> Kernel:
    """A LayerNorm (``layer_norm``: with its bias and mean) or RMSNorm over
    ``rows`` rows of ``width`` (TE's kernels, see the module's docstring).

    >>> k = norm("ln", 8, 16, 2, False)
    >>> k.bytes, k.backward_bytes, k.params
    (576.0, 17760.0, 16)
    """
    weights = (2 if layer_norm else 1) * width
    stats = (2 if layer_norm else 1) * FP32_BYTES * rows
    n = rows * width
    forward = e * (2 * n + weights) + stats
    backward = e * (3 * n + 2 * weights) + stats + 2 * FP32_BYTES * NORM_PARTIALS * weights
    return Kernel(name, MEMORY, 0.0, float(forward), None, weights,
                  float(backward))


def rope(name: str, sh: Shard, q_width: int, k_width: int, head_dim: int) -> Kernel:
    """TE's fused rotary embedding on this rank's queries and keys (``q_width``
    and ``k_width`` elements a token): each call reads its tensor and the FP32
    frequencies [s, head_dim] and writes the rotated tensor; backward the same.

    >>> k = rope("rope", Shard(1, 4), 8, 4, 2)
    >>> k.bytes == k.backward_bytes == 2 * 2 * 4 * 12 + 2 * 4 * 4 * 2
    True
    """
    seq = sh.seq // sh.cp
    moved = sh.dtype_bytes * 2 * sh.tokens * (q_width + k_width) + 2 * FP32_BYTES * seq * head_dim
    return Kernel(name, MEMORY, 0.0, float(moved), None, 0,
                  float(moved))


def bias_dropout_add(name: str, n: float, width: int, e: int, bias: bool,
                     dropout: float) -> Kernel:
    """Megatron-Core's bias-dropout-add over ``n`` elements of the hidden state
    (``width`` a token), with the residual's gradient add in its backward.

    >>> bias_dropout_add("r", 100, 10, 2, False, 0.0).backward_bytes
    600.0
    >>> bias_dropout_add("r", 100, 10, 2, True, 0.1).bytes
    720.0
    """
    mask = MASK_BYTES * n if dropout > 0 else 0.0
    forward = e * (3 * n + (width if bias else 0)) + mask
    backward = 3 * e * n  # the fork's gradients added (the norm's and the residual's)
    if dropout > 0:
        backward += 2 * e * n + mask
    if bias:
        backward += e * (n + width)
    return Kernel(name, MEMORY, 0.0, float(forward), None, 0,
                  float(backward))


def activation(name: str, tokens: float, width: float, e: int, gated: bool,
               bias: bool) -> Kernel:
    """The MLP's fused activation on ``tokens`` rows of inner ``width`` (this
    rank's): SwiGLU/GeGLU over the gate and up halves, or GeLU with its bias.

    >>> activation("act", 10, 4, 2, True, False).backward_bytes  # dy, x read; dx written
    400.0
    """
    n = tokens * width
    if gated:
        return Kernel(name, MEMORY, 0.0, float(e * 3 * n), None, 0,
                      float(e * 5 * n))
    b = width if bias else 0
    backward = e * (3 * n + (n + b if bias else 0))
    return Kernel(name, MEMORY, 0.0, float(e * (2 * n + b)), None, 0,
                  float(backward))


def loss(logits: float, fused: bool) -> Kernel:
    """The vocabulary-parallel cross entropy over this rank's ``logits``
    (tokens x vocab / tp), Megatron-Core's fused or unfused kernels.

    >>> loss(10, True).bytes, loss(10, False).backward_bytes
    (220.0, 140.0)
    """
    forward, backward = (FUSED_LOSS_FORWARD, FUSED_LOSS_BACKWARD) if fused else (
        UNFUSED_LOSS_FORWARD, UNFUSED_LOSS_BACKWARD)
    return Kernel("loss", MEMORY, 0.0, float(forward * logits),
                  None, 0, float(backward * logits))


def loss_all_reduces(fused: bool) -> tuple[int, ...]:
    """Bytes a token of each tensor-parallel all-reduce of the cross entropy:
    the FP32 maxima, then the target logits and the exp-sums, in one call when
    fused (``torch.cat`` of the two), in two unfused.

    >>> loss_all_reduces(True), loss_all_reduces(False)
    ((4, 8), (4, 4, 4))
    """
    return (FP32_BYTES, 2 * FP32_BYTES) if fused else (FP32_BYTES,) * 3
