"""Kernel sweeps over shapes on your own GPU: GEMMs (BF16 and FP8), the experts'
grouped GEMMs and fused attention, for checking the compute model's shape laws
(``simulator.compute.gemm``, ``simulator.compute.attention``) against a GPU.

Needs an NVIDIA GPU and PyTorch; run through ``scripts/measure_kernels.py
--sweep gemm,fp8,grouped,attention --out DIR``. Each sweep writes one CSV:

- ``gemm_sweep.csv`` and ``fp8_sweep.csv``: a kernel table (the columns of
  ``measure_kernels``), GEMMs C = A @ B over a grid of (m, n, k) including
  skinny and odd shapes; FP8 through ``torch._scaled_mm`` with per-tensor scales
  (Hopper's FP8 GEMM as Transformer Engine calls it), BF16 output;
- ``grouped_sweep.csv``: ``torch._grouped_mm`` over E experts' token counts
  (uniform, and drawn as a router would), with each expert's rows;
- ``attention_sweep.csv``: scaled-dot-product attention by backend
  (``flash``: PyTorch's FlashAttention-2; ``cudnn``: cuDNN's fused attention),
  head size, causal or not, sequence length at 16k tokens and 2,048 hidden
  (the FlashAttention papers' setting), plus GQA shapes; forward and backward
  seconds, FLOPs counted 4 b s^2 h forward (not halved for causal) and 2x that
  backward, as ``measure_kernels`` counts them.

Each kernel is timed as in ``measure_kernels.timed`` (calls back to back between
CUDA events); a shape that fails (memory, an unsupported backend) is skipped
with a line on stderr, so one failure keeps the rest.
"""

from __future__ import annotations

import csv
import itertools
import sys
from pathlib import Path

GEMM_M = (16, 128, 512, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 16384)
GEMM_N = (1024, 2560, 4096, 5760, 8192, 14336)
GEMM_K = (1024, 2880, 4096, 8192)
FP8_M = (128, 1024, 2048, 4096, 8192, 16384)
EXPERTS = (8, 16, 32, 64, 128)
TOKENS_PER_EXPERT = (64, 256, 512, 1024, 2048, 4096)
EXPERT_SHAPES = {"qwen3-30b_fc1": (1536, 2048), "qwen3-30b_fc2": (2048, 768),
                 "gpt-oss_fc1": (5760, 2880), "gpt-oss_fc2": (2880, 2880),
                 "deepseek_fc1": (4096, 7168), "mixtral_fc1": (28672, 4096)}
MAX_GROUPED_TOKENS = 65536
MAX_GROUPED_WEIGHTS = 2**31  # elements of one sweep's expert weights (4 GiB in BF16)
ATTENTION_TOKENS, ATTENTION_HIDDEN = 16384, 2048
ATTENTION_SEQ = (512, 1024, 2048, 4096, 8192, 16384)
HEAD_DIMS = (64, 128, 256)
GQA = ((1, 4096, 64, 8, 128), (2, 4096, 32, 8, 128), (1, 8192, 64, 8, 128),
       (1, 8192, 32, 8, 128), (4, 2048, 32, 8, 128), (1, 16384, 64, 8, 128),
       (1, 4096, 64, 4, 64), (1, 8192, 40, 8, 128))  # (batch, seq, heads, kv heads, dim)


def skipped(what: str, error: Exception) -> None:
    print(f"skipped {what}: {type(error).__name__}: {str(error)[:200]}", file=sys.stderr)


def gemm_rows(timed, warmup: int, repeat: int) -> list[dict]:
    import torch

    rows = []
    for m, n, k in itertools.product(GEMM_M, GEMM_N, GEMM_K):
        try:
            a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
            seconds = timed(lambda a=a, b=b: a @ b, warmup, repeat)
        except Exception as error:  # noqa: BLE001 - keep the other shapes
            skipped(f"gemm {m}x{n}x{k}", error)
            continue
        rows.append({"kind": "gemm", "name": "sweep", "m": m, "n": n, "k": k,
                     "flops": 2 * m * n * k, "bytes": 2 * (m * k + k * n + m * n),
                     "seconds": seconds, "dtype": "bf16"})
    return rows


def fp8_rows(timed, warmup: int, repeat: int) -> list[dict]:
    import torch

    rows = []
    one = torch.ones((), device="cuda", dtype=torch.float32)
    for m, n, k in itertools.product(FP8_M, GEMM_N, GEMM_K):
        try:
            a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
            seconds = timed(lambda a=a, b=b: torch._scaled_mm(
                a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16), warmup, repeat)
        except Exception as error:  # noqa: BLE001
            skipped(f"fp8 gemm {m}x{n}x{k}", error)
            continue
        rows.append({"kind": "gemm", "name": "fp8_sweep", "m": m, "n": n, "k": k,
                     "flops": 2 * m * n * k, "bytes": m * k + k * n + 2 * m * n,
                     "seconds": seconds, "dtype": "fp8"})
    return rows


