"""How a model is trained: batch shape and precision, and the DP settings."""

from __future__ import annotations

from dataclasses import dataclass

DTYPE_BYTES = {"bf16": 2, "fp16": 2}


@dataclass(frozen=True)
class TrainingSpec:
    seq_len: int
    global_batch: int
    micro_batch: int
    precision: str = "bf16"

    @property
    def dtype_bytes(self) -> int:
        return DTYPE_BYTES[self.precision]


@dataclass(frozen=True)
class DataParallelSpec:
    dp: int
    bucket_bytes: float = 25e6
    overlap_grad_reduce: bool = True

    def micro_batches(self, training: TrainingSpec) -> int:
        """Micro-batches each rank runs per iteration (gradient accumulation steps)."""
        return training.global_batch // (self.dp * training.micro_batch)
