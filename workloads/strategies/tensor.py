"""Tensor parallelism (Megatron-LM, Shoeybi et al. 2019; sequence parallelism,
Korthikanti et al. 2022): its group, its layout checks, and where its
communication goes in a layer.

Without sequence parallelism Megatron's f and g operators are an all-reduce
after the attention and MLP blocks in forward and before them in backward
(2 + 2 per layer); with it an all-gather before and a reduce-scatter after
each block, mirrored in backward. All run on the ``tp`` stream and block the
next kernel.
"""

from __future__ import annotations

from simulator.base.ir import Collective
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError
from workloads.training import ParallelSpec, TrainingSpec


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Heads, KV heads and the MLP split evenly over the tensor-parallel ranks."""
    tp = parallel.tp
    for key, value in (("model.heads", model.heads), ("model.kv_heads", model.kv_heads),
                       ("model.ffn_hidden", model.ffn_hidden)):
        if value % tp:
            raise LayoutError(f"{key} ({value}) must be divisible by parallelism.tp ({tp})")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    return {"tp": layout.groups("tp")}


def block_comm(forward: bool, before_block: bool, sp: bool) -> Collective | None:
    """Megatron's f (before a block) and g (after it) in forward or backward."""
    if not sp:
        return Collective.ALL_REDUCE if forward != before_block else None
    if before_block:
        return Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER
    return Collective.REDUCE_SCATTER if forward else Collective.ALL_GATHER


def layer_sequence(kernels: list[K.Kernel]) -> list[K.Kernel | bool]:
    """Forward order; a bool marks Megatron's f (True: before a block) or g (False):
    f before QKV and fc1, g after proj and fc2."""
    out: list[K.Kernel | bool] = []
    for kernel in kernels:
        if kernel.name in ("qkv", "fc1"):
            out.append(True)
        out.append(kernel)
        if kernel.name in ("proj", "fc2"):
            out.append(False)
    return out
