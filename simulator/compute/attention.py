"""Fused attention's time by shape, from published (and the project's measured)
benchmark tables: FlashAttention-2, FlashAttention-3, cuDNN and Triton kernels
by GPU, precision, pass, causal masking, head size and sequence length
(``topologies/data/kernels/attention.csv``, each row with its source).

A row gives a kernel's throughput in the FlashAttention papers' counting:
forward 4 b s^2 h d FLOPs, halved when causal, backward 2.5x the forward. An
attention op (``workloads.kernels.attention_kernels``: shape (batch x heads,
queries, keys, head size, causal)) takes the throughput interpolated in its
kernel's grid, linearly in log2(sequence) and log2(head size), at its keys
(the length each query block walks: the window under sliding-window
attention), for the work it does (half the pairs when causal):

- past the grid's longest sequence the throughput stays the longest's (the
  s^2 term dominates: time grows as the pairs do); below its shortest it
  falls in proportion to the sequence (a query block's fixed cost dominates);
  head sizes outside the grid take the nearest; the summary says when a run
  extrapolated;
- the rows' throughputs are per full wave of thread blocks: a row's and the
  op's blocks (one per 128 queries of each head and sequence) fill the GPU's
  SMs to ``fill``, so an op with few blocks (a small micro-batch at high
  tensor parallelism) runs at its share of the SMs, and a partly empty last
  block costs a whole one;
- GQA's shared key/value heads change the bytes, not the work: the rows of
  standard attention time it (the H100 and H200 sweeps' GQA shapes: 3 % mean
  error, 8 % at most);
- a GPU without rows of its kernel takes those of a GPU of the same
  architecture, scaled by the BF16 peaks' ratio (H800 and H200 from H100); with
  none, the GPU file's constant ``attention_efficiency`` times it, as before;
- a head size below the grid's smallest (64 on a Blackwell GPU whose rows are
  all 128) is carried down by the softmax's exponentials (``narrower_head``):
  each score costs its tensor-core FLOPs plus one exponential on the special
  function units, whose rate did not grow with the tensor cores (H100 3.9
  T/s against 989 TFLOP/s, FlashAttention-3, Shah et al. 2024; B200 and GB200
  5 T/s, Blackwell Ultra 10.7, NVIDIA's Blackwell Ultra figures; FlashAttention-4,
  Zadouri et al. 2026, finds the forward exponential-bound on B200), so a
  narrower head loses less work than its FLOPs; where the GPU file gives no
  ``exponentials_per_s``, the nearest head size's rate, as before.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from workloads.kernels import ATTENTION_BACKWARD_FACTOR

DATA = Path(__file__).resolve().parents[2] / "topologies" / "data" / "kernels" / "attention.csv"
KERNELS = ("flash2", "flash3", "cudnn", "triton")
# the fused kernels with an FP8 path (Transformer Engine's FP8 dot-product attention
# runs cuDNN's; FlashAttention-3 has FP8 forward and backward); FlashAttention-2,
# Triton's and unfused attention have none
FP8_KERNELS = ("cudnn", "flash3")
BLOCK_QUERIES = 128  # queries per thread block (FlashAttention-2/3 and cuDNN on Hopper)


def fill(heads: float, queries: float, sms: int) -> float:
    """Share of the SMs doing useful work over the waves that ``heads`` (batch x
    heads) x ``queries`` take in thread blocks of ``BLOCK_QUERIES`` queries: the
    last wave's idle SMs and the last block's empty rows.

    >>> fill(132, 128, 132), fill(133, 128, 132) < 0.51, fill(132, 64, 132)
    (1.0, True, 0.5)
    """
    blocks = heads * math.ceil(queries / BLOCK_QUERIES)
    return heads * queries / BLOCK_QUERIES / (math.ceil(blocks / sms) * sms)


SCORE_FLOPS = {False: 4.0, True: 4.0 * ATTENTION_BACKWARD_FACTOR}  # per score and head
# dimension: QK^T and PV forward (2 + 2), the backward's 2.5x; each score takes one
# exponential either way (forward exp(S - max), backward P recomputed from the
# log-sum-exp: FlashAttention-2, Dao 2023, Algorithms 1 and 2)


def narrower_head(head_dim: float, smallest: float, backward: bool, peak: float,
                  exponentials: float) -> float:
    """A kernel's throughput at ``head_dim`` over its rate at the grid's
    ``smallest``, when each score costs its tensor-core FLOPs at ``peak`` and one
    exponential at ``exponentials`` per second, one after the other (the
    softmax waits for QK^T, PV for the softmax):
    ``t(d) = c d / peak + 1 / exponentials`` per score (c: ``SCORE_FLOPS``), the
    rate (d / d0) t(d0) / t(d). On H100 (989 TFLOP/s, 3.9 T exp/s) it gives 0.75
    forward and 0.86 backward from 128 to 64, as cuDNN's and FlashAttention-3's
    measured rows do (0.70-0.79 and 0.82-0.86).

    >>> round(narrower_head(64, 128, False, 989e12, 3.9e12), 3)
    0.751
    >>> round(narrower_head(64, 128, True, 989e12, 3.9e12), 3)
    0.858
    """
    per_score = SCORE_FLOPS[backward] / peak

    def seconds(d: float) -> float:
        return per_score * d + 1.0 / exponentials

    return head_dim / smallest * seconds(smallest) / seconds(head_dim)


def visible(queries: int, keys: int, causal: bool) -> float:
    """Share of the queries x keys pairs a causal kernel computes: half of a
    square, or of a sliding window's band (``keys`` < ``queries``) all but the
    first window's triangle.

    >>> visible(4096, 4096, True), visible(4096, 128, True), visible(4096, 4096, False)
    (0.5, 0.984375, 1.0)
    """
    if not causal:
        return 1.0
    return 1.0 - keys / (2.0 * queries) if keys < queries else 0.5


@dataclass(frozen=True)
class Grid:
    """One (kernel, precision, pass, causal) table: throughput over head size x
    sequence, per full wave."""

    head_dims: np.ndarray  # ascending
    seqs: np.ndarray  # ascending
    tflops: np.ndarray  # (head dims, seqs); nan where not published
    source: str

    def covers(self, seq: float) -> bool:
        """Whether ``seq`` lies within the published sequences."""
        return bool(self.seqs[0] <= seq <= self.seqs[-1])

    def rate(self, head_dim: float, seq: float) -> float:
        """FLOP/s at (head_dim, seq) (outside the grid: see the module docstring)."""
        d = float(np.clip(math.log2(head_dim), *np.log2(self.head_dims[[0, -1]])))
        s = float(np.clip(math.log2(seq), *np.log2(self.seqs[[0, -1]])))
        rows = np.log2(self.head_dims)
        values = [np.interp(s, np.log2(self.seqs[~np.isnan(r)]), r[~np.isnan(r)])
                  for r in self.tflops]
        value = float(np.interp(d, rows, values)) if len(rows) > 1 else float(values[0])
        if seq < self.seqs[0]:
            value *= seq / self.seqs[0]
        return value * 1e12


@dataclass(frozen=True)
class AttentionModel:
    """The attention kernel one run uses on its GPU: its grids by (precision,
    pass, causal), the GPU's SMs, and the scale from the rows' GPU."""

    kernel: str
    gpu: str  # the GPU whose rows time it
    grids: dict
    sms: int
    scale: float = 1.0  # this GPU's BF16 peak over the rows' GPU's
    peaks: tuple[float, float] = (0.0, 0.0)  # this GPU's dense BF16 and FP8 FLOP/s
    exponentials: float = 0.0  # its special function units' exponentials per second

    def seconds(self, flops: float, shape: tuple, backward: bool, fp8: bool = False
                ) -> tuple[float, bool]:
        """Seconds an attention op of ``flops`` (the simulator's count: full
        s x keys, backward 2.5x) and ``shape`` takes, and whether an FP8 op
        found FP8 rows (else these are BF16's seconds)."""
        batch_heads, queries, keys, head_dim, causal = shape
        grid, low = self.grid(fp8, backward, bool(causal))
        rate = grid.rate(head_dim, keys) * self.narrowing(head_dim, grid, backward, low)
        work = visible(queries, keys, bool(causal))
        return flops * work / (rate * self.scale * fill(batch_heads, queries, self.sms)), low

    def grid(self, fp8: bool, backward: bool, causal: bool) -> tuple[Grid, bool]:
        """The rows for a pass: FP8's where the source has them; the mask's, or
        the other mask's where the source published one only (the work, not
        the rate, then tells them apart)."""
        name = "backward" if backward else "forward"
        for dtype in ("fp8", "bf16") if fp8 else ("bf16",):
            for mask in (causal, not causal):
                if (dtype, name, mask) in self.grids:
                    return self.grids[(dtype, name, mask)], dtype == "fp8"
        raise KeyError(f"no {name} rows for {self.kernel} on {self.gpu}")

    def narrowing(self, head_dim: float, grid: Grid, backward: bool, fp8: bool) -> float:
        """``narrower_head``'s factor for a head size below ``grid``'s (1 at or
        above it, or without the GPU's exponential rate)."""
        smallest = float(grid.head_dims[0])
        if not self.exponentials or head_dim >= smallest:
            return 1.0
        return narrower_head(head_dim, smallest, backward, self.peaks[1 if fp8 else 0],
                             self.exponentials)

    def narrowed(self, shape: tuple, backward: bool) -> bool:
        """Whether ``shape``'s head size is carried below its grid's by the
        exponentials (the summary says so)."""
        grid, low = self.grid(False, backward, bool(shape[4]))
        return self.narrowing(shape[3], grid, backward, low) != 1.0

    def extrapolated(self, shape: tuple, backward: bool) -> bool:
        """Whether ``shape``'s keys lie outside its grid's sequences."""
        grid, _ = self.grid(False, backward, bool(shape[4]))
        return not grid.covers(shape[2])

    def describe(self) -> str:
        sources = sorted({g.source for g in self.grids.values()})
        scaled = f" scaled by {self.scale:.3g}" if self.scale != 1.0 else ""
        return (f"{self.kernel} attention by shape from {self.gpu}'s rows{scaled} "
                f"({'; '.join(sources)})")


@lru_cache(maxsize=1)
def rows() -> pd.DataFrame:
    """The attention data file, its mask column as booleans (cached: read once)."""
    table = pd.read_csv(DATA, comment="#")
    table["causal"] = table["causal"].astype(str).str.lower() == "true"
    return table


def resolve(kernel: str, framework: str, gpu, fused: bool = True, fp8: bool = False) -> str:
    """The kernel ``training.attention_kernel`` names on ``gpu``: ``auto`` is the
    framework's choice. Transformer Engine (Megatron) runs cuDNN's fused
    attention on Hopper and Blackwell and FlashAttention-2 on Ampere; PyTorch's
    scaled_dot_product_attention (FSDP, TorchTitan, DeepSpeed) its
    FlashAttention-2 backend, cuDNN's on Blackwell; FP8 attention (``fp8``) is
    Transformer Engine's whatever the framework, the first of ``FP8_KERNELS``
    with rows. "" where no rows time it (the GPU file's constant efficiency
    then does); ``unfused`` without ``fused`` attention."""
    if not fused or kernel == "unfused":
        return "unfused"
    if kernel != "auto":
        return kernel
    have = available(gpu)
    arch = gpu.architecture
    wanted = next((k for k in FP8_KERNELS if k in have), "") if fp8 else ""
    wanted = wanted or ("flash2" if arch == "ampere" or (
        arch == "hopper" and framework != "megatron") else "cudnn")
    return wanted if wanted in have else (have[0] if have else "")


def available(gpu) -> list[str]:
    """Kernels with rows for ``gpu`` or a GPU of its architecture."""
    table = rows()
    names = set(table.loc[table["gpu"].isin(peers(gpu)), "kernel"])
    return [k for k in KERNELS if k in names]


def peers(gpu) -> list[str]:
    """``gpu``'s name, then the other GPUs of its architecture (rows to borrow)."""
    return _peers(gpu.name, gpu.architecture)


def _peers(name: str, architecture: str) -> list[str]:
    from topologies.gpus import GPUS

    same = sorted({g.name for g in GPUS.values() if g.architecture == architecture
                   and g.name != name and architecture})
    return [name, *same]


def model_for(gpu, kernel: str) -> AttentionModel | None:
    """The attention model of ``kernel`` on ``gpu`` (None: no rows to time it;
    cached: a sweep or a layout search builds a compute model per case)."""
    peak = gpu.peak("bf16")
    return _model_for(gpu.name, gpu.architecture, gpu.sms, peak, kernel,
                      gpu.peak_flops.get("fp8", peak), gpu.exponentials_per_s)


@lru_cache(maxsize=64)
def _model_for(name: str, architecture: str, sms: int, peak: float, kernel: str,
               fp8_peak: float = 0.0, exponentials: float = 0.0) -> AttentionModel | None:
    from topologies.gpus import GPUS

    table = rows()
    for peer in _peers(name, architecture):
        mine = table[(table["gpu"] == peer) & (table["kernel"] == kernel)]
        if mine.empty:
            continue
        grids = {key: _grid(group, sms) for key, group in
                 mine.groupby(["dtype", "pass", "causal"])}
        return AttentionModel(kernel, peer, grids, sms, peak / GPUS[peer].peak("bf16"),
                              (peak, fp8_peak), exponentials)
    return None


def throughput(gpu_name: str, kernel: str, backward: bool, causal: bool, head_dim: int,
               seq: int, batch: int, heads: int, fp8: bool = False) -> float:
    """TFLOP/s the model gives ``kernel`` on a GPU at one shape, counted as the
    sources count (forward 4 b s^2 h d, halved when causal; backward 2.5x):
    one published point per source, reproduced.

    >>> round(throughput("a100-sxm-80gb", "flash2", False, True, 128, 2048, 8, 16))
    187
    >>> round(throughput("h100-sxm-80gb", "flash3", False, True, 128, 16384, 1, 16))
    616
    >>> round(throughput("gb200-186gb", "cudnn", False, True, 128, 8192, 2, 64))
    1574
    >>> round(throughput("b200-sxm-180gb", "cudnn", False, True, 128, 8192, 1, 128, fp8=True))
    1502
    >>> round(throughput("h100-sxm-80gb", "cudnn", True, True, 128, 4096, 4, 16))  # measured
    449
    """
    from topologies.gpus import GPUS

    model = model_for(GPUS[gpu_name], kernel)
    forward = 4.0 * batch * seq * seq * heads * head_dim
    flops = forward * (ATTENTION_BACKWARD_FACTOR if backward else 1.0)
    seconds, _ = model.seconds(flops, (batch * heads, seq, seq, head_dim, int(causal)),
                               backward, fp8)
    return flops * visible(seq, seq, causal) / seconds / 1e12


def _grid(group: pd.DataFrame, sms: int) -> Grid:
    group = group.assign(full=group["tflops"] / [
        fill(b * h, s, sms) for b, h, s in zip(group["batch"], group["heads"], group["seq"],
                                               strict=True)])
    pivot = group.pivot_table(index="head_dim", columns="seq", values="full", aggfunc="mean")
    return Grid(pivot.index.to_numpy(float), pivot.columns.to_numpy(float),
                pivot.to_numpy(float), "; ".join(sorted(set(group["source"]))))
