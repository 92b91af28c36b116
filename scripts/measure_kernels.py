"""Measure the kernel table ``clustersim calibrate`` fits, on your own GPU.

Needs an NVIDIA GPU and PyTorch (``pip install torch``); clustersim itself does
not. For a model (a clustersim preset) and its tensor-parallel cut it times:

- the layer's GEMMs in the shapes the simulator uses (QKV, projection, MLP up
  and down, the logits), forward, plus square GEMMs from 1024 to 8192 so the
  size curve is pinned down;
- fused attention (``torch.nn.functional.scaled_dot_product_attention``, which
  runs FlashAttention on recent GPUs), forward and backward, counted as
  4 b s^2 h forward and twice that backward;
- memory-bound kernels: layer norm, an element-wise add, and a fused AdamW
  step over a tensor of each of several sizes.

Each kernel runs ``--warmup`` times, then ``--repeat`` timings of ten calls
enqueued back to back between CUDA events (so the host's launch latency is
hidden, as in training, where the host runs ahead of the GPU); the table has
one row per kernel with the median time per call:

    python scripts/measure_kernels.py --model gpt3-6.7b --tp 2 --seq 2048 --out kernels.csv
    clustersim calibrate kernels.csv --gpu h100-sxm-80gb --out h100.calibration.yaml
    python scripts/measure_kernels.py --sweep gemm,attention --out sweeps/  # shape sweeps
    # or, shape-aware, in a scenario:  cluster: {kernel_table: kernels.csv}

Columns: kind (gemm | attention | memory), name, m, n, k, flops, bytes, seconds,
calls (calls per timing: 10) and dtype. The table works two ways: fitted
(above), or as it is, interpolated over shapes (``cluster.kernel_table:
kernels.csv``; ``topologies/data/kernels/README.md``).
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from workloads.kernels import Shard, layer_kernels  # noqa: E402
from workloads.models import MODELS  # noqa: E402

COLUMNS = ("kind", "name", "m", "n", "k", "flops", "bytes", "seconds", "calls", "dtype")
SQUARES = (1024, 2048, 4096, 6144, 8192)
MEMORY_ELEMENTS = (2**22, 2**24, 2**26, 2**28)


def gemm_shapes(model: str, tp: int, seq: int, micro_batch: int) -> list[tuple[str, int, int,
                                                                               int]]:
    """(name, m, n, k) of the layer's GEMMs as the simulator plans them, the logits
    GEMM, and square GEMMs across sizes."""
    spec = MODELS[model]
    shard = Shard(micro_batch, seq, 2, tp)
    shapes = [(k.name, k.shape[0] // max(len(k.shape) - 3, 1), *k.shape[1:3])  # grouped:
              for k in layer_kernels(spec, shard) if k.shape and k.cls.value == "gemm"]  # one
    shapes.append(("logits", micro_batch * seq, spec.vocab // tp, spec.hidden))
    shapes += [(f"square{n}", n, n, n) for n in SQUARES]
    return shapes


CALLS = 10  # calls enqueued back to back between the events of one timing


def timed(run: Callable[[], object], warmup: int, repeat: int, calls: int = CALLS) -> float:
    """Median seconds of one call of ``run`` on the current CUDA stream, timed
    over ``calls`` calls enqueued back to back: the GPU's time per kernel. (Timing
    one call between two events adds the host's latency to launch it, since the
    GPU idles from the first event until the kernel arrives: tables measured that
    way, as the two in ``shared/reference/h100`` were, carry 25-35 us per row,
    which ``clustersim calibrate`` then fits as a kernel overhead.)"""
    import torch

    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / calls)
    return statistics.median(times)


def measure_gemms(args, dtype) -> list[dict]:
    import torch

    rows = []
    for name, m, n, k in gemm_shapes(args.model, args.tp, args.seq, args.micro_batch):
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(k, n, device="cuda", dtype=dtype)
        seconds = timed(lambda a=a, b=b: a @ b, args.warmup, args.repeat)
        rows.append({"kind": "gemm", "name": name, "m": m, "n": n, "k": k,
                     "flops": 2 * m * n * k, "bytes": 2 * (m * k + k * n + m * n),
                     "seconds": seconds})
    return rows


def measure_attention(args, dtype) -> list[dict]:
    import torch
    import torch.nn.functional as F  # noqa: N812

    spec = MODELS[args.model]
    heads, dim = spec.heads // args.tp, spec.head_dim
    shape = (args.micro_batch, heads, args.seq, dim)
    q, k, v = (torch.randn(shape, device="cuda", dtype=dtype, requires_grad=True)
               for _ in range(3))
    forward_flops = 4 * args.micro_batch * args.seq**2 * heads * dim
    rows = [{"kind": "attention", "name": "attention_forward", "flops": forward_flops,
             "seconds": timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                              args.warmup, args.repeat)}]
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    grad = torch.randn_like(out)
    backward = timed(lambda: torch.autograd.grad(out, (q, k, v), grad, retain_graph=True),
                     args.warmup, args.repeat)
    rows.append({"kind": "attention", "name": "attention_backward",
                 "flops": 2 * forward_flops, "seconds": backward})
    return rows


def measure_memory(args, dtype) -> list[dict]:
    import torch

    rows = []
    for elements in MEMORY_ELEMENTS:
        x = torch.randn(elements // 4096, 4096, device="cuda", dtype=dtype)
        y = torch.randn_like(x)
        norm = torch.nn.LayerNorm(4096, device="cuda", dtype=dtype)
        size = elements * x.element_size()
        rows.append({"kind": "memory", "name": f"add{elements}", "bytes": 3 * size,
                     "seconds": timed(lambda x=x, y=y: x + y, args.warmup, args.repeat)})
        rows.append({"kind": "memory", "name": f"layernorm{elements}", "bytes": 2 * size,
                     "seconds": timed(lambda x=x, norm=norm: norm(x), args.warmup,
                                      args.repeat)})
        param = torch.nn.Parameter(torch.randn(elements, device="cuda", dtype=torch.float32))
        param.grad = torch.randn_like(param)
        optimizer = torch.optim.AdamW([param], fused=True)
        # fp32 master weights, gradient and two moments: read 4 and write 3 tensors
        rows.append({"kind": "memory", "name": f"adamw{elements}", "bytes": 7 * 4 * elements,
                     "seconds": timed(optimizer.step, args.warmup, args.repeat)})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="gpt3-6.7b", choices=sorted(MODELS))
    parser.add_argument("--tp", type=int, default=1)
    parser.add_argument("--seq", type=int, default=2048)
    parser.add_argument("--micro-batch", type=int, default=1)
    parser.add_argument("--dtype", default="bf16", choices=("bf16", "fp16"))
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--out", default="kernels.csv",
                        help="the table's CSV file (with --sweep: a folder for the sweeps)")
    parser.add_argument("--sweep", default="",
                        help="comma-separated sweeps instead of the model's table: "
                             "gemm, fp8, grouped, attention (scripts/kernel_sweeps.py)")
    args = parser.parse_args()
    try:
        import torch
    except ImportError:
        sys.exit("measure_kernels.py needs PyTorch with CUDA: pip install torch")
    if not torch.cuda.is_available():
        sys.exit("measure_kernels.py needs an NVIDIA GPU (torch.cuda.is_available() is False)")
    if args.sweep:
        import kernel_sweeps

        kernel_sweeps.run(args.sweep.split(","), Path(args.out), timed, args.warmup,
                          args.repeat)
        return
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    rows = measure_gemms(args, dtype) + measure_attention(args, dtype) + measure_memory(
        args, dtype)
    with open(args.out, "w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=COLUMNS)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: row.get(c, "") for c in COLUMNS} | {"calls": CALLS,
                                                                     "dtype": args.dtype})
    print(f"{len(rows)} kernels on {torch.cuda.get_device_name()} -> {args.out}")


if __name__ == "__main__":
    main()
