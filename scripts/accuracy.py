"""Compare the simulator with published measurements; print a Markdown table.

    python scripts/accuracy.py

Every "simulated" figure is computed here by the simulator (a collective chosen
and simulated by ``Collectives`` on a built fabric, or the compute model on a
kernel); only the "measured" column is transcribed, with its source. "basis"
says whether the measurement set a model parameter ("fit": the row shows the
fit) or was not used to build the model ("check"). The README's accuracy table
is this script's output.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simulator.collectives import Collectives, isolated_time
from simulator.fabric import Fabric
from simulator.ir import Collective, KernelClass, Op, OpKind, Phase
from simulator.nccl import Algorithm
from simulator.runner import compute_model
from simulator.scenario import from_dict
from topologies import CLUSTERS, build_cluster

GIB = 2**30
AZURE_A100 = "Azure AI-benchmarking-guide, ND A100 v4"
AZURE_H100 = "Azure AI-benchmarking-guide, ND H100 v5"
AZURE_H200 = "Azure AI-benchmarking-guide, ND H200 v5"
DGXC = "NVIDIA dgxc-benchmarking (DGX H100)"
FIT, CHECK = "fit", "check"


@dataclass(frozen=True)
class Case:
    name: str
    unit: str
    measured: float
    basis: str
    source: str
    simulate: Callable[[], float]


def all_reduce_busbw(preset: str, nodes: int, size: float,
                     algorithm: Algorithm | None = None) -> float:
    """nccl-tests bus bandwidth (GB/s) of an all-reduce over every GPU, the algorithm
    and protocol chosen by the simulator's tuner unless ``algorithm`` is given."""
    fabric = Fabric(build_cluster(CLUSTERS[preset], nodes))
    gpus = fabric.graph.graph["gpus"]
    n = len(gpus)
    t = isolated_time(fabric, Collectives(fabric, algorithm)(Collective.ALL_REDUCE, gpus, size))
    return size / t * 2 * (n - 1) / n / 1e9


def kernel_time(gpu: str, kernel: KernelClass, flops: float, nbytes: float,
                shape: tuple[int, int, int] | None = None) -> float:
    """Seconds the compute model gives one kernel on ``gpu`` (bf16)."""
    scenario = from_dict({
        "cluster": {"preset": "dgx-a100", "gpu": gpu},
        "model": {"preset": "gpt3-125m"},
        "training": {"seq_len": 2048, "global_batch": 8},
    })
    op = Op(OpKind.COMPUTE, "k", "compute", Phase.FORWARD, kernel=kernel, flops=flops,
            bytes=nbytes, shape=shape)
    return compute_model(scenario).duration(op)


def kernel_tflops(gpu: str, kernel: KernelClass, flops: float, nbytes: float,
                  shape: tuple[int, int, int] | None = None) -> float:
    return flops / kernel_time(gpu, kernel, flops, nbytes, shape) / 1e12


def gemm_tflops(gpu: str, m: int, n: int, k: int) -> float:
    return kernel_tflops(gpu, KernelClass.GEMM, 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n),
                         (m, n, k))


def hbm_copy_tbs(gpu: str, nbytes: float = 2 * GIB) -> float:
    return nbytes / kernel_time(gpu, KernelClass.ELEMENTWISE, 0.0, nbytes) / 1e12


def fa2_tflops(gpu: str, batch: int, seq: int, heads: int, head_dim: int) -> float:
    """FlashAttention-2 forward+backward throughput (model FLOPs, causal=False)."""
    forward = 4.0 * batch * seq * seq * heads * head_dim
    return kernel_tflops(gpu, KernelClass.ATTENTION, forward, 0.0)


