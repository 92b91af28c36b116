"""A grouped GEMM (a MoE layer's experts) at few tokens per expert, per GPU
generation.

Each expert's weights are its own operand: at r rows per expert the kernel
does 2 r FLOPs per weight element it reads, so at a few hundred rows it streams
its weights from HBM about as long as its tensor cores compute (the ridge). Two
measured effects put it below the roofline ``max(compute, stream)`` there:

- its operands stream at ``STREAM_EFFICIENCY`` of the HBM bandwidth, below a
  copy's (``memory_efficiency``, 0.87): TMA loads through the mainloop's
  stages, not a streaming kernel;
- ``UNHIDDEN`` of the shorter of the two is not hidden under the longer (each
  expert's weight panels start their own pipeline; the SMs switch expert, and
  descriptor, tile by tile):

      t = max(t_compute, t_stream) + UNHIDDEN * min(t_compute, t_stream)

``t_compute`` is the tile model's (``compute.gemm``) with each expert padded to
the generation's grouped tile, ``GROUP_ROWS``. Fitted on the project's 258
grouped GEMMs timed on an H200 (``torch._grouped_mm``: CUTLASS's SM90 grouped
kernel; ``topologies/data/kernels/h200/grouped_sweep.csv``, 64-4,096 tokens per
expert): mean absolute error 6.1 % against 13.8 % for the plain roofline, the
bias under 3 % at every tokens-per-expert step. Checked, not fitted, on
DeepGEMM's FP8 grouped GEMMs on H800 (README at 55ab91f, 2025-03-25: contiguous
and masked layouts, 256-8,192 rows per group): 7.0 % against 16.4 %
(``tests/test_moe_gemm_routing.py``).

Which kernel each framework runs: Transformer Engine's ``GroupedLinear``
(Megatron-Core's ``--moe-grouped-gemm`` default, TEGroupedMLP) is a loop of
cuBLASLt GEMMs over 4 streams on Hopper and, by default, on Blackwell
(TransformerEngine PR #853, 2024; its issue #1386: cuBLAS's grouped call was
slower; PR #3134, 2026: "the per-tensor NVFP4 grouped GEMM currently runs as a
per-expert loop of cuBLASLt GEMMs across multiple CUDA streams"); Megatron's
legacy GroupedMLP and PyTorch's ``_grouped_mm`` are CUTLASS grouped kernels,
DeepSeek's DeepGEMM its own. All pad an expert to the M tile they run:
128 rows on Hopper (DeepGEMM's contiguous layout alignment,
``kLegacyMKAlignmentForContiguousLayout`` = 128; CUTLASS's 128 x 256 Hopper
tiles) and 256 on Blackwell, where the fast tile is a 2-SM cluster's 256 x 256
(CUTLASS example 75_blackwell_grouped_gemm: ``MmaTileShape2SM`` 256 x 256 with
``KernelPtrArrayTmaWarpSpecialized2SmSm100``; each SM holds 128 x 256 of it).
"""

from __future__ import annotations

STREAM_EFFICIENCY = 0.68  # the H200 sweep's fit (above); CUTLASS issue #2266 (B200 NVFP4
# grouped GEMM, memory-bound: 3-4 of 8 TB/s, MXFP8 "much closer to 6") brackets it
UNHIDDEN = 0.2  # the H200 sweep's fit (above): share of the shorter of compute and streaming
# left exposed
GROUP_ROWS = {"ampere": 128, "hopper": 128, "blackwell": 256}  # rows an expert is padded to


def group_rows(architecture: str) -> int:
    """The rows a grouped GEMM pads each expert to on ``architecture``.

    >>> group_rows("hopper"), group_rows("blackwell")
    (128, 256)
    """
    return GROUP_ROWS.get(architecture, GROUP_ROWS["hopper"])


def seconds(compute: float, stream: float) -> float:
    """A grouped GEMM's time from its tiles' ``compute`` seconds and its
    operands' ``stream`` seconds at ``STREAM_EFFICIENCY`` of the HBM bandwidth.

    >>> round(seconds(1.0, 1.0), 3), round(seconds(3.0, 1.0), 3)
    (1.2, 3.2)
    """
    return max(compute, stream) + UNHIDDEN * min(compute, stream)


def describe(rows: int) -> str:
    """The summary's words for this mechanism."""
    return (f"grouped GEMMs pad each expert to {rows}-row tiles, stream their operands at "
            f"{STREAM_EFFICIENCY:g} of HBM with {UNHIDDEN:g} of the shorter unhidden")