def expert_counts(experts: int, per_expert: int, skew: str, generator) -> list[int]:
    """Token counts per expert: all equal, or drawn as top-1 routing with a
    Zipf-like popularity (``skew``: uniform | drawn)."""
    import torch

    total = experts * per_expert
    if skew == "uniform":
        return [per_expert] * experts
    weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 0.5
    draw = torch.multinomial(weights / weights.sum(), total, replacement=True,
                             generator=generator)
    return torch.bincount(draw, minlength=experts).tolist()


def grouped_rows(timed, warmup: int, repeat: int) -> list[dict]:
    import torch

    rows = []
    generator = torch.Generator().manual_seed(0)
    for (name, (n, k)), experts in itertools.product(EXPERT_SHAPES.items(), EXPERTS):
        if experts * n * k > MAX_GROUPED_WEIGHTS:
            continue
        b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        for per_expert, skew in itertools.product(TOKENS_PER_EXPERT, ("uniform", "drawn")):
            if experts * per_expert > MAX_GROUPED_TOKENS:
                continue
            counts = expert_counts(experts, per_expert, skew, generator)
            try:
                a = torch.randn(sum(counts), k, device="cuda", dtype=torch.bfloat16)
                offs = torch.tensor(counts, device="cuda").cumsum(0).to(torch.int32)
                seconds = timed(lambda a=a, b=b, offs=offs: torch._grouped_mm(a, b, offs=offs),
                                warmup, repeat)
            except Exception as error:  # noqa: BLE001
                skipped(f"grouped {name} {experts}x{per_expert}", error)
                continue
            rows.append({"name": name, "experts": experts, "per_expert": per_expert,
                         "skew": skew, "n": n, "k": k, "counts": " ".join(map(str, counts)),
                         "flops": 2 * sum(counts) * n * k, "seconds": seconds})
        del b
    return rows


def attention_shapes() -> list[tuple[int, int, int, int, int, bool]]:
    """(batch, seq, heads, kv heads, head dim, causal) of the sweep."""
    shapes = [(ATTENTION_TOKENS // s, s, ATTENTION_HIDDEN // d, ATTENTION_HIDDEN // d, d, c)
              for d, c, s in itertools.product(HEAD_DIMS, (False, True), ATTENTION_SEQ)]
    return shapes + [(*g, True) for g in GQA]


def attention_rows(timed, warmup: int, repeat: int) -> list[dict]:
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    rows = []
    for backend, (b, s, heads, kv, d, causal) in itertools.product(backends,
                                                                   attention_shapes()):
        try:
            q = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16,
                            requires_grad=True)
            key, value = (torch.randn(b, kv, s, d, device="cuda", dtype=torch.bfloat16,
                                      requires_grad=True) for _ in range(2))
            with sdpa_kernel(backends[backend]):
                def forward(q=q, key=key, value=value, causal=causal, gqa=kv != heads):
                    return F.scaled_dot_product_attention(q, key, value, is_causal=causal,
                                                          enable_gqa=gqa)
                fwd = timed(forward, warmup, repeat)
                out = forward()
                grad = torch.randn_like(out)
                bwd = timed(lambda out=out, grad=grad, q=q, key=key, value=value:
                            torch.autograd.grad(out, (q, key, value), grad, retain_graph=True),
                            warmup, repeat)
        except Exception as error:  # noqa: BLE001
            skipped(f"attention {backend} {b}x{s} h{heads}/{kv} d{d} causal={causal}", error)
            continue
        flops = 4 * b * s * s * heads * d
        rows.append({"backend": backend, "batch": b, "seq": s, "heads": heads,
                     "kv_heads": kv, "head_dim": d, "causal": causal,
                     "forward_flops": flops, "forward_s": fwd, "backward_s": bwd})
    return rows


SWEEPS = {"gemm": ("gemm_sweep.csv", gemm_rows), "fp8": ("fp8_sweep.csv", fp8_rows),
          "grouped": ("grouped_sweep.csv", grouped_rows),
          "attention": ("attention_sweep.csv", attention_rows)}


def run(names: list[str], out: Path, timed, warmup: int, repeat: int) -> None:
    """Run the named sweeps, each into its CSV under ``out``."""
    import torch

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        filename, sweep = SWEEPS[name]
        rows = sweep(timed, warmup, repeat)
        if not rows:
            print(f"{name}: no rows", file=sys.stderr)
            continue
        columns = list(dict.fromkeys(c for row in rows for c in row))
        if "seconds" in columns and "kind" in columns:
            columns += ["calls"]
            rows = [row | {"calls": 10} for row in rows]
        with open(out / filename, "w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=columns)
            writer.writeheader()
            writer.writerows(rows)
        print(f"{name}: {len(rows)} rows on {torch.cuda.get_device_name()} -> "
              f"{out / filename}", flush=True)
