"""Shape-aware kernel times: a measured kernel table, interpolated over shapes.

One efficiency curve cannot follow what cuBLAS and FlashAttention do with
shapes (tile quantisation, wave counts, split-K): the H100 tables in the
reference data sit 15-25 % off the roofline, by different amounts for
different shapes. So where a table measured with ``scripts/measure_kernels.py``
is at hand, a kernel's time is the roofline's time times a correction taken
from the table's rows near its shape:

    t(op) = t_roofline(op) * c(op),   c_i = t_measured(row i) / t_roofline(row i)

``log c`` is interpolated by Shepard's inverse-distance weighting (Shepard 1968)
over the ``dims + 1`` nearest rows of the op's family, in log-shape space, with
the roofline itself as one more point (correction 1) at distance ``RADIUS``:
at a measured shape the table's time, between measured shapes a blend, and far
from every row the roofline, which stays the fallback. Families and their
coordinates (natural logs):

- ``gemm``: (m, n, k). A backward GEMM is two GEMMs of half its FLOPs, the
  input gradient (m, k, n) and the weight gradient (k, n, m): their mean.
- ``attention forward`` / ``attention backward``: the forward-equivalent FLOPs
  4 b s^2 h (a backward row counts twice that, as ``measure_kernels`` writes
  it; the simulator counts ``ATTENTION_BACKWARD_FACTOR`` times). Attention is
  placed by its FLOPs only: two shapes of equal FLOPs get one rate.
- memory kernels by family (``add``, ``layernorm``, ``adamw``: the row's name
  without its size): bytes moved. The simulator's norms read the ``layernorm``
  rows, its optimizer step the ``adamw`` rows, every other element-wise kernel
  the ``add`` rows; a family the table lacks reads all memory rows.

Tables timed one call at a time (no ``calls`` column, or ``calls`` 1) carry
the host's launch latency in every row (``kernel_file.launch_floor``), which
is taken off first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.base.ir import ATTENTIONS, GEMMS, KernelClass, Op, OpKind, Phase
from simulator.compute.kernel_file import read_kernels, without_launch_floor
from workloads.kernels import ATTENTION_BACKWARD_FACTOR

# A row speaks for shapes within a factor of 2 of its own in every dimension:
# there it weighs as much as the roofline (in units of ln 2 per dimension).
RADIUS_FACTOR = 2.0
MEASURED_BACKWARD_FACTOR = 2.0  # measure_kernels' attention backward rows: 2x forward FLOPs
NORMS = ("ln", "final_ln", "layernorm", "norm")  # kernel-name prefixes of layer norms
OPTIMIZERS = ("optimizer", "adam")  # kernel-name prefixes of optimizer steps


@dataclass(frozen=True)
class Family:
    """Rows of one kind of kernel: log coordinates and log corrections."""

    points: np.ndarray  # (rows, dims)
    log_corrections: np.ndarray  # (rows,)

    def log_correction(self, query: np.ndarray) -> float:
        """Shepard's interpolation of log c at ``query``, the roofline as a prior."""
        dims = self.points.shape[1]
        d2 = ((self.points - query) ** 2).sum(axis=1)
        exact = d2 < 1e-18
        if exact.any():
            return float(self.log_corrections[exact].mean())
        nearest = np.argsort(d2, kind="stable")[: dims + 1]
        weights = 1.0 / d2[nearest]
        prior = 1.0 / (dims * math.log(RADIUS_FACTOR) ** 2)
        return float((weights * self.log_corrections[nearest]).sum() / (weights.sum() + prior))


def memory_family(name: str) -> str:
    """The table family that times a simulator element-wise kernel ``name``."""
    name = name.lower()
    if name.startswith(NORMS):
        return "layernorm"
    return "adamw" if name.startswith(OPTIMIZERS) else "add"


def row_family(kind: str, name: str) -> str:
    """The family of a table row: gemm, attention forward/backward, or a memory
    family named by the row's name without its trailing size."""
    if kind == "gemm":
        return "gemm"
    if kind == "attention":
        return "attention backward" if "backward" in name.lower() else "attention forward"
    return name.lower().rstrip("0123456789_") or "memory"


