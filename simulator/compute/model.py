"""How long a kernel takes on a GPU: a roofline with shape-dependent efficiency,
corrected by a measured kernel table where the GPU has one (``compute.table``).

    t = max(flops / (peak * eff(kernel)), bytes / (hbm * mem_eff)) + overhead

A GEMM's efficiency follows its shape on the GPU's SMs (``compute.gemm``: output
tiles, pipeline fill per tile, SMs left idle; a backward GEMM is its input- and
weight-gradient GEMMs, a grouped GEMM its experts' tiles together) where the GPU
file gives its ``sms``; otherwise (a calibration file's fit) it rises with size
along one curve, ``eff = gemm_eff * x / (x + x_half)`` where x is the geometric
mean of (m, n, k). Fused
attention runs at a constant fraction of peak; element-wise kernels are bound
by memory bandwidth. Under low precision (``workloads.precision``) the linear
layers' GEMMs run at the format's dense peak, reaching the fraction of BF16's
efficiency at the same shape that the GPU file's ``low_precision:`` gives (its
kernels measured against BF16's in one benchmark; a kernel table's shape
correction applies as to BF16), FP8 attention likewise at the FP8 peak, and the
casts stream at ``low_precision.cast`` of the memory efficiency. The figures
come from the GPU spec (``topologies.gpus``), fitted to published measurements.
A kernel table (``kernel_table:`` in the GPU file, or ``cluster.kernel_table``)
multiplies the roofline's time by the correction its rows give near the
kernel's shape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from simulator.base.ir import ATTENTIONS, GEMMS, HOST_KERNELS, KernelClass, Op, OpKind, Phase
from simulator.compute import grouped
from simulator.compute.attention import AttentionModel, model_for, resolve
from simulator.compute.gemm import TileModel
from simulator.compute.table import for_gpu
from workloads.elementwise_kernels import OVERHEADS
from workloads.optimizer_step import STEP_KERNELS
from workloads.precision import ATTENTION_PEAK, ELEMENT_BYTES, high_precision, is_low


@dataclass(frozen=True)
class ComputeModel:
    peak_flops: float
    hbm_bandwidth: float
    gemm_efficiency: float
    gemm_half_dim: float
    attention_efficiency: float
    memory_efficiency: float
    kernel_overhead: float
    table: object = field(default=None, compare=False)  # compute.table.KernelTable
    assumed: str = field(default="", compare=False)  # the GPU file's efficiencies_assumed
    host_link: float = 0.0  # bytes/s a GPU copies to or from host memory (each way)
    host_memory: float = 0.0  # bytes/s of host memory bandwidth a GPU's host work gets
    lowp_peak: float = 0.0  # dense FLOP/s of the low-precision format (0: none)
    lowp_gemm: float = 1.0  # its GEMMs' efficiency relative to BF16's at one shape
    lowp_attention_peak: float = 0.0  # FP8 attention's dense FLOP/s (the FP8 peak)
    lowp_attention: float = 1.0  # its efficiency relative to BF16 attention's
    cast: float = 1.0  # a cast kernel's share of the streaming memory efficiency
    lowp_bytes: float = 1.0  # bytes of one low-precision operand element
    tiles: TileModel | None = None  # GEMMs by tiles on the SMs (None: the size curve)
    attention: AttentionModel | None = None  # fused attention by shape (None: a constant)

    @classmethod
    def of(cls, gpu, precision: str, host_link: float = 0.0, host_memory: float = 0.0,
           attention: str = "") -> ComputeModel:
        """The model of a GPU spec (``topologies.GpuSpec``) at ``precision``, with
        the GPU's kernel table where it has one for that precision; ``host_link``
        and ``host_memory`` time offloading's copies and host work (the cluster's
        ``ClusterSpec.host_rates``). A low ``precision`` times the linear layers'
        GEMMs at its peak and everything else at BF16's (``high_precision``).
        ``attention``: the fused attention kernel (``compute.attention.resolve``;
        "": the GPU file's constant efficiency)."""
        high = high_precision(precision)
        roofline = cls(gpu.peak(high), gpu.hbm_bandwidth, gpu.gemm_efficiency,
                       gpu.gemm_half_dim, gpu.attention_efficiency, gpu.memory_efficiency,
                       gpu.kernel_overhead, assumed=gpu.efficiencies_assumed,
                       host_link=host_link, host_memory=host_memory,
                       tiles=TileModel(gpu.sms, gpu.gemm_efficiency, gpu.architecture != "ampere",
                                       grouped.group_rows(gpu.architecture))
                       if gpu.sms else None,
                       attention=model_for(gpu, attention) if attention and gpu.sms else None)
        if is_low(precision):
            lowp = gpu.low_precision
            roofline = replace(
                roofline, lowp_peak=gpu.peak(precision), lowp_gemm=lowp[precision],
                lowp_attention_peak=gpu.peak(ATTENTION_PEAK),
                lowp_attention=lowp.get("fp8_attention", 1.0), cast=lowp["cast"],
                lowp_bytes=ELEMENT_BYTES[precision])
        if gpu.kernel_table is None:
            return roofline
        return replace(roofline, table=for_gpu(str(gpu.kernel_table), gpu, high, roofline))

    @classmethod
    def for_training(cls, gpu, training, framework: str, host_rates: tuple = ()
                     ) -> ComputeModel:
        """The model a run of ``training`` (a ``TrainingSpec``) in ``framework``
        on ``gpu`` uses: its precision and its attention kernel
        (``compute.attention.resolve``)."""
        kernel = resolve(training.attention_kernel, framework, gpu, training.flash_attention,
                         training.fp8_attention)
        precision = training.precision  # (a GPU without it: traces replayed as recorded)
        if precision not in gpu.peak_flops:
            precision = high_precision(precision)
        return cls.of(gpu, precision, *host_rates, attention=kernel)

    def describe(self, ops: tuple[Op, ...] = ()) -> str:
        """Which model times the kernels, for the run's summary; ``ops`` (a
        rank's program): say whether its attention left the published grid."""
        gemms = f"GEMMs by {self.tiles.describe()}" if self.tiles else "GEMMs by size curve"
        if self.table is not None:
            out = f"roofline corrected by the kernel table {self.table.describe()}"
        else:
            out = f"roofline (efficiencies assumed: {self.assumed})" if self.assumed \
                else "roofline"
        if self.tiles is not None and any(self.is_grouped(op) for op in ops):
            gemms += f" ({grouped.describe(self.tiles.group_rows)})"
        out += f"; {gemms}; " + (self.attention.describe() if self.attention else
                                  "attention at a constant efficiency")
        shapes = {(op.shape, op.phase is Phase.BACKWARD) for op in ops
                  if op.kernel in ATTENTIONS and op.shape} if self.attention else ()
        if any(self.attention.extrapolated(*shape) for shape in shapes):
            out += (" (extrapolated past the published sequences: the longest's rate above, "
                    "a rate falling with the sequence below)")
        if any(self.attention.narrowed(*shape) for shape in shapes):
            out += (" (head sizes below the published carried down by the softmax's "
                    f"exponentials at {self.attention.exponentials / 1e12:g} T/s)")
        out += overheads(ops)
        if self.lowp_peak:
            out += (f"; low-precision GEMMs at {self.lowp_peak / 1e12:g} TFLOP/s with "
                    f"{self.lowp_gemm:g} of BF16's efficiency by shape, casts at "
                    f"{self.cast:g} of its streaming bandwidth")
        return out

    def efficiency(self, op: Op) -> float:
        """Fraction of its peak FLOP/s that ``op`` reaches."""
        kernel = op.kernel
        if kernel in GEMMS and op.shape is not None and self.tiles is not None:
            return self.tile_efficiency(op)
        if kernel in GEMMS and op.shape is not None:
            m, n, k = op.shape[:3]
            m /= max(len(op.shape) - 3, 1)  # a grouped GEMM: one expert's rows
            x = float(m * n * k) ** (1.0 / 3.0)
            large = self.gemm_efficiency * (1.0 if kernel is KernelClass.GEMM else
                                            self.lowp_gemm)
            return large * x / (x + self.gemm_half_dim)
        if kernel is KernelClass.ATTENTION:
            return self.attention_efficiency
        if kernel is KernelClass.LOWP_ATTENTION:
            return self.attention_efficiency * self.lowp_attention
        return 1.0

    def tile_efficiency(self, op: Op) -> float:
        """A GEMM's efficiency from the tile model: forward C = A B, backward
        its input gradient (m, k, n) and weight gradient (k, n, m), each
        expert's own (``op.shape[3:]``: a grouped GEMM's rows per expert)."""
        m, n, k = op.shape[:3]
        groups = op.shape[3:]
        low = op.kernel is KernelClass.LOWP_GEMM
        peak = self.peak(op) * (self.lowp_gemm if low else 1.0)
        size = self.lowp_bytes if low else 2.0
        flops = 2.0 * m * n * k
        if op.phase is Phase.BACKWARD:
            g = max(len(groups), 1)
            seconds = self.tiles.seconds(m, k, n, peak, size, groups) + self.tiles.seconds(
                k * g, n, m / g, peak, size, (k,) * len(groups))
            flops *= 2.0
        else:
            seconds = self.tiles.seconds(m, n, k, peak, size, groups)
        return flops / (self.peak(op) * seconds) if seconds > 0 else 1.0

    @staticmethod
    def is_grouped(op: Op) -> bool:
        """A grouped GEMM: its shape lists its experts' rows (``experts_gemm``)."""
        return op.kernel in GEMMS and op.shape is not None and len(op.shape) > 3

    def peak(self, op: Op) -> float:
        """The dense FLOP/s ``op`` runs at: its format's."""
        if op.kernel is KernelClass.LOWP_GEMM:
            return self.lowp_peak
        return self.lowp_attention_peak if op.kernel is KernelClass.LOWP_ATTENTION \
            else self.peak_flops

    def duration(self, op: Op) -> float:
        """Seconds ``op`` occupies its GPU; 0 for anything that is not compute."""
        if op.kind is not OpKind.COMPUTE:
            return 0.0
        if op.kernel in HOST_KERNELS:  # a copy engine's or the CPU's: no GPU roofline
            rate = self.host_link if op.kernel is KernelClass.HOST_COPY else self.host_memory
            return op.bytes / rate + self.kernel_overhead
        t_memory = op.bytes / (self.hbm_bandwidth * self.memory_efficiency * (
            self.cast if op.kernel is KernelClass.QUANTIZE else 1.0))
        if op.kernel in ATTENTIONS and self.attention is not None and op.shape:
            return max(self.attention_seconds(op), t_memory) + self.kernel_overhead
        t_flops = op.flops / (self.peak(op) * self.efficiency(op)) if op.flops else 0.0
        if self.tiles is not None and self.is_grouped(op):  # experts' operands (compute.grouped)
            t_stream = op.bytes / (self.hbm_bandwidth * grouped.STREAM_EFFICIENCY)
            seconds = grouped.seconds(t_flops, t_stream) + self.kernel_overhead
        else:
            seconds = max(t_flops, t_memory) + self.kernel_overhead
        return seconds if self.table is None else seconds * math.exp(
            self.table.log_correction(op))

    def attention_seconds(self, op: Op) -> float:
        """A fused attention op's compute time from its kernel's rows (FP8
        attention without FP8 rows: BF16's, at the FP8 peak with the GPU
        file's FP8 efficiency relative to BF16's)."""
        fp8 = op.kernel is KernelClass.LOWP_ATTENTION
        seconds, low = self.attention.seconds(op.flops, op.shape, op.phase is Phase.BACKWARD,
                                              fp8)
        if fp8 and not low:
            seconds /= self.lowp_attention_peak / self.peak_flops * self.lowp_attention
        return seconds

    def durations(self, ops: tuple[Op, ...]) -> np.ndarray:
        """``duration`` of each op, worked out once per distinct kernel (a stage's
        program repeats a layer's few kernels hundreds of thousands of times; a
        hot path: the key from the op's fields by position, name to shape)."""
        memo: dict[tuple, float] = {}
        out = [0.0] * len(ops)
        compute = OpKind.COMPUTE
        for i, op in enumerate(ops):
            if op[0] is compute:
                key = op[1:4:2] + op[5:9]  # name, phase, kernel, flops, bytes, shape
                seconds = memo.get(key)
                if seconds is None:
                    seconds = memo[key] = self.duration(op)
                out[i] = seconds
        return np.array(out, dtype=float)


def overheads(ops: tuple[Op, ...]) -> str:
    """The summary's words on the memory-bound kernels timed at their framework
    kernels' bytes (``workloads.elementwise_kernels``) and the optimizer step's
    kernels (``workloads.optimizer_step``) that ``ops`` has; "" for none."""
    names = {op.name for op in ops if op.kind is OpKind.COMPUTE}
    layer = [n for n in OVERHEADS if n in names]
    step = [n for n in STEP_KERNELS if n in names]
    out = f"; {', '.join(layer)} at their kernels' bytes (TE, Megatron-Core)" if layer else ""
    return out + (f"; optimizer step as {' + '.join(step)}" if step else "")