MIB = 2**20
CASES = [
    Case("all-reduce busbw, 8x A100 NVSwitch, 8 GB", "GB/s", 231.58, CHECK, AZURE_A100,
         lambda: all_reduce_busbw("dgx-a100", 1, 8e9)),
    Case("all-reduce busbw, 8x A100 NVSwitch, 1 GB", "GB/s", 228.1, CHECK, AZURE_A100,
         lambda: all_reduce_busbw("dgx-a100", 1, 1e9)),
    Case("all-reduce busbw, 8x A100 NVSwitch, 134 MB", "GB/s", 174.18, CHECK, AZURE_A100,
         lambda: all_reduce_busbw("dgx-a100", 1, 134e6)),
    Case("all-reduce busbw, 8x H100 NVLS, 8 GiB", "GB/s", 480.16, FIT, DGXC,
         lambda: all_reduce_busbw("dgx-h100", 1, 8 * GIB)),
    Case("all-reduce busbw, 8x H100 NVLS, 1 GiB", "GB/s", 466.33, CHECK, DGXC,
         lambda: all_reduce_busbw("dgx-h100", 1, GIB)),
    Case("all-reduce busbw, 8x H100 NVLS, 128 MiB", "GB/s", 400.53, CHECK, DGXC,
         lambda: all_reduce_busbw("dgx-h100", 1, 128 * MIB)),
    Case("all-reduce busbw, 8x H200 NVLS, 8 GB", "GB/s", 479.98, CHECK, AZURE_H200,
         lambda: all_reduce_busbw("dgx-h200", 1, 8e9)),
    Case("all-reduce busbw, 8x H100 ring (no NVLS)", "GB/s", 370.0, FIT,
         "nccl-tests #212 (maintainer)",
         lambda: all_reduce_busbw("dgx-h100", 1, 8 * GIB, Algorithm.RING)),
    Case("all-reduce busbw, 4x DGX A100, ring, 8 GB", "GB/s", 192.0, FIT,
         "NCCL #812 (maintainer)", lambda: all_reduce_busbw("dgx-a100", 4, 8e9, Algorithm.RING)),
    Case("GEMM 4096^3 FP16, A100", "TFLOP/s", 228.0, FIT, AZURE_A100,
         lambda: gemm_tflops("a100-sxm-80gb", 4096, 4096, 4096)),
    Case("GEMM 8192^3 FP16, A100", "TFLOP/s", 253.7, FIT, AZURE_A100,
         lambda: gemm_tflops("a100-sxm-80gb", 8192, 8192, 8192)),
    Case("GEMM 16384^3 FP16, A100", "TFLOP/s", 256.5, FIT, AZURE_A100,
         lambda: gemm_tflops("a100-sxm-80gb", 16384, 16384, 16384)),
    Case("GEMM 6144x12288x12288 FP16, A100", "TFLOP/s", 250.8, FIT, AZURE_A100,
         lambda: gemm_tflops("a100-sxm-80gb", 6144, 12288, 12288)),
    Case("FlashAttention-2, A100 (hd 64, seq 8192)", "TFLOP/s", 179.5, FIT, AZURE_A100,
         lambda: fa2_tflops("a100-sxm-80gb", 2, 8192, 32, 64)),
    Case("FlashAttention-2, H100 (hd 128, seq 8192)", "TFLOP/s", 327.9, FIT, AZURE_H100,
         lambda: fa2_tflops("h100-sxm-80gb", 2, 8192, 16, 128)),
    Case("HBM stream copy, A100-80GB", "TB/s", 1.61, FIT, AZURE_A100,
         lambda: hbm_copy_tbs("a100-sxm-80gb")),
    Case("HBM stream copy, H100", "TB/s", 2.9, FIT, AZURE_H100,
         lambda: hbm_copy_tbs("h100-sxm-80gb")),
]


def table() -> list[tuple[Case, float, float]]:
    """(case, simulated, signed error %) for every case."""
    rows = []
    for case in CASES:
        simulated = case.simulate()
        rows.append((case, simulated, 100.0 * (simulated - case.measured) / case.measured))
    return rows


def main() -> None:
    print("| case | measured | simulated | error | basis | source |")
    print("|---|---:|---:|---:|---|---|")
    for case, simulated, error in table():
        print(f"| {case.name} | {case.measured:g} {case.unit} | {simulated:.1f} {case.unit} "
              f"| {error:+.1f} % | {case.basis} | {case.source} |")


if __name__ == "__main__":
    main()
