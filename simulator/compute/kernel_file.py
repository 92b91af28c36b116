"""A kernel table file: reading and checking it, and its launch floor.

A kernel table (CSV, one row per kernel shape; ``scripts/measure_kernels.py``
writes one on a GPU with PyTorch; the columns: ``compute.calibration``) is read
here for both its users: the compute model's table (``compute.table``, which
corrects the roofline by it) and the fit (``compute.calibration``). Checked
on reading: known kinds, the columns each kind needs, positive times; a
table timed one call at a time carries the host's launch latency in every row
(``launch_floor``), which both take off first.
"""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.base.fields import ScenarioError
from simulator.base.ir import KernelClass
from simulator.base.user_files import read_text
from topologies.gpus import GpuSpec

KINDS = {"gemm": KernelClass.GEMM, "attention": KernelClass.ATTENTION,
         "memory": KernelClass.ELEMENTWISE}
REQUIRED = {"gemm": ("m", "n", "k"), "attention": ("flops",), "memory": ("bytes",)}


class CalibrationError(ValueError):
    """A kernel table or calibration that cannot be used, with the row and column."""


def read_kernels(path: str | Path) -> pd.DataFrame:
    """A kernel table file (or open text stream), checked (``checked``)."""
    return checked(_read_csv(path), path)


def checked(table: pd.DataFrame, path: object) -> pd.DataFrame:
    """A kernel table as written (``path`` names it in errors), checked: known
    kinds, the columns each kind needs, positive times. GEMM flops default to
    2mnk and bytes to bf16 operands."""
    for column in ("kind", "seconds"):
        if column not in table.columns:
            raise CalibrationError(f"{path}: no {column!r} column (columns: kind, name, m, n, "
                                   "k, flops, bytes, seconds)")
    if table.empty:
        raise CalibrationError(f"{path}: the kernel table has no rows")
    written, table = table, table.copy()
    for column in ("m", "n", "k", "flops", "bytes", "seconds", "calls"):
        table[column] = pd.to_numeric(table.get(column), errors="coerce")
    _check_rows(path, table, written)
    table["kind"] = table["kind"].str.strip().str.lower()
    gemm = table["kind"] == "gemm"
    mnk = table["m"] * table["n"] * table["k"]
    table.loc[gemm & table["flops"].isna(), "flops"] = 2.0 * mnk
    table.loc[gemm & table["bytes"].isna(), "bytes"] = 2.0 * (
        table["m"] * table["k"] + table["k"] * table["n"] + table["m"] * table["n"])
    table["dtype"] = (table["dtype"].fillna("bf16").astype(str).str.strip().str.lower()
                      if "dtype" in table else "bf16")
    return table.fillna({"flops": 0.0, "bytes": 0.0, "calls": 1})


def launch_floor(table: pd.DataFrame, gpu: GpuSpec, precision: str = "bf16") -> float:
    """Seconds of host launch latency every row of ``table`` carries.

    Timing one call between two CUDA events counts the GPU's wait for the host
    to launch the kernel (PyTorch dispatch and the driver: 10-35 us, which the
    kernels' own times cannot show). The floor is the largest constant that
    leaves every row at or above its physical lower bound max(flops / peak,
    bytes / HBM bandwidth): an upper bound on the latency all rows share, from
    the table itself. 0 for tables timed back to back (``calls`` > 1) or by
    the GPU's own timestamps (``calls`` 0)."""
    single = table[table["calls"] == 1]
    if single.empty:
        return 0.0
    bound = np.maximum(single["flops"] / gpu.peak(precision), single["bytes"] / gpu.hbm_bandwidth)
    return max(0.0, float((single["seconds"] - bound).min()))


def without_launch_floor(table: pd.DataFrame, gpu: GpuSpec,
                         precision: str = "bf16") -> tuple[pd.DataFrame, float]:
    """``table`` with the launch floor taken off its one-call rows, and the floor."""
    floor = launch_floor(table, gpu, precision)
    if floor == 0.0:
        return table, 0.0
    out = table.copy()
    out.loc[out["calls"] == 1, "seconds"] -= floor
    return out, floor


def _read_csv(path: str | Path) -> pd.DataFrame:
    """The CSV as written (a UTF-8 file or an open text stream, each column named
    once), or a CalibrationError."""
    try:
        text = path.read() if hasattr(path, "read") else read_text(path, "kernel table")
        table = pd.read_csv(io.StringIO(text))
    except ScenarioError as error:
        raise CalibrationError(str(error)) from None
    except ValueError as error:
        raise CalibrationError(f"{path}: cannot read the kernel table ({error})") from None
    header = [name.strip() for name in text.splitlines()[0].split(",")]
    twice = sorted({name for name in header if header.count(name) > 1})
    if twice:
        raise CalibrationError(f"{path}: the column {twice[0]!r} is given twice")
    return table


def _check_rows(path: str | Path, table: pd.DataFrame, written: pd.DataFrame) -> None:
    """Each row: a known kind, its required columns positive and finite, the
    optional ones finite (``written``: the cells as written, for the errors)."""
    for row, record in enumerate(table.to_dict("records"), start=2):  # line in the file
        kind = str(record["kind"]).strip().lower()
        if kind not in KINDS:
            raise CalibrationError(f"{path}: line {row}: kind {record['kind']!r} is not one of "
                                   + ", ".join(KINDS))
        for column in (*REQUIRED[kind], "seconds"):
            if not (record[column] > 0 and np.isfinite(record[column])):
                given = (_cell(written.at[row - 2, column]) if column in written.columns
                         else "(no such column)")
                raise CalibrationError(f"{path}: line {row}: {column} {given} must be a "
                                       f"positive number in a {kind} row")
        calls = record["calls"]
        if "calls" in written.columns and written.at[row - 2, "calls"] == written.at[
                row - 2, "calls"] and not (calls >= 0 and np.isfinite(calls)):
            raise CalibrationError(f"{path}: line {row}: calls "
                                   f"{_cell(written.at[row - 2, 'calls'])} must be a whole "
                                   "number >= 0 (calls timed back to back; 0: GPU timestamps)")
        for column in ("flops", "bytes"):  # optional where not required: finite if given
            if record[column] == record[column] and not np.isfinite(record[column]):
                raise CalibrationError(f"{path}: line {row}: {column} "
                                       f"{_cell(written.at[row - 2, column])} is not finite")


def _cell(value: object) -> str:
    """A cell as the user wrote it: text quoted, numbers plain (not numpy's repr)."""
    return repr(value.item() if hasattr(value, "item") else value)
