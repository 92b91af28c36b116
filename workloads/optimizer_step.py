"""The optimizer step's kernels at their bytes per parameter, as each framework
runs them on a rank's shard of the parameters (1/dp with the distributed
optimizer or a sharded one: the caller's ``params``).

Megatron-Core (``optimizer/distrib_optimizer.py``, ``optimizer/optimizer.py``
``MixedPrecisionOptimizer.step``) and DeepSpeed's ZeRO-1/2 BF16 path keep FP32
master parameters beside BF16 model parameters, and run, in order:

1. ``_copy_model_grads_to_main_grads``: ``main_param.grad = model_grad.float()``,
   free where the gradient buffer is FP32 (``grad_reduce_in_fp32``, Megatron's
   BF16 default), else a cast: read the gradient, write FP32.
2. ``clip_grad_norm`` (``--clip-grad``, default 1.0): ``get_grad_norm_fp32``'s
   ``multi_tensor_l2norm`` (Apex ``amp_C`` / TE ``multi_tensor_l2norm``) reads
   every FP32 main gradient once, then the norm is all-reduced. The scale by
   the clip coefficient (``multi_tensor_scale``) runs only when the norm
   exceeds the threshold (``clip_coeff < 1.0``): not modelled.
3. The fused Adam step (TE / Apex ``FusedAdam``, ``multi_tensor_adam``): reads
   the FP32 parameter, gradient, exp_avg and exp_avg_sq, writes the
   parameter and both moments: 28 bytes a parameter.
4. ``_copy_main_params_to_model_params``: ``shard_model_param.copy_(main)``:
   reads FP32, writes the model's parameter (BF16: 2 bytes; FP8 parameters:
   their quantized bytes).

PyTorch's DDP and FSDP (``pytorch``, ``torchtitan``) step the FP32 (sharded)
parameters themselves: no casts, the same fused Adam bytes, and
``torch.nn.utils.clip_grad_norm_`` (FSDP's too) reads the gradients for the
norm and multiplies them by the clamped coefficient unconditionally
(``_foreach_mul_``: read and write FP32).
"""

from __future__ import annotations

from simulator.base.ir import DP_STREAM, Collective, KernelClass, Phase
from workloads import offload
from workloads.frameworks import Framework
from workloads.kernel_types import Kernel
from workloads.precision import AMAX_BYTES_PER_GEMM, FP32_BYTES
from workloads.stage import Stage
from workloads.stage_memory import stage_lowp

ADAM_BYTES_PER_PARAM = 7 * FP32_BYTES  # multi_tensor_adam: p, g, m, v read; p, m, v written
GRAD_NORM_BYTES = FP32_BYTES  # multi_tensor_l2norm: each FP32 gradient read once
CLIP_SCALE_BYTES = 2 * FP32_BYTES  # PyTorch's unconditional _foreach_mul_ of the gradients
GRAD_NORM_ALL_REDUCE_BYTES = FP32_BYTES  # get_grad_norm_fp32: one FP32 total all-reduced
STEP_KERNELS = ("grad_cast", "grad_norm", "grad_clip", "optimizer", "param_copy")
MASTER_WEIGHTS = (Framework.MEGATRON, Framework.DEEPSPEED)  # FP32 masters beside the model's


def step_kernels(params: float, framework: Framework, grad_bytes: float,
                 param_bytes: float, clip: bool = True) -> list[Kernel]:
    """The kernels of one optimizer step over ``params`` parameters, in order;
    ``grad_bytes``: a gradient element's bytes as reduced; ``param_bytes``: a
    model parameter's (BF16 2, FP8 1); ``clip``: gradient clipping on.

    >>> [(k.name, k.bytes / 10) for k in step_kernels(10, Framework.MEGATRON, 4, 2)]
    [('grad_norm', 4.0), ('optimizer', 28.0), ('param_copy', 6.0)]
    >>> [k.bytes / 10 for k in step_kernels(10, Framework.MEGATRON, 2, 2, clip=False)]
    [6.0, 28.0, 6.0]
    >>> [(k.name, k.bytes / 10) for k in step_kernels(10, Framework.PYTORCH, 4, 2)]
    [('grad_norm', 4.0), ('grad_clip', 8.0), ('optimizer', 28.0)]
    """
    masters = framework in MASTER_WEIGHTS
    out = []
    if masters and grad_bytes < FP32_BYTES:
        out.append(_kernel("grad_cast", (grad_bytes + FP32_BYTES) * params))
    if clip:
        out.append(_kernel("grad_norm", GRAD_NORM_BYTES * params))
        if not masters:
            out.append(_kernel("grad_clip", CLIP_SCALE_BYTES * params))
    out.append(_kernel("optimizer", ADAM_BYTES_PER_PARAM * params))
    if masters:
        out.append(_kernel("param_copy", (FP32_BYTES + param_bytes) * params))
    return out


