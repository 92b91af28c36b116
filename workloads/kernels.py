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
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.ir import KernelClass
from workloads.models import Mlp, ModelSpec

ATTENTION_BACKWARD_FACTOR = 2.5  # FlashAttention-2 backward recomputes QK^T
LOSS_BYTES = 4  # logits are upcast to fp32 for softmax / cross-entropy


@dataclass(frozen=True)
class Kernel:
    """One forward kernel; ``params`` are the weights whose gradients it makes."""

    name: str
    cls: KernelClass
    flops: float
    bytes: float
    shape: tuple[int, int, int] | None = None
    params: int = 0


def gemm(name: str, m: int, n: int, k: int, dtype_bytes: int, bias: bool) -> Kernel:
    """C[m,n] = A[m,k] @ W[k,n] (+ b): 2mnk FLOPs; reads A and W, writes C."""
    params = k * n + (n if bias else 0)
    moved = dtype_bytes * (m * k + k * n + m * n)
    return Kernel(name, KernelClass.GEMM, 2.0 * m * n * k, moved, (m, n, k), params)


def elementwise(name: str, elements_in: float, elements_out: float, dtype_bytes: int,
                params: int = 0) -> Kernel:
    return Kernel(name, KernelClass.ELEMENTWISE, 0.0,
                  dtype_bytes * (elements_in + elements_out), None, params)


def layer_kernels(model: ModelSpec, micro_batch: int, seq: int, dtype_bytes: int) -> list[Kernel]:
    """Forward kernels of one transformer layer, in execution order."""
    t, h, f = micro_batch * seq, model.hidden, model.ffn_hidden
    qkv_out = (model.heads + 2 * model.kv_heads) * model.head_dim
    norm_params = 2 * h if model.bias else h
    up = 2 * f if model.mlp is Mlp.SWIGLU else f
    attention_bytes = dtype_bytes * t * (2 * h + 2 * model.kv_heads * model.head_dim)
    return [
        elementwise("ln1", t * h, t * h, dtype_bytes, norm_params),
        gemm("qkv", t, qkv_out, h, dtype_bytes, model.bias),
        Kernel("attention", KernelClass.ATTENTION, 4.0 * micro_batch * seq * seq * h,
               attention_bytes),
        gemm("proj", t, h, h, dtype_bytes, model.bias),
        elementwise("residual1", 2 * t * h, t * h, dtype_bytes),
        elementwise("ln2", t * h, t * h, dtype_bytes, norm_params),
        gemm("fc1", t, up, h, dtype_bytes, model.bias),
        elementwise("act", t * up, t * f, dtype_bytes),
        gemm("fc2", t, h, f, dtype_bytes, model.bias),
        elementwise("residual2", 2 * t * h, t * h, dtype_bytes),
    ]


def embedding_kernels(model: ModelSpec, micro_batch: int, seq: int,
                      dtype_bytes: int) -> list[Kernel]:
    """Token (and learned position) embedding lookup; owns the embedding tables."""
    t, h = micro_batch * seq, model.hidden
    params = model.vocab * h + (seq * h if model.learned_positions else 0)
    return [elementwise("embedding", 2 * t * h, t * h, dtype_bytes, params)]


def head_kernels(model: ModelSpec, micro_batch: int, seq: int, dtype_bytes: int) -> list[Kernel]:
    """Final norm, logits projection and softmax cross-entropy."""
    t, h, v = micro_batch * seq, model.hidden, model.vocab
    norm_params = 2 * h if model.bias else h
    logits = gemm("logits", t, v, h, dtype_bytes, bias=False)
    if model.tied_embeddings:  # the weight is the embedding table, counted there
        logits = Kernel(logits.name, logits.cls, logits.flops, logits.bytes, logits.shape, 0)
    return [
        elementwise("final_ln", t * h, t * h, dtype_bytes, norm_params),
        logits,
        Kernel("loss", KernelClass.ELEMENTWISE, 0.0, LOSS_BYTES * 3 * t * v),
    ]


def parameter_count(model: ModelSpec, seq: int) -> int:
    """Trainable parameters, from the kernels that own them."""
    kernels = (embedding_kernels(model, 1, seq, 2) + head_kernels(model, 1, seq, 2)
               + layer_kernels(model, 1, seq, 2) * model.layers)
    return sum(k.params for k in kernels)


def model_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Model FLOPs of one iteration on ``batch`` sequences: 3x the forward matmuls."""
    kernels = (layer_kernels(model, batch, seq, 2) * model.layers
               + head_kernels(model, batch, seq, 2))
    return 3.0 * sum(k.flops for k in kernels)


def megatron_model_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Closed form of Narayanan et al. (SC21) without recompute, for GPT shapes."""
    b, s, layers, h, v = batch, seq, model.layers, model.hidden, model.vocab
    return 72.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (12 * h * layers))


def backward_flops(kernel: Kernel) -> float:
    """FLOPs the backward of ``kernel`` executes."""
    if kernel.cls is KernelClass.ATTENTION:
        return ATTENTION_BACKWARD_FACTOR * kernel.flops
    return 2.0 * kernel.flops