@dataclass(frozen=True)
class KernelTable:
    """Measured kernel times, ready to correct a roofline (``log_correction``)."""

    families: dict[str, Family]
    source: str
    rows: int = 0
    launch_floor: float = 0.0  # seconds taken off each one-call row

    def describe(self) -> str:
        floor = f", launch floor {self.launch_floor * 1e6:.1f} us off" if self.launch_floor else ""
        return f"{Path(self.source).name} ({self.rows} rows{floor})"

    @classmethod
    def build(cls, table: pd.DataFrame, roofline, source: str,
              launch_floor: float = 0.0) -> KernelTable:
        """Corrections of ``table``'s rows (``kernel_file.read_kernels``, launch
        floor removed) against ``roofline`` (a ``ComputeModel`` without table)."""
        groups: dict[str, tuple[list, list]] = {}
        for row in table.to_dict("records"):
            op, point = row_op(row)
            family = row_family(row["kind"], str(row.get("name", "")))
            keys = [family] + (["memory"] if row["kind"] == "memory" else [])
            for key in keys:
                points, logs = groups.setdefault(key, ([], []))
                points.append(point)
                logs.append(math.log(row["seconds"] / roofline.duration(op)))
        return cls({k: Family(np.array(p, float), np.array(c, float))
                    for k, (p, c) in groups.items()}, source, len(table), launch_floor)

    def log_correction(self, op: Op) -> float:
        """log c for ``op`` (0: the roofline) from the rows of its family; a
        low-precision GEMM or FP8 attention takes BF16's correction at its shape
        (the compute model scales their efficiency relative to BF16's); grouped
        GEMMs (experts) keep the compute model's time."""
        if op.kernel in GEMMS and op.shape is not None:
            family = self.families.get("gemm")
            if family is None or len(op.shape) > 3:  # a grouped GEMM: no rows of its kind
                return 0.0
            m, n, k = op.shape
            if op.phase is Phase.BACKWARD:  # input and weight gradients
                return 0.5 * (family.log_correction(_logs(m, k, n))
                              + family.log_correction(_logs(k, n, m)))
            return family.log_correction(_logs(m, n, k))
        if op.kernel in ATTENTIONS:
            backward = op.phase is Phase.BACKWARD
            family = self.families.get("attention backward" if backward else "attention forward")
            forward_flops = op.flops / (ATTENTION_BACKWARD_FACTOR if backward else 1.0)
            return 0.0 if family is None or forward_flops <= 0 else family.log_correction(
                _logs(forward_flops))
        family = self.families.get(memory_family(op.name), self.families.get("memory"))
        return 0.0 if family is None or op.bytes <= 0 else family.log_correction(_logs(op.bytes))


def _logs(*values: float) -> np.ndarray:
    return np.log(np.array(values, dtype=float))


def row_op(row: dict) -> tuple[Op, np.ndarray]:
    """The simulator op a table row times, and the row's coordinates."""
    kind = row["kind"]
    if kind == "gemm":
        shape = (int(row["m"]), int(row["n"]), int(row["k"]))
        op = Op(OpKind.COMPUTE, "gemm", "compute", Phase.FORWARD, kernel=KernelClass.GEMM,
                flops=float(row["flops"]), bytes=float(row["bytes"]), shape=shape)
        return op, _logs(*shape)
    if kind == "attention":
        backward = "backward" in str(row.get("name", "")).lower()
        forward = float(row["flops"]) / (MEASURED_BACKWARD_FACTOR if backward else 1.0)
        flops = forward * (ATTENTION_BACKWARD_FACTOR if backward else 1.0)
        op = Op(OpKind.COMPUTE, "attention", "compute",
                Phase.BACKWARD if backward else Phase.FORWARD, kernel=KernelClass.ATTENTION,
                flops=flops, bytes=float(row["bytes"]))
        return op, _logs(forward)
    op = Op(OpKind.COMPUTE, str(row.get("name", "memory")), "compute", Phase.FORWARD,
            kernel=KernelClass.ELEMENTWISE, bytes=float(row["bytes"]))
    return op, _logs(float(row["bytes"]))


@lru_cache(maxsize=32)
def read_table(path: str) -> pd.DataFrame:
    """A kernel table file, checked (``kernel_file.read_kernels``; cached: a
    sweep builds one compute model per case)."""
    return read_kernels(Path(path))


def for_gpu(path: str, gpu, precision: str, roofline) -> KernelTable | None:
    """The table at ``path`` ready for ``roofline`` (the GPU's model at
    ``precision``), its launch floor off; None where the table was measured at
    a precision whose peak differs (an fp8 run keeps the roofline)."""
    rows = read_table(path)
    rows = rows[[gpu.peak_flops.get(d) == gpu.peak(precision) for d in rows["dtype"]]]
    if rows.empty:
        return None
    rows, floor = without_launch_floor(rows, gpu, precision)
    return KernelTable.build(rows, roofline, path, floor)


def leave_one_out(rows: pd.DataFrame, roofline) -> np.ndarray:
    """Each row's time as a table of the other rows predicts it, over its
    measured time, minus 1: how well the table times shapes it has not seen.
    Rows at the same coordinates as the one left out (a shape measured twice)
    leave with it."""
    coordinates = [(row_family(r["kind"], str(r.get("name", ""))), tuple(row_op(r)[1].round(9)))
                   for r in rows.to_dict("records")]
    out = []
    for i, row in enumerate(rows.to_dict("records")):
        kept = [j for j, c in enumerate(coordinates) if c != coordinates[i]]
        op = row_op(row)[0]
        table = KernelTable.build(rows.iloc[kept], roofline, "")
        out.append(roofline.duration(op) * math.exp(table.log_correction(op)) / row["seconds"]
                   - 1.0)
    return np.array(out)