def bytes_per_param(framework: Framework, grad_bytes: float, param_bytes: float,
                    clip: bool = True) -> float:
    """HBM bytes the step moves per parameter (``step_kernels``'s sum over one).

    >>> bytes_per_param(Framework.MEGATRON, 4, 2), bytes_per_param(Framework.PYTORCH, 4, 2)
    (38.0, 40.0)
    """
    return sum(k.bytes for k in step_kernels(1.0, framework, grad_bytes, param_bytes, clip))


def optimizer_pass(b: Stage, owned: float) -> None:
    """The step over the ``owned`` parameters of this rank, after the gradient
    reductions (``b.ready``): the host's share under optimizer offload
    (``offload.host_step``, its parameters cast on the GPU when back), the
    rest on the GPU (``step_kernels``, the framework's), the gradient norm
    all-reduced over the data-parallel group (blocking: the step needs the clip
    coefficient) where the gradients are sharded over dp x cp > 1 ranks (ZeRO,
    the distributed optimizer, FSDP: Megatron-Core's ``get_grad_norm_fp32`` over
    the distributed optimizer's group, PyTorch's ``clip_grad_norm_`` over
    sharded DTensors); replicated gradients (DDP) give every rank the whole
    norm, which its model-parallel group's all-reduce alone completes (not
    modelled: a few bytes)."""
    ctx = b.ctx
    plan = ctx.plan
    on_gpu, on_host = offload.optimizer_split(ctx.training, owned)
    back = offload.host_step(b, on_host, ADAM_BYTES_PER_PARAM)
    for kernel in step_kernels(on_gpu, ctx.parallel.framework, plan.reduce_bytes,
                               plan.param_bytes):
        b.compute(kernel, Phase.OPTIMIZER, -1, -1, 0.0, kernel.bytes)
        if kernel.name == "grad_norm" and ctx.parallel.dp * ctx.parallel.cp > 1 and \
                (ctx.parallel.zero_stage >= 1 or ctx.parallel.fsdp is not None):
            b.collective(Collective.ALL_REDUCE, GRAD_NORM_ALL_REDUCE_BYTES, DP_STREAM,
                         ctx.dp_group, Phase.OPTIMIZER, -1, -1, name="grad_norm_all_reduce")
    if back is not None:  # the host's updated parameters, cast on the GPU
        cast = offload.cast_kernel(on_host, ctx.training.dtype_bytes)
        b.compute(cast, Phase.OPTIMIZER, -1, -1, 0.0, cast.bytes, extra=(back,))


def amax_reduction(b: Stage) -> None:
    """Delayed scaling's amax all-reduce (Transformer Engine reduces the amaxes of
    every FP8 tensor over the data-parallel replicas, so their scales agree): one
    small call per iteration before the step, three FP32 amaxes a GEMM, blocking."""
    ctx = b.ctx
    recipe = ctx.training.recipe
    if recipe is None or recipe.name != "delayed" or ctx.parallel.dp * ctx.parallel.cp == 1:
        return
    gemms = stage_lowp(ctx, b.stage)[1]
    b.collective(Collective.ALL_REDUCE, AMAX_BYTES_PER_GEMM * gemms, DP_STREAM, ctx.dp_group,
                 Phase.OPTIMIZER, -1, -1, name="amax_all_reduce")




def _kernel(name: str, nbytes: float) -> Kernel:
    return Kernel(name, KernelClass.ELEMENTWISE, 0.0, float(nbytes))
