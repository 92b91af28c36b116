"""GPU specifications and the efficiencies the compute model uses.

Every GPU is a data file in ``topologies/data/gpus/`` (peaks from the vendor's
datasheet, the measurements its efficiencies were fitted to, with sources),
not code: ``calibration:`` holds the five figures the roofline compute model
needs (``simulator.compute.model``), and ``kernel_table:`` names a table of
measured kernel times in ``data/kernels/`` that corrects it by shape
(``simulator.compute.table``). ``clustersim calibrate`` fits the same five
figures to a user's own kernel timings; ``cluster.calibration: FILE`` applies
them (``calibrated``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

import yaml

GIB = 2.0**30


@dataclass(frozen=True)
class GpuSpec:
    """One GPU model: peaks, memory, and roofline efficiencies."""

    name: str
    peak_flops: Mapping[str, float]  # dense FLOP/s per precision name
    memory_bytes: float
    hbm_bandwidth: float  # bytes/s
    gemm_efficiency: float  # fraction of peak reached by very large GEMMs
    gemm_half_dim: float  # size curve: geometric-mean GEMM dimension at half of gemm_efficiency
    attention_efficiency: float  # fraction of peak reached by fused attention
    memory_efficiency: float  # fraction of HBM bandwidth reached by streaming kernels
    kernel_overhead: float = 2e-6  # seconds per kernel launch / tail
    kernel_table: Path | None = None  # measured kernel times (``simulator.compute.table``)
    sms: int = 0  # streaming multiprocessors: GEMMs by the tile model (0: the size curve)
    overlap_slowdown: float = 1.0  # compute's slow-down while NCCL runs (``compute.contention``)
    nvlink_generation: int = 0  # 0: not stated in the file
    nvlink_bandwidth: float = 0.0  # bytes/s per GPU per direction (the datasheet's total / 2)
    power_watts: float = 0.0  # maximum board power (TDP); 0: not stated
    # exponentials per second of the special function units (MUFU.EX2), what
    # fused attention's softmax runs on (``simulator.compute.attention``); 0: not stated
    exponentials_per_s: float = 0.0
    # where the efficiencies come from when no measurement of this GPU does (the
    # summary's compute_model says so): "" for fitted ones
    efficiencies_assumed: str = ""
    aliases: tuple[str, ...] = ()  # short names a scenario may use (``gpu: b200``)
    architecture: str = ""  # ampere | hopper | blackwell: which low-precision recipes it runs
    # each low-precision format's GEMM efficiency relative to BF16's at the same
    # shape, FP8 attention's (``fp8_attention``) relative to BF16 attention's, and
    # the casts' share of the streaming memory efficiency (``cast``), from the file's
    # cited measurements (``simulator.compute.model``)
    low_precision: Mapping[str, float] = field(default_factory=dict)
    notes: str = field(default="", compare=False)

    def peak(self, precision: str) -> float:
        """Dense peak FLOP/s for ``precision``; KeyError if the GPU lacks it."""
        return self.peak_flops[precision]


CALIBRATION_FIELDS = ("gemm_efficiency", "gemm_half_dim", "attention_efficiency",
                      "memory_efficiency", "kernel_overhead")
DATA = Path(__file__).resolve().parent / "data" / "gpus"
KERNELS = DATA.parent / "kernels"  # measured kernel tables the GPU files name


MIN_EFFICIENCY = 0.01  # below 1 % of a peak, a figure is a unit mistake, not a GPU
# (the same floor as a scenario's link efficiencies, ``base.fields.EFFICIENCY``)


class GpuFileError(ValueError):
    """A GPU or calibration file that does not hold what it should."""


def check_calibration(values: Mapping[str, object], where: str,
                      optional: tuple[str, ...] = ()) -> dict[str, float]:
    """The five efficiency figures from ``values``, checked: efficiencies in
    [``MIN_EFFICIENCY``, 1], ``gemm_half_dim`` and ``kernel_overhead`` (seconds)
    finite and not negative; an ``optional`` one left out is 0."""
    out = {}
    for key in CALIBRATION_FIELDS:
        value = values.get(key, 0.0 if key in optional else None)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise GpuFileError(f"{where}: {key} {value!r} must be a number")
        bounded = key.endswith("efficiency")
        if not math.isfinite(value) or (bounded and not MIN_EFFICIENCY <= value <= 1.0) or (
                value < 0.0):
            raise GpuFileError(f"{where}: {key} {value!r} must be "
                               + (f"in [{MIN_EFFICIENCY}, 1]" if bounded else "finite, >= 0"))
        out[key] = float(value)
    unknown = set(values) - set(CALIBRATION_FIELDS) - {"gpu", "fit"}
    if unknown:
        raise GpuFileError(f"{where}: unknown key {sorted(unknown)[0]!r}; allowed: "
                           + ", ".join(CALIBRATION_FIELDS))
    return out


def load_gpu(path: Path) -> GpuSpec:
    """A GPU data file as a GpuSpec."""
    raw = yaml.safe_load(path.read_text())
    try:
        return GpuSpec(
            name=str(raw["name"]),
            peak_flops=MappingProxyType({k: float(v) * 1e12
                                         for k, v in raw["peak_tflops"].items()}),
            memory_bytes=float(raw["memory_bytes"]),
            hbm_bandwidth=float(raw["hbm_bytes_per_s"]),
            **check_calibration(raw["calibration"], f"{path.name}: calibration",
                                optional=("gemm_half_dim",) if "sms" in raw else ()),
            kernel_table=_kernel_table(raw.get("kernel_table"), path),
            sms=_sms(raw.get("sms", 0), path),
            overlap_slowdown=_overlap_slowdown(raw.get("overlap_slowdown", 1.0), path),
            **_interconnect(raw, path),
            efficiencies_assumed=str(raw.get("efficiencies_assumed", "")),
            aliases=tuple(str(a) for a in raw.get("aliases", ())),
            architecture=str(raw.get("architecture", "")),
            low_precision=_low_precision(raw.get("low_precision", {}) or {}, raw, path),
            notes=str(path),
        )
    except (KeyError, TypeError) as error:
        raise GpuFileError(f"{path}: missing or malformed {error}") from None


def _sms(value: object, path: Path) -> int:
    """The file's SM count: a whole number >= 0 (0: GEMMs by the size curve)."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise GpuFileError(f"{path}: sms {value!r} must be a whole number >= 0 (the GPU's "
                           "streaming multiprocessors; 0 or left out: the GEMM size curve)")
    return value


