"""GPU specifications and the efficiencies the compute model uses.

Peak figures are the vendors' dense tensor-core numbers (A100 SXM 312 TFLOP/s
BF16/FP16; H100/H200 SXM 989 TFLOP/s BF16, 1979 FP8). Efficiencies are fitted to
published single-GPU measurements (Azure AI-benchmarking-guide, ND A100 v4 and
ND H100 v5 results):

- A100 cuBLASLt FP16 GEMM: 228.0 TFLOP/s at 4096^3, 253.7 at 8192^3, 256.5 at
  16384^3, 250.8 at 6144x12288x12288. ``gemm_efficiency`` 0.857 with
  ``gemm_half_dim`` 700 reproduces these within 3 %.
- FlashAttention-2 forward+backward: A100 179.5 TFLOP/s (head dim 64), H100 327.9
  (head dim 128).
- HBM stream copy: A100-80GB 1.61 TB/s of 2.039; H100 2.9 TB/s of 3.35.
- H100 BF16 GEMM is not in that table; its FP8 16384^3 GEMM reaches 1377 of 1979
  TFLOP/s (0.70); we take 0.75 for BF16, the commonly reported large-GEMM ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType

GIB = 2.0**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: peaks, memory, and roofline efficiencies."""

    name: str
    peak_flops: Mapping[str, float]  # dense FLOP/s per precision name
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    gemm_efficiency: float  # fraction of peak reached by very large GEMMs
    gemm_half_dim: float  # geometric-mean GEMM dimension at half of gemm_efficiency
    attention_efficiency: float  # fraction of peak reached by fused attention
    memory_efficiency: float  # fraction of HBM bandwidth reached by streaming kernels
    kernel_overhead: float = 2e-6  # seconds per kernel launch / tail
    notes: str = field(default="", compare=False)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; KeyError if the GPU lacks it."""
        return self.peak_flops[precision]


def _peaks(**values: float) -> Mapping[str, float]:
    return MappingProxyType(dict(values))


_A100_EFF = dict(gemm_efficiency=0.857, gemm_half_dim=700.0, attention_efficiency=0.575)

GPUS: Mapping[str, GpuSpec] = MappingProxyType(
    {
        "a100-sxm-80gb": GpuSpec(
            name="a100-sxm-80gb",
            peak_flops=_peaks(bf16=312e12, fp16=312e12),
            memory_bytes=80 * GIB,
            hbm_bandwidth=2.039e12,
            memory_efficiency=0.79,
            **_A100_EFF,
        ),
        "a100-sxm-40gb": GpuSpec(
            name="a100-sxm-40gb",
            peak_flops=_peaks(bf16=312e12, fp16=312e12),
            memory_bytes=40 * GIB,
            hbm_bandwidth=1.555e12,
            memory_efficiency=0.79,
            **_A100_EFF,
        ),
        "h100-sxm-80gb": GpuSpec(
            name="h100-sxm-80gb",
            peak_flops=_peaks(bf16=989e12, fp16=989e12, fp8=1979e12),
            memory_bytes=80 * GIB,
            hbm_bandwidth=3.35e12,
            gemm_efficiency=0.75,
            gemm_half_dim=900.0,
            attention_efficiency=0.33,
            memory_efficiency=0.87,
        ),
        "h200-sxm-141gb": GpuSpec(
            name="h200-sxm-141gb",
            peak_flops=_peaks(bf16=989e12, fp16=989e12, fp8=1979e12),
            memory_bytes=141e9,
            hbm_bandwidth=4.8e12,
            gemm_efficiency=0.75,
            gemm_half_dim=900.0,
            attention_efficiency=0.33,
            memory_efficiency=0.87,
        ),
    }
)
