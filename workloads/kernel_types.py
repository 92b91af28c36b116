"""A kernel, one rank's cut of a layer, and the constructors every kernel
builder shares: a GEMM, an element-wise kernel timed by its bytes, a linear
layer with its low-precision cast.

A ``Shard`` says how one rank's share is cut (Megatron-LM): tensor parallelism
t splits the QKV/fc1 output columns and proj/fc2 input rows and the heads;
sequence parallelism also splits the norms, dropouts and residuals along the
sequence; context parallelism c splits the sequence for every token-wise op,
while each rank's queries still attend to the whole sequence.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simulator.base.ir import KernelClass
from workloads.precision import BF16_BYTES, LowPrecision


@dataclass(frozen=True)
class Shard:
    """One rank's cut of a layer: micro-batch, sequence, precision and degrees."""

    micro_batch: int
    seq: int
    dtype_bytes: int = 2
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    flash: bool = True  # fused attention; else two batched GEMMs around a softmax
    lowp: LowPrecision | None = None  # the linear layers' low precision (workloads.precision)
    fp8_attention: bool = False  # attention's core in FP8 (training.fp8_attention)
    dropout: float = 0.0  # hidden dropout's probability (training.hidden_dropout)
    fused_loss: bool = True  # Megatron-Core's fused cross entropy (else its unfused kernels)
    # bytes of the main_grad element a weight-gradient GEMM accumulates into in place
    # (Megatron's gradient_accumulation_fusion; 0: it writes its own gradient)
    main_grad_bytes: int = 0

    @property
    def tokens(self) -> int:
        """Tokens of one micro-batch this rank's GEMMs see."""
        return self.micro_batch * self.seq // self.cp

    @property
    def norm_split(self) -> int:
        """Split of norm/dropout/residual tensors (tp with sequence parallelism)."""
        return self.tp if self.sequence_parallel else 1


@dataclass(frozen=True)
class Kernel:
    """One forward kernel; ``params`` are the weights whose gradients it makes."""

    name: str
    cls: KernelClass
    flops: float
    bytes: float
    shape: tuple[int, ...] | None = None  # GEMM (m, n, k[, rows per group]); attention's
    params: int = 0
    backward_bytes: float | None = None  # its backward's bytes where not twice the forward's


def gemm(name: str, m: int, n: int, k: int, dtype_bytes: int, bias: bool) -> Kernel:
    """C[m,n] = A[m,k] @ W[k,n] (+ b): 2mnk FLOPs; reads A and W, writes C."""
    params = k * n + (n if bias else 0)
    moved = dtype_bytes * (m * k + k * n + m * n)
    return Kernel(name, KernelClass.GEMM, 2.0 * m * n * k, moved, (m, n, k), params)


def elementwise(name: str, elements_in: float, elements_out: float, dtype_bytes: int,
                params: int = 0, backward_bytes: float | None = None) -> Kernel:
    """A memory-bound kernel reading ``elements_in`` and writing ``elements_out``
    elements of ``dtype_bytes``; ``backward_bytes``: its backward's (None: twice)."""
    return Kernel(name, KernelClass.ELEMENTWISE, 0.0,
                  dtype_bytes * (elements_in + elements_out), None, params, backward_bytes)


def linear(name: str, m: int, n: int, k: int, sh: Shard, bias: bool,
           norm_fed: bool = False) -> list[Kernel]:
    """A linear layer's GEMM; under low precision (``sh.lowp``) its cast and the
    GEMM at the format's peak (``low_precision``). ``norm_fed``: the input comes
    from a norm, which writes its quantized copies itself (Transformer Engine's
    LayerNormLinear). Its backward accumulates into ``main_grad`` where the
    shard says so (``accumulating``)."""
    kernel = gemm(name, m, n, k, sh.dtype_bytes, bias)
    kernels = [kernel] if sh.lowp is None else low_precision(kernel, m, k * n, sh.lowp,
                                                             norm_fed)
    return [*kernels[:-1], accumulating(kernels[-1], sh)]


def accumulating(kernel: Kernel, sh: Shard) -> Kernel:
    """A GEMM whose weight-gradient GEMM accumulates into the ``main_grad``
    buffer in place (Megatron-Core's ``gradient_accumulation_fusion``: TE's
    ``fuse_wgrad_accumulation``, a cuBLAS GEMM with beta = 1, and
    ``fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32`` for the logits):
    it reads and writes the k x n gradient at ``sh.main_grad_bytes`` (FP32: 4)
    instead of writing it at the weight's bytes, which twice the forward's
    bytes would count.

    >>> accumulating(gemm("g", 8, 4, 2, 2, False), Shard(8, 8, main_grad_bytes=4)).backward_bytes
    272.0
    """
    if not sh.main_grad_bytes or kernel.shape is None:
        return kernel
    k, n = kernel.shape[2], kernel.shape[1]
    weight_bytes = (sh.lowp.recipe.quantized_bytes if kernel.cls is KernelClass.LOWP_GEMM
                    else sh.dtype_bytes)
    extra = (2 * sh.main_grad_bytes - weight_bytes) * k * n
    return replace(kernel, backward_bytes=2.0 * kernel.bytes + extra)


def low_precision(kernel: Kernel, m: int, weights: int, lowp: LowPrecision,
                  norm_fed: bool = False) -> list[Kernel]:
    """A GEMM ``kernel`` (m token rows, ``weights`` weight elements) under low
    precision: its cast (``quantize_kernel``), then the GEMM at the format's peak
    reading quantized operands and writing BF16."""
    n, k = kernel.shape[1:3]
    moved = lowp.recipe.quantized_bytes * (m * k + weights) + BF16_BYTES * m * n
    return [quantize_kernel(kernel.name, m, n, k, lowp, norm_fed, weights),
            replace(kernel, cls=KernelClass.LOWP_GEMM, bytes=moved)]


def quantize_kernel(name: str, m: int, n: int, k: int, lowp: LowPrecision,
                    norm_fed: bool = False, weights: int | None = None) -> Kernel:
    """The casts of a low-precision GEMM C[m,n] = A[m,k] @ W[k,n]: forward, the
    input A (``LowPrecision.reads``: a norm's output is read less) and the
    weight's share of its one cast per iteration (``lowp.micro_batches``
    forwards share it); backward, the output gradient dC, the weight-gradient
    GEMM's operand (NVFP4: through the Hadamard transform). ``weights``: the
    weight elements (a grouped GEMM's experts together; default k x n)."""
    weights = k * n if weights is None else weights
    forward = lowp.cast_bytes(m * k, lowp.reads(norm_fed)) + lowp.cast_bytes(
        weights, lowp.reads()) / lowp.micro_batches
    backward = lowp.cast_bytes(m * n, lowp.reads(), hadamard=True)
    return Kernel(f"{name}_quantize", KernelClass.QUANTIZE, 0.0, forward, None, 0, backward)
