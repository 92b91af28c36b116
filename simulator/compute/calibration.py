"""Fit the compute model's efficiencies to measured kernel times.

A kernel table (CSV, one row per kernel shape; ``scripts/measure_kernels.py``
writes one on a GPU with PyTorch) has the columns

    kind      gemm | attention | memory (layer norm, element-wise, optimizer step)
    name      free text
    m, n, k   GEMM dimensions (gemm rows; flops default to 2mnk)
    flops     FLOPs per call (attention rows; optional for gemm)
    bytes     HBM bytes per call (memory rows)
    seconds   measured time per call
    calls     calls timed back to back per timing (optional; missing or 1: one
              call at a time, so every row carries the host's launch latency;
              0: the GPU's own kernel timestamps, from a profiler trace)
    dtype     precision the kernels ran in (optional; bf16 by default)

and the fit follows the roofline of ``simulator.compute.model``, one kind at a time,
each a linear least-squares problem:

- memory rows: ``seconds = bytes / (hbm * memory_efficiency) + kernel_overhead``
  (slope and intercept; with one row the overhead is the GPU file's and only
  the slope is fitted; the overhead is at most the smallest time any row spent
  beyond its physical bound max(flops / peak, bytes / HBM), since every kernel
  pays it);
- gemm rows: the achieved fraction ``a = flops / (peak * (seconds - overhead))``
  follows ``eff(x) = E x / (x + h)`` in the geometric-mean dimension x, so
  ``a (1/E + (h/E) (1/x)) = 1``, linear in 1/E and h/E, solved in least squares
  (each row's residual is its relative time error) (E at most 1: where the
  fit would pass the peak, E is 1 and h alone is fitted);
- attention rows: the median achieved fraction, of the FLOPs the simulator
  counts for the kernel (a backward row's 2x forward FLOPs, as
  ``measure_kernels`` writes them, become ``ATTENTION_BACKWARD_FACTOR`` x:
  ``compute.table.row_op``, the one mapping of a row to a kernel).

Kinds with no rows keep the GPU file's figures. A table timed one call at a
time first loses its launch floor (``kernel_file.launch_floor``; the table is read
and checked by ``kernel_file.read_kernels``). The result is a calibration
(``topologies.gpus.CALIBRATION_FIELDS``) plus a report of every row's modelled
against measured time.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from simulator.compute.kernel_file import CalibrationError
from simulator.compute.model import ComputeModel
from simulator.compute.table import row_op
from topologies.gpus import CALIBRATION_FIELDS, MIN_EFFICIENCY, GpuSpec, calibrated


def _fit_memory(rows: pd.DataFrame, gpu: GpuSpec, cap: float) -> tuple[float, float]:
    """(memory_efficiency, kernel_overhead) from memory-bound rows; the overhead
    at most ``cap`` (no kernel of the table can have spent less)."""
    if rows.empty:
        return gpu.memory_efficiency, min(gpu.kernel_overhead, cap)
    x, y = rows["bytes"].to_numpy(float), rows["seconds"].to_numpy(float)
    if len(rows) >= 2 and np.ptp(x) > 0:
        slope, intercept = np.polyfit(x, y, 1)
        if 0 <= intercept <= cap and slope > 0:
            return 1.0 / (slope * gpu.hbm_bandwidth), float(intercept)
    overhead = min(gpu.kernel_overhead, cap) if len(rows) < 2 or np.ptp(x) == 0 else min(
        max(intercept, 0.0), cap)
    slope = float(np.sum(x * (y - overhead)) / np.sum(x * x))
    return 1.0 / (slope * gpu.hbm_bandwidth), overhead


CURVE_HALF_DIM = 900.0  # the size curve's H100 figure (before the tile model): the
# curve's shape where a table's GEMMs cannot fit it and the GPU file has none


def _fit_gemm(rows: pd.DataFrame, peak: float, overhead: float,
              gpu: GpuSpec) -> tuple[float, float]:
    """(gemm_efficiency, gemm_half_dim) of the size curve from GEMM rows (a
    calibration fits the curve: it replaces the tile model)."""
    if rows.empty:
        return gpu.gemm_efficiency, gpu.gemm_half_dim or CURVE_HALF_DIM
    x = (rows["m"] * rows["n"] * rows["k"]).to_numpy(float) ** (1.0 / 3.0)
    achieved = rows["flops"].to_numpy(float) / (peak * (rows["seconds"].to_numpy(float)
                                                        - overhead))
    if len(np.unique(x)) >= 2:  # least squares in relative time: a (1/E + (h/E)/x) = 1
        terms = np.column_stack([achieved, achieved / x])
        (inverse, slope), *_ = np.linalg.lstsq(terms, np.ones_like(x), rcond=None)
        if inverse >= 1 and slope >= 0:
            return 1.0 / inverse, slope / inverse
        if inverse < 1:  # the curve would pass the peak: hold E at 1, fit h alone
            slope = float(np.sum((1 - achieved) * achieved / x) / np.sum((achieved / x) ** 2))
            return 1.0, max(slope, 0.0)
    half = gpu.gemm_half_dim or CURVE_HALF_DIM  # one size: keep the curve's shape, fit
    # its height
    return float(np.median(achieved * (x + half) / x)), half


def fit(table: pd.DataFrame, gpu: GpuSpec, precision: str = "bf16") -> dict[str, float]:
    """The calibration (``CALIBRATION_FIELDS``) that best explains ``table``."""
    peak = gpu.peak(precision)
    cap = float((table["seconds"] - np.maximum(table["flops"] / peak,
                                               table["bytes"] / gpu.hbm_bandwidth)).min())
    memory_efficiency, overhead = _fit_memory(table[table["kind"] == "memory"], gpu,
                                              max(cap, 0.0))
    gemm_efficiency, half = _fit_gemm(table[table["kind"] == "gemm"], peak, overhead, gpu)
    attention = table[table["kind"] == "attention"]
    flops = np.array([row_op(row)[0].flops for row in attention.to_dict("records")])
    attention_efficiency = (float(np.median(flops / (
        peak * (attention["seconds"].to_numpy(float) - overhead)))) if len(attention)
        else gpu.attention_efficiency)
    values = {"gemm_efficiency": gemm_efficiency, "gemm_half_dim": half,
              "attention_efficiency": attention_efficiency,
              "memory_efficiency": memory_efficiency, "kernel_overhead": overhead}
    for key in CALIBRATION_FIELDS:
        if key.endswith("efficiency") and not MIN_EFFICIENCY <= values[key] <= 1:
            raise CalibrationError(f"{key}: the table gives {values[key]:.3g}, outside "
                                   f"[{MIN_EFFICIENCY}, 1] (the range a scenario accepts); are the "
                                   "times per call, the sizes and the GPU right?")
    return {k: float(v) for k, v in values.items()}


def modelled(table: pd.DataFrame, gpu: GpuSpec, values: Mapping[str, float],
             precision: str = "bf16") -> np.ndarray:
    """Seconds the roofline compute model (no kernel table) gives each row with
    calibration ``values``."""
    model = ComputeModel.of(replace(calibrated(gpu, values), kernel_table=None), precision)
    return np.array([model.duration(row_op(row)[0]) for row in table.to_dict("records")])


def write_calibration(path: str | Path, gpu: GpuSpec, values: Mapping[str, float],
                      table: pd.DataFrame, source: str, precision: str) -> None:
    """A calibration file: the GPU, the five figures, and how well they fit."""
    errors = 100 * (modelled(table, gpu, values, precision) / table["seconds"] - 1)
    text = yaml.safe_dump({
        "gpu": gpu.name, **{k: float(f"{values[k]:.6g}") for k in CALIBRATION_FIELDS},
        "fit": {"source": source, "precision": precision, "rows": int(len(table)),
                "kinds": {k: int(v) for k, v in table["kind"].value_counts().items()},
                "mean_abs_error_pct": round(float(np.mean(np.abs(errors))), 3),
                "max_abs_error_pct": round(float(np.max(np.abs(errors))), 3)},
    }, sort_keys=False)
    Path(path).write_text("# clustersim calibration: the compute model's efficiencies fitted "
                          "by `clustersim calibrate`\n" + text)
