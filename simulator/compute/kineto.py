"""A kernel table from a PyTorch profiler trace of one training step.

The file users already have: ``torch.profiler`` with CUDA activity and
``record_shapes=True``, exported with ``prof.export_chrome_trace("step.json")``
(Kineto's Chrome-trace JSON, or TensorBoard's ``.pt.trace.json.gz``). Each GPU
kernel event (``cat: kernel``) carries the ``External id`` of the operator that
launched it (``cat: cpu_op``), whose ``Input Dims`` and ``Input type`` give the
shapes. One operator call becomes one row of a kernel table
(``kernel_file.read_kernels``'s columns), its kernels' GPU times summed:

- GEMMs (``aten::mm``, ``addmm``, ``bmm``, ``baddbmm``): (m, n, k) from the
  operands, a batch folded into m;
- attention (FlashAttention / memory-efficient / cuDNN SDPA operators): forward
  or backward, 4 b h s^2 d FLOPs forward and twice that backward, as
  ``scripts/measure_kernels.py`` counts;
- memory-bound operators (layer and RMS norms, element-wise, the optimizer's
  multi-tensor kernels): the bytes of their inputs and one output-sized write,
  family ``layernorm``, ``adamw`` or ``add`` by the operator's name.

NCCL kernels are communication, not compute, and are skipped; so are kernels
whose operator is not one of the above (counted, and named in the report).
Kernel times are the GPU's own timestamps, with no host latency in them
(``calls`` 0: no launch floor to take off). Operator calls of one shape are
one row, the median time.
"""

from __future__ import annotations

import gzip
import json
import math
from collections import Counter, defaultdict
from pathlib import Path

import pandas as pd

from simulator.compute.kernel_file import CalibrationError

GEMMS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
ATTENTION = ("flash_attention", "efficient_attention", "cudnn_attention", "flash_attn")
NORMS = ("layer_norm", "rms_norm", "group_norm")
OPTIMIZERS = ("_fused_adam", "_foreach_", "multi_tensor")
ELEMENTWISE = ("aten::add", "aten::mul", "aten::sub", "aten::div", "aten::gelu", "aten::silu",
               "aten::relu", "aten::dropout", "aten::native_dropout", "aten::copy_",
               "aten::to", "aten::_to_copy", "aten::fill_", "aten::zero_", "aten::where",
               "aten::softmax", "aten::_softmax", "aten::embedding", "aten::cat",
               "aten::clone", "aten::neg", "aten::exp", "aten::pow", "aten::rsqrt",
               "aten::mean", "aten::sum", "aten::cross_entropy", "aten::nll_loss",
               "aten::_log_softmax")
DTYPES = {"c10::BFloat16": ("bf16", 2), "c10::Half": ("fp16", 2), "float": ("fp32", 4),
          "double": ("fp64", 8), "c10::Float8_e4m3fn": ("fp8", 1),
          "c10::Float8_e5m2": ("fp8", 1), "long int": ("int64", 8), "int": ("int32", 4),
          "bool": ("bool", 1)}
NCCL = ("nccl",)


def read_events(path: str | Path) -> list[dict]:
    """The trace's events (a Chrome-trace JSON object or list, gzipped or not)."""
    try:
        opener = gzip.open if str(path).endswith(".gz") else open
        with opener(path, "rt", encoding="utf-8") as file:
            data = json.load(file)
    except FileNotFoundError:
        raise CalibrationError(f"{path}: no such trace file") from None
    except (OSError, ValueError, UnicodeDecodeError) as error:
        raise CalibrationError(f"{path}: not a Chrome-trace JSON file ({error})") from None
    events = data.get("traceEvents") if isinstance(data, dict) else data
    if not isinstance(events, list):
        raise CalibrationError(f"{path}: no 'traceEvents' list (a torch.profiler trace "
                               "from prof.export_chrome_trace)")
    return [e for e in events if isinstance(e, dict)]


def _dims(op: dict) -> tuple[list, list]:
    args = op.get("args", {})
    return args.get("Input Dims") or [], args.get("Input type") or []


def gemm_shape(name: str, dims: list) -> tuple[int, int, int] | None:
    """(m, n, k) of a GEMM operator from its operands' dimensions."""
    operands = [d for d in dims if isinstance(d, list) and len(d) >= 2]
    if name in ("aten::addmm", "aten::baddbmm"):
        operands = operands[-2:]
    if len(operands) < 2:
        return None
    a, b = operands[0], operands[1]
    batch = math.prod(a[:-2]) if len(a) > 2 else 1
    m, k, n = a[-2] * batch, a[-1], b[-1]
    return (int(m), int(n), int(k)) if m > 0 and n > 0 and k > 0 else None


