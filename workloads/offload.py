"""Offloading to host memory: activations (``training.activation_offload_layers``)
and optimizer states (``training.optimizer_offload``).

Activations, as Megatron-Core's CPU offloading with Transformer Engine's offload
context does it: the first N transformer layers of each stage copy the
activations they keep for their backward to host memory once their forward
ends, on a stream of their own (``offload``: a copy engine, so the compute
stream goes on; copies back on ``reload``, the other direction's engine), and
the GPU frees them when the copy is done; in the backward each such layer's
copy back is issued as the layer after it (in forward order) starts its
backward, one layer ahead, and its backward waits for it. The last layers are
not offloaded: their backward comes first, too soon to hide the copy (TE
requires fewer offloaded layers than a stage has).

Optimizer, as Megatron's optimizer CPU offload (``HybridDeviceOptimizer``,
``optimizer_offload_fraction``): a fraction F of each rank's optimizer shard
lives in host memory. After the gradients are reduced the GPU steps its own
part while the offload stream copies F of the fp32 gradient shard to the host,
the CPU runs Adam over it (bound by host memory bandwidth: the same bytes per
parameter as the GPU's step) and the fp32 parameters come back, cast to the
training precision by one GPU kernel.

Copies are timed on the GPU-host link (``ClusterSpec.host_rates``), the host
step on host memory bandwidth. Memory in host memory is counted in categories
named ``host_...`` (``simulator.base.ir.HOST_MEMORY``), apart from the GPU's.
"""

from __future__ import annotations

from simulator.base.ir import OFFLOAD_STREAM, RELOAD_STREAM, KernelClass, Op, OpKind, Phase
from workloads import kernels as K
from workloads.memory import OPTIMIZER_BYTES
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError, Stage
from workloads.strategies import pipeline
from workloads.training import ParallelSpec, TrainingSpec

FP32 = 4  # bytes of an fp32 gradient or master parameter
HOST_ACTIVATIONS, HOST_OPTIMIZER = "host_activations", "host_optimizer_states"


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Fewer offloaded layers than the smallest stage has, and not with DeepSpeed
    ZeRO-3 (its per-tensor gathers have no layer boundaries to copy at)."""
    n = training.activation_offload_layers
    if n == 0:
        return
    fewest = min(pipeline.layers_per_stage(model, parallel))
    if n >= fewest:
        raise LayoutError(f"training.activation_offload_layers: {n} must be fewer than the "
                          f"{fewest} layers of the smallest pipeline stage (the last layers' "
                          "backward comes first: nothing would hide their copy back)")
    if parallel.deepspeed_zero3 is not None:
        raise LayoutError("training.activation_offload_layers: not with DeepSpeed ZeRO-3 "
                          "(parallelism.deepspeed); use zero: 3 (Megatron-Core) or fsdp")


def offloaded(ctx: Context, stage: int) -> frozenset[int]:
    """The layers of ``stage`` whose activations go to host memory: its first N."""
    n = ctx.training.activation_offload_layers
    if n == 0:
        return frozenset()
    mine = [layer for k, layers in enumerate(ctx.chunks) if ctx.owner(k) == stage
            for layer in layers]
    return frozenset(sorted(mine)[:n])


def _copy(b: Stage, name: str, nbytes: float, phase: Phase, mb: int, layer: int,
          deps: tuple[int, ...], mem: tuple = (), kernel=KernelClass.HOST_COPY,
          stream: str = OFFLOAD_STREAM) -> int:
    """Append a copy (or the host's work) on its stream: to the host on ``offload``,
    back on ``reload``."""
    b.ops.append(Op(OpKind.COMPUTE, name, stream, phase, deps, kernel, 0.0, nbytes,
                    None, None, "", mb, layer, mem))
    return len(b.ops) - 1


def copy_out(b: Stage, layer: int, mb: int, kept: float) -> None:
    """After ``layer``'s forward: its kept activations to host memory, freed on the
    GPU when the copy ends."""
    _copy(b, "activations_to_host", kept, Phase.FORWARD, mb, layer, (b.last_compute,),
          ((-kept, "activations"), (kept, HOST_ACTIVATIONS)))


def copy_in(b: Stage, layer: int, mb: int, kept: float) -> int:
    """``layer``'s activations back from host memory, issued now (after the last
    compute op so far): the copy its backward waits for."""
    deps = (b.last_compute,) if b.last_compute is not None else ()
    return _copy(b, "activations_from_host", kept, Phase.BACKWARD, mb, layer, deps,
                 ((kept, "activations"), (-kept, HOST_ACTIVATIONS)), stream=RELOAD_STREAM)


def optimizer_split(training: TrainingSpec, shard_params: float) -> tuple[float, float]:
    """(parameters the GPU steps, parameters the host steps) of a rank's shard."""
    host = training.optimizer_offload * shard_params
    return shard_params - host, host


def host_step(b: Stage, host_params: float, adam_bytes: float) -> int | None:
    """The host's part of the optimizer step after the gradient reductions
    (``b.ready``): gradients out, Adam on the CPU, parameters back; returns the
    copy back, which the GPU's cast kernel waits for (None without offload)."""
    if host_params <= 0:
        return None
    deps = tuple(b.ready) + ((b.last_compute,) if b.last_compute is not None else ())
    out = _copy(b, "gradients_to_host", FP32 * host_params, Phase.OPTIMIZER, -1, -1, deps)
    step = _copy(b, "host_adam_step", adam_bytes * host_params, Phase.OPTIMIZER, -1, -1,
                 (out,), kernel=KernelClass.HOST_COMPUTE)
    return _copy(b, "parameters_from_host", FP32 * host_params, Phase.OPTIMIZER, -1, -1,
                 (step,), stream=RELOAD_STREAM)


def cast_kernel(host_params: float, dtype_bytes: int) -> K.Kernel:
    """The GPU kernel that casts the fp32 parameters back from the host to the
    training precision (reads 4 bytes, writes ``dtype_bytes`` per parameter)."""
    return K.Kernel("offloaded_parameter_cast", KernelClass.ELEMENTWISE, 0.0,
                    (FP32 + dtype_bytes) * host_params, None, 0)


def host_states(states: dict[str, float], training: TrainingSpec,
                grad_bytes: int) -> dict[str, float]:
    """A rank's static memory with F of its optimizer states (and a host copy of
    their gradients) moved to host memory."""
    f = training.optimizer_offload
    if f == 0:
        return states
    shard = states["optimizer_states"] / OPTIMIZER_BYTES  # parameters in this rank's shard
    return {**states, "optimizer_states": (1 - f) * states["optimizer_states"],
            HOST_OPTIMIZER: f * shard * (OPTIMIZER_BYTES + grad_bytes)}
