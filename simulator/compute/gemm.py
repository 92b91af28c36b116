"""A GEMM's time from its output tiles on the GPU's SMs (the tile model).

cuBLAS and CUTLASS cut C[m, n] into output tiles, each computed by one SM (one
thread-block, or a cluster's share) that walks the k dimension through a
pipeline of shared-memory stages (NVIDIA, "Matrix Multiplication Background
User's Guide": tile and wave quantization). Hopper's and Blackwell's persistent
kernels spread the k-iterations of the tiles evenly over the SMs (stream-K,
Osama et al., PPoPP 2023; CUTLASS's data-parallel + stream-K hybrid), so the
time is that of one SM's share of the k-iterations, plus one pipeline fill and
epilogue per tile it finishes:

    tiles = ceil(m / TM) * ceil(n / TN)
    t     = c * (tiles * k / P + k0 * ceil(tiles / SMs)),   c = 2 TM TN / (peak / SMs * eff)

where P = min(SMs, tiles * k / (8 k-steps)) SMs share the k-iterations (a
tile's k is split into shares of at least ``MIN_SPLIT_STEPS`` k-steps). Ampere's
cuBLAS runs whole waves of tiles instead (wave quantization), splitting k only
when the tiles leave SMs idle (split-K): ``c * ceil(tiles * split / SMs) * (k /
split + k0)``.

with TM x TN = 128 x 256 or 256 x 128, whichever wastes less (one SM's share
of Hopper's and Blackwell's largest BF16/FP8 tiles, cuBLAS's most efficient:
two 64 x 256 warpgroup MMAs; Blackwell's 2-SM 256 x 256) and k0
the k-elements of the pipeline's ``PIPELINE_STAGES`` stages of
``STAGE_BYTES``-byte k-slices (fill and drain: 256 BF16 elements, 512 FP8,
1,024 FP4). What the model keeps from shapes: a skinny m pays for whole
128-row tiles (tile quantization), a short k pays the fixed k0 per tile, and a
GEMM too small to fill the SMs runs at their share. A GEMM whose operands take
longer to stream from HBM than its tiles take is memory-bound (the caller's
roofline takes the larger).

A grouped GEMM (the experts of a MoE layer, ``groups`` row counts) is one
persistent kernel over every group's tiles: each group pays its own tile
quantization at the generation's grouped tile (``group_rows``: an expert of 200
tokens fills two 128-row tiles on Hopper, 56 rows wasted, and one 256-row
2-SM tile on Blackwell, also 56; one of 300 tokens wastes 84 rows on Hopper
and 212 on Blackwell), then the tiles share the SMs as one GEMM's do. Its time
against its operands' streaming is ``compute.grouped``'s.

``eff`` is the GPU file's ``gemm_efficiency``: the tensor cores' sustained
share of their peak inside a tile, from published large-GEMM throughput.
Checked against 187 BF16 GEMMs timed on an H200 (``scripts/kernel_sweeps.py``,
``topologies/data/kernels/h200-sweeps/``): mean absolute error 6 %.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

TILE_M, TILE_N = 128, 256  # one SM's output tile (see the module docstring)
PIPELINE_STAGES = 4  # shared-memory stages in flight (CUTLASS's Hopper mainloops: 4-7)
STAGE_BYTES = 128  # bytes of k per row per stage (Hopper: 64 BF16 elements)
MIN_SPLIT_STEPS = 8  # stream-K splits a tile's k only into shares of more than 8 k-steps
# (CUTLASS's stream-K heuristic), so a few tiles take few SMs


@dataclass(frozen=True)
class TileModel:
    """One GPU's SMs and tensor-core efficiency, as the tile model needs them."""

    sms: int
    efficiency: float
    stream_k: bool = True  # Hopper and later; Ampere's cuBLAS runs whole waves of tiles
    # rows a grouped GEMM pads each group to (``compute.grouped.GROUP_ROWS``: 128 on
    # Ampere and Hopper, 256 on Blackwell's 2-SM tiles)
    group_rows: int = TILE_M

    def seconds(self, m: float, n: float, k: float, peak: float, element_bytes: float = 2.0,
                groups: tuple[int, ...] = ()) -> float:
        """Compute time of C[m, n] = A[m, k] @ B[k, n] at ``peak`` FLOP/s in
        ``element_bytes``-byte operands; ``groups``: a grouped GEMM's row counts
        (their sum is m), each group tiled on its own.

        >>> h100 = TileModel(132, 0.75)
        >>> round(h100.seconds(8192, 8192, 8192, 989e12) * 1e3, 3)  # 2,048 tiles
        1.53
        >>> one = h100.seconds(128, 256, 4096, 989e12)  # one tile: k split over 8 SMs
        >>> round(one / h100.seconds(128 * 132, 256, 4096, 989e12), 3)  # 132 tiles
        0.176
        >>> h100.seconds(200, 512, 4096, 989e12) == h100.seconds(256, 512, 4096, 989e12)
        True
        >>> h100.seconds(4096, 96, 4096, 989e12) == h100.seconds(4096, 128, 4096, 989e12)
        True
        """
        k0 = PIPELINE_STAGES * STAGE_BYTES / element_bytes
        least = MIN_SPLIT_STEPS * STAGE_BYTES / element_bytes  # k one SM takes at least
        per_k = 2.0 * TILE_M * TILE_N / (peak / self.sms * self.efficiency)
        best = math.inf
        for tm, tn in ((TILE_M, TILE_N), (TILE_N, TILE_M)):  # the kernel's better orientation
            pad = max(tm, self.group_rows)  # a group's rows, in whole grouped tiles
            rows = sum(math.ceil(g / pad) for g in groups) * (pad // tm) if groups \
                else math.ceil(m / tm)
            tiles = rows * math.ceil(n / tn)
            if self.stream_k:
                spread = min(self.sms, tiles * max(1.0, k / least))  # SMs sharing the k-steps
                t = tiles * k / spread + k0 * math.ceil(tiles / self.sms)
            else:  # waves of whole tiles; split-K where the tiles leave SMs idle
                split = max(1, min(self.sms // tiles, int(k // least))) if tiles < self.sms \
                    else 1
                t = math.ceil(tiles * split / self.sms) * (k / split + k0)
            best = min(best, per_k * t)
        return best

    def describe(self) -> str:
        return (f"tile model ({self.sms} SMs, {TILE_M}x{TILE_N} tiles, {self.efficiency:g} of "
                "peak inside a tile)")