def classify(op: dict) -> dict | None:
    """A kernel-table row (without seconds) for an operator, or None."""
    name = str(op.get("name", ""))
    dims, types = _dims(op)
    dtype, size = DTYPES.get(types[0] if types else "", ("bf16", 2))
    if name in GEMMS:
        shape = gemm_shape(name, dims)
        if shape is None:
            return None
        m, n, k = shape
        return {"kind": "gemm", "name": name, "m": m, "n": n, "k": k, "flops": 2.0 * m * n * k,
                "bytes": float(size * (m * k + k * n + m * n)), "dtype": dtype}
    lowered = name.lower()
    if any(key in lowered for key in ATTENTION):
        q = dims[0] if dims and isinstance(dims[0], list) and len(dims[0]) == 4 else None
        backward = "backward" in lowered
        if q is None:
            return None
        b, h, s, d = q
        forward = 4.0 * b * h * s * s * d
        return {"kind": "attention", "name": "attention_backward" if backward
                else "attention_forward", "flops": forward * (2 if backward else 1),
                "bytes": 0.0, "dtype": dtype}
    family = ("layernorm" if any(key in lowered for key in NORMS) else "adamw"
              if any(key in lowered for key in OPTIMIZERS) else "add"
              if name in ELEMENTWISE or name.rstrip("_") in ELEMENTWISE else None)
    if family is None:
        return None
    sizes = [math.prod(d) for d in dims if isinstance(d, list) and d]
    if not sizes:
        return None
    moved = float(size * (sum(sizes) + max(sizes)))  # inputs read, one output written
    return {"kind": "memory", "name": family, "bytes": moved, "dtype": dtype}


def kernel_table(path: str | Path) -> tuple[pd.DataFrame, dict[str, object]]:
    """The kernel table of a trace and a report: kernels mapped per kind, NCCL
    kernels skipped, and the unmapped kernels' operators (most frequent first)."""
    events = read_events(path)
    ops = {e["args"]["External id"]: e for e in events if e.get("cat") == "cpu_op"
           and isinstance(e.get("args"), dict) and "External id" in e["args"]}
    seconds: dict[object, float] = defaultdict(float)
    mapped = {key: classify(op) for key, op in ops.items()}  # once per operator
    skipped, unmapped, kernels = 0, Counter(), 0
    for event in events:
        if str(event.get("cat", "")).lower() != "kernel" or event.get("ph") != "X":
            continue
        kernels += 1
        if str(event.get("name", "")).lower().startswith(NCCL):
            skipped += 1
            continue
        key = (event.get("args") or {}).get("External id")
        if mapped.get(key) is None:
            op = ops.get(key)
            unmapped[op.get("name", "?") if op else str(event.get("name", "?"))[:60]] += 1
            continue
        seconds[key] += float(event.get("dur", 0.0)) * 1e-6
    rows = [{**mapped[key], "seconds": total} for key, total in seconds.items() if total > 0]
    if not rows:
        raise CalibrationError(f"{path}: no GPU kernel of a GEMM, attention or memory-bound "
                               f"operator with shapes ({kernels} kernel events): profile with "
                               "CUDA activity and record_shapes=True")
    table = _median_rows(pd.DataFrame(rows))
    report = {"kernels": kernels, "nccl": skipped, "unmapped": dict(unmapped.most_common()),
              "rows": len(table), "calls": len(rows),
              "kinds": {k: int(v) for k, v in table["kind"].value_counts().items()}}
    return table, report


def _median_rows(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per distinct (kind, name, shape, FLOPs, bytes, dtype): the median
    time of its calls."""
    for column in ("m", "n", "k", "flops", "bytes"):
        if column not in frame:
            frame[column] = float("nan")
    keys = ["kind", "name", "m", "n", "k", "flops", "bytes", "dtype"]
    out = frame.groupby(keys, dropna=False, sort=True)["seconds"].median().reset_index()
    out["calls"] = 0  # the GPU's own timestamps: no launch floor
    return out[["kind", "name", "m", "n", "k", "flops", "bytes", "seconds", "calls", "dtype"]]