def _interconnect(raw: Mapping, path: Path) -> dict:
    """The file's optional NVLink generation and per-direction bandwidth, its
    power and its exponential rate, checked (positive where given)."""
    nvlink = raw.get("nvlink", {}) or {}
    out = {"nvlink_generation": nvlink.get("generation", 0),
           "nvlink_bandwidth": nvlink.get("bytes_per_s_per_direction", 0.0),
           "power_watts": raw.get("power_watts", 0.0),
           "exponentials_per_s": raw.get("exponentials_per_s", 0.0)}
    for key, value in out.items():
        try:  # (YAML reads 9.0e11, without an exponent sign, as text)
            number = float(value) if not isinstance(value, bool) else math.nan
        except (TypeError, ValueError):
            number = math.nan
        if not (math.isfinite(number) and number >= 0):
            raise GpuFileError(f"{path}: {key} {value!r} must be a number >= 0")
        out[key] = int(number) if key == "nvlink_generation" else number
    return out


LOW_FORMATS = ("fp8", "mxfp8", "nvfp4")


def _low_precision(values: Mapping, raw: Mapping, path: Path) -> Mapping[str, float]:
    """The file's ``low_precision:`` figures, checked: for low formats the GPU has
    a peak for (and ``fp8_attention`` and ``cast`` where it has FP8), each in
    [``MIN_EFFICIENCY``, 1]. A format without one cannot be trained in
    (``simulator.config.training``)."""
    peaks = raw.get("peak_tflops", {})
    wanted = [f for f in LOW_FORMATS if f in peaks] + (["fp8_attention", "cast"]
                                                       if "fp8" in peaks else [])
    out = {}
    for key in [k for k in wanted if k in values]:
        value = values[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                MIN_EFFICIENCY <= value <= 1.0):
            raise GpuFileError(f"{path}: low_precision.{key} {value!r} must be a number in "
                               f"[{MIN_EFFICIENCY}, 1] (the GPU has a {key.split('_')[0]} peak)")
        out[key] = float(value)
    unknown = set(values) - set(wanted)
    if unknown:
        raise GpuFileError(f"{path}: low_precision.{sorted(unknown)[0]} has no peak_tflops "
                           "entry; allowed: " + ", ".join(wanted))
    return MappingProxyType(out)


def _kernel_table(name: object, path: Path) -> Path | None:
    """The GPU file's ``kernel_table`` (a file in ``data/kernels``), checked."""
    if name is None:
        return None
    table = KERNELS / str(name)
    if not table.is_file():
        raise GpuFileError(f"{path}: kernel_table {name!r} is not a file in {KERNELS}")
    return table


MAX_OVERLAP_SLOWDOWN = 4.0  # NCCL never takes three quarters of a GPU's SMs


def _overlap_slowdown(value: object, path: Path) -> float:
    """The GPU file's ``overlap_slowdown``: a number in [1, ``MAX_OVERLAP_SLOWDOWN``]."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            1.0 <= value <= MAX_OVERLAP_SLOWDOWN):
        raise GpuFileError(f"{path}: overlap_slowdown {value!r} must be a number in "
                           f"[1, {MAX_OVERLAP_SLOWDOWN:g}]")
    return float(value)


def calibrated(spec: GpuSpec, values: Mapping[str, float]) -> GpuSpec:
    """``spec`` with its efficiencies replaced by a calibration's: GEMMs then
    follow the fitted size curve, not the tile model (``sms`` 0)."""
    return replace(spec, sms=0, **{k: values[k] for k in CALIBRATION_FIELDS})


def _by_name(specs: list[GpuSpec]) -> dict[str, GpuSpec]:
    """Every GPU under its name and its aliases (a name used twice is a data error)."""
    out: dict[str, GpuSpec] = {}
    for spec in specs:
        for name in (spec.name, *spec.aliases):
            if name in out:
                raise GpuFileError(f"GPU name {name!r} is used by two files")
            out[name] = spec
    return out


GPUS: Mapping[str, GpuSpec] = MappingProxyType(
    _by_name([load_gpu(p) for p in sorted(DATA.glob("*.yaml"))]))
