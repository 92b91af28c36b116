"""How a model is trained: batch shape, precision, recompute, and how it is split."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from workloads.memory import Recompute
from workloads.schedules import Schedule

DTYPE_BYTES = {"bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class TrainingSpec:
    seq_len: int
    global_batch: int
    micro_batch: int
    precision: str = "bf16"
    recompute: Recompute = Recompute.NONE
    flash_attention: bool = True  # fused attention: no score matrix is stored

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]


class Sharding(Enum):
    """PyTorch FSDP sharding strategies."""

    FULL_SHARD = "full_shard"  # parameters, gradients, optimizer states: ZeRO-3
    SHARD_GRAD_OP = "shard_grad_op"  # gradients and optimizer states: ZeRO-2
    HYBRID_SHARD = "hybrid_shard"  # full_shard inside a server, replicated across


@dataclass(frozen=True)
class FsdpSpec:
    sharding: Sharding = Sharding.FULL_SHARD
    prefetch: bool = True  # gather the next layer's parameters while this one computes
    reshard_after_forward: bool = True  # free gathered parameters after each forward

    @property
    def zero(self) -> int:
        return 2 if self.sharding is Sharding.SHARD_GRAD_OP else 3


@dataclass(frozen=True)
class ParallelSpec:
    """Degrees and strategies, with Megatron's names."""

    dp: int = 1
    tp: int = 1
    cp: int = 1
    pp: int = 1
    sequence_parallel: bool = False
    schedule: Schedule = Schedule.ONE_F_ONE_B
    virtual_stages: int = 1
    stage_layers: tuple[int, ...] | None = None  # layers per pipeline stage
    zero: int = 0
    fsdp: FsdpSpec | None = None
    order: str = "tp-cp-dp-pp"
    bucket_bytes: float = 25e6
    overlap_grad_reduce: bool = True
    ranks_per_node: int = 8  # for FSDP hybrid_shard: the shard group stays in a server

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def zero_stage(self) -> int:
        return self.fsdp.zero if self.fsdp else self.zero

    def micro_batches(self, training: TrainingSpec) -> int:
        """Micro-batches each pipeline runs per iteration (gradient accumulation steps)."""
        return training.global_batch // (self.dp * training.micro_batch)
