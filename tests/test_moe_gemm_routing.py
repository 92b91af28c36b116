"""Issue 56, items 2 and 5: grouped GEMMs at few tokens per expert on each GPU
generation (``compute.grouped``), and the default routing's expert loads from
published measurements (``workloads.routing``, ``measured``)."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.compute import grouped
from simulator.compute.gemm import TileModel
from simulator.compute.model import ComputeModel
from simulator.config.scenario import ScenarioError, from_dict
from topologies import GPUS
from topologies.gpus import KERNELS
from workloads.models import MODELS, ModelSpec
from workloads.routing import LOAD_CV, draw, expert_shares

H800, H200, B200 = GPUS["h800-sxm-80gb"], GPUS["h200-sxm-141gb"], GPUS["b200-sxm-180gb"]

# DeepGEMM's README at 55ab91f (2025-03-25), H800 SXM5, FP8 with 128-element block
# scales, BF16 out: (groups, rows per group, n, k, TFLOP/s); contiguous layout, then masked
DEEPGEMM_H800 = [
    (4, 8192, 4096, 7168, 1346), (4, 8192, 7168, 2048, 1214),
    (8, 4096, 4096, 7168, 1346), (8, 4096, 7168, 2048, 1214),
    (1, 1024, 4096, 7168, 1233), (1, 1024, 7168, 2048, 925),
    (2, 512, 4096, 7168, 1040), (2, 512, 7168, 2048, 916),
    (4, 256, 4096, 7168, 932), (4, 256, 7168, 2048, 815)]


def grouped_op(counts, n, k, element_bytes: float, low: bool) -> Op:
    """A forward grouped GEMM over ``counts`` rows per expert, its bytes as
    DeepGEMM's and the sweep's harnesses count them (inputs, every expert's
    weights, BF16 outputs)."""
    m = sum(counts)
    moved = element_bytes * (m * k + len(counts) * n * k) + 2.0 * m * n
    return Op(OpKind.COMPUTE, "experts_fc1", "compute", Phase.FORWARD,
              kernel=KernelClass.LOWP_GEMM if low else KernelClass.GEMM,
              flops=2.0 * m * n * k, bytes=moved, shape=(m, n, k, *counts))


def model(gpu, precision: str = "bf16") -> ComputeModel:
    return ComputeModel.of(replace(gpu, kernel_table=None), precision)


def test_deepgemm_h800_grouped_fp8_within_15_percent_each_and_7_5_on_average():
    """Checked, not fitted: each row within 15 %, the mean absolute error at most
    7.5 % (the plain roofline: 16 %, +41 % at 256 rows per group)."""
    fp8 = model(H800, "fp8")
    errors = []
    for groups, rows, n, k, tflops in DEEPGEMM_H800:
        op = grouped_op((rows,) * groups, n, k, 1.0, low=True)
        simulated = op.flops / (fp8.duration(op) - fp8.kernel_overhead) / 1e12
        errors.append(simulated / tflops - 1)
        assert simulated == pytest.approx(tflops, rel=0.15), (groups, rows, n, k)
    assert np.mean(np.abs(errors)) < 0.075
    assert abs(np.mean(errors)) < 0.05


def test_the_h200_grouped_sweep_within_7_percent_and_unbiased_at_every_rows_per_expert():
    """The fit's own measurements (``compute.grouped``): mean absolute error under
    7 % (the plain roofline: 13.8 %, -37 % at 64 tokens per expert), and no
    tokens-per-expert step biased by more than 5 %."""
    sweep = pd.read_csv(KERNELS / "h200" / "grouped_sweep.csv")
    sweep = sweep[sweep["seconds"] > 60e-6]  # longer than the host's launch rate
    bf16 = model(H200)
    errors = {}
    for r in sweep.itertuples():
        op = grouped_op(tuple(int(c) for c in r.counts.split()), r.n, r.k, 2.0, low=False)
        error = (bf16.duration(op) - bf16.kernel_overhead) / r.seconds - 1
        errors.setdefault(r.per_expert, []).append(error)
    every = np.concatenate(list(errors.values()))
    assert len(every) > 200 and np.mean(np.abs(every)) < 0.07
    assert all(abs(np.mean(e)) < 0.05 for e in errors.values()), \
        {k: round(float(np.mean(e)), 3) for k, e in errors.items()}


def test_blackwell_pads_each_expert_to_a_2sm_256_row_tile():
    hopper = TileModel(148, 0.665, group_rows=grouped.group_rows("hopper"))
    blackwell = TileModel(148, 0.665, group_rows=grouped.group_rows("blackwell"))
    peak = 2250e12
    # 300 rows: 3 x 128 on Hopper's tiles, 2 x 256 on Blackwell's: 512 / 384 of the work
    assert blackwell.seconds(32 * 300, 4096, 4096, peak, groups=(300,) * 32) == pytest.approx(
        hopper.seconds(32 * 300, 4096, 4096, peak, groups=(300,) * 32) * 512 / 384, rel=0.01)
    # 256 rows fill both alike; a dense GEMM is unchanged
    assert blackwell.seconds(32 * 256, 4096, 4096, peak, groups=(256,) * 32) == \
        hopper.seconds(32 * 256, 4096, 4096, peak, groups=(256,) * 32)
    assert blackwell.seconds(300, 4096, 4096, peak) == hopper.seconds(300, 4096, 4096, peak)
    assert model(B200).tiles.group_rows == 256 and model(H200).tiles.group_rows == 128


def test_grouped_seconds_adds_the_unhidden_share_of_the_shorter():
    assert grouped.seconds(2.0, 1.0) == pytest.approx(2.0 + grouped.UNHIDDEN)
    assert grouped.seconds(1.0, 2.0) == grouped.seconds(2.0, 1.0)
    assert grouped.seconds(1.0, 0.0) == 1.0


def test_a_dense_gemm_keeps_the_roofline():
    bf16 = model(H200)
    op = Op(OpKind.COMPUTE, "fc1", "compute", Phase.FORWARD, kernel=KernelClass.GEMM,
            flops=2.0 * 4096**3, bytes=2.0 * 3 * 4096**2, shape=(4096, 4096, 4096))
    t_flops = op.flops / (bf16.peak_flops * bf16.efficiency(op))
    assert bf16.duration(op) == pytest.approx(t_flops + bf16.kernel_overhead)
    assert not bf16.is_grouped(op)


def test_the_compute_model_line_says_grouped_gemms_apply():
    counts = (512,) * 8
    op = grouped_op(counts, 4096, 2048, 2.0, low=False)
    line = model(B200).describe((op,))
    assert "pad each expert to 256-row tiles" in line and "0.68 of HBM" in line
    assert "pad each expert" not in model(B200).describe(())


# ---- routing ---------------------------------------------------------------------------

def test_the_measured_popularity_gives_the_papers_maxvio_at_64_experts():
    """Wang et al. 2024 Table 2 (64 routed experts): MaxVio_global 0.62 with the
    auxiliary loss (0.72 and 0.52), 0.04 loss-free; the mean over 400 layers'
    draws within 6 %."""
    base = ModelSpec("m", 4, 256, 4, 4, 512, 1024, experts=64, top_k=6, routing="measured")
    for aux, maxvio in ((True, 0.62), (False, 0.04)):
        m = replace(base, router_aux_loss=aux)
        shares = [expert_shares(m, np.random.default_rng([5, layer])) for layer in range(400)]
        drawn = np.mean([s.max() * m.experts - 1 for s in shares])
        assert drawn == pytest.approx(maxvio, rel=0.06), (aux, drawn)
    assert LOAD_CV[True] > LOAD_CV[False]


def test_a_rank_with_more_experts_is_better_balanced():
    """Summed over its local experts: 64 experts over 64 ranks (one each) are far
    less even than over 8 ranks (8 each), about sqrt(8) less spread."""
    m = replace(MODELS["qwen3-30b-a3b"], experts=64, routing="measured")
    one, eight = (draw(m, ep, 4096 * 8 * 64 // ep, 4, seed=2) for ep in (64, 8))
    assert one.imbalance > 1.4 and 1.02 < eight.imbalance < 1.25
    assert (one.imbalance - 1) > 2.5 * (eight.imbalance - 1)


def test_the_default_routing_is_measured_and_balanced_stays_balanced():
    raw = {"name": "moe", "cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": 2},
           "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
           "parallelism": {"ep": 8}}
    assert from_dict(raw).model.routing == "measured"
    mixtral = from_dict(raw).model
    assert draw(mixtral, 8, 1024 * 2, 4, seed=1).imbalance > 1.1  # one expert a rank
    raw["model"]["routing"] = "balanced"
    balanced = from_dict(raw).model
    assert draw(balanced, 8, 1024 * 2, 4, seed=1).imbalance == 1.0


def test_a_bad_routing_is_refused_naming_the_field_and_the_choices():
    raw = {"name": "moe", "cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": 2, "routing": "measurd"},
           "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
           "parallelism": {"ep": 8}}
    with pytest.raises(ScenarioError, match=r"model\.routing.*measurd.*measured"):
        from_dict(raw)


def test_loss_free_routing_is_nearly_even():
    """DeepSeek-V3's loss-free biases (``router_aux_loss: false``): its busiest of 32
    ranks (8 experts each) within a few per cent of the mean."""
    v3 = MODELS["deepseek-v3"]
    assert v3.router_aux_loss is False and v3.routing == "measured"
    assert 1.0 < draw(v3, 32, 4096 * 8, 4, seed=1).imbalance < 1.05
    assert math.isclose(draw(replace(v3, routing="balanced"), 32, 4096 * 8, 4, 1).imbalance,
                        1.0)
