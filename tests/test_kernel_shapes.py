"""Compute that follows kernel shapes (issue 40): the GEMM tile model, grouped
GEMMs from the routing draw, attention by kernel and shape from published and
measured tables, and the ``training.attention_kernel`` key."""

from __future__ import annotations

import copy
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.compute import attention
from simulator.compute.gemm import TileModel
from simulator.compute.kernel_file import read_kernels, without_launch_floor
from simulator.compute.model import ComputeModel
from simulator.config.scenario import ScenarioError, from_dict
from topologies import GPUS
from topologies.gpus import KERNELS

H100, H200, A100 = GPUS["h100-sxm-80gb"], GPUS["h200-sxm-141gb"], GPUS["a100-sxm-80gb"]
SWEEPS = KERNELS / "h200"
BF16 = 989e12
HOST_BOUND = 25e-6  # sweep rows this short were timed at the host's launch rate


def tile_seconds(gpu, m, n, k) -> float:
    """The compute model's time of a forward BF16 GEMM (no kernel table)."""
    model = ComputeModel.of(replace(gpu, kernel_table=None), "bf16")
    op = Op(OpKind.COMPUTE, "g", "compute", Phase.FORWARD, kernel=KernelClass.GEMM,
            flops=2.0 * m * n * k, bytes=2.0 * (m * k + k * n + m * n), shape=(m, n, k))
    return model.duration(op) - model.kernel_overhead


@pytest.mark.parametrize("gpu", [H100, H200], ids=lambda g: g.name)
def test_the_tile_model_times_the_measured_sweep_within_its_spread(gpu):
    sweep = pd.read_csv(KERNELS / gpu.name.split("-")[0] / "gemm_sweep.csv")
    sweep = sweep[sweep["seconds"] > HOST_BOUND]
    errors = np.array([tile_seconds(gpu, r.m, r.n, r.k) / r.seconds - 1
                       for r in sweep.itertuples()])
    assert len(errors) > 150
    assert np.mean(np.abs(errors)) < 0.08  # 6-7 % measured
    assert np.mean(np.abs(errors)) < curve_error(sweep, gpu)  # better than one curve by size


def curve_error(sweep: pd.DataFrame, gpu) -> float:
    """The size curve's (gemm_efficiency 0.75, half size 900) mean absolute error."""
    x = (sweep["m"] * sweep["n"] * sweep["k"]) ** (1 / 3)
    seconds = np.maximum(sweep["flops"] / (BF16 * 0.75 * x / (x + 900.0)),
                         sweep["bytes"] / (gpu.hbm_bandwidth * gpu.memory_efficiency))
    return float(np.mean(np.abs(seconds / sweep["seconds"] - 1)))


def test_the_tile_model_reproduces_the_h100_tables_layer_gemms():
    """The shipped H100 table's layer GEMMs (launch floor off) within 11 %."""
    table, _ = without_launch_floor(read_kernels(KERNELS / "h100-sxm-80gb.csv"), H100)
    layers = ~table["measured_for"].astype(str).str.startswith("gemm sweep")
    gemms = table[layers & (table["kind"] == "gemm") & (table["seconds"] > 50e-6)]
    for r in gemms.itertuples():
        assert tile_seconds(H100, r.m, r.n, r.k) == pytest.approx(r.seconds, rel=0.11), r.name


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 20000), st.integers(1, 20000), st.integers(1, 20000),
       st.sampled_from([0, 1, 2]), st.integers(1, 5000))
def test_a_larger_gemm_never_takes_less_time(m, n, k, axis, more):
    bigger = [m, n, k]
    bigger[axis] += more
    model = TileModel(132, 0.75)
    assert model.seconds(*bigger, BF16) >= model.seconds(m, n, k, BF16)


def test_a_grouped_gemm_pays_each_experts_last_tile():
    model = TileModel(132, 0.75)
    one = model.seconds(16 * 200, 2048, 4096, BF16)
    grouped = model.seconds(16 * 200, 2048, 4096, BF16, groups=(200,) * 16)
    assert grouped == pytest.approx(one * 32 / 25, rel=0.02)  # 2 tiles each, not 25 in all


def test_grouped_gemms_take_the_routing_draws_rows():
    scenario = {"name": "moe", "cluster": {"preset": "dgx-h100", "nodes": 1},
                "model": {"preset": "mixtral-8x7b", "layers": 2, "routing": "zipf"},
                "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
                "parallelism": {"ep": 8}}
    spans = run(copy.deepcopy(scenario)).spans
    assert spans["name"].eq("router_aux_loss").any() and spans["name"].eq(
        "router_softmax").any()
    experts = spans[(spans["name"] == "experts_fc1") & (spans["phase"] == "forward")]
    assert experts["end"].sub(experts["start"]).round(12).nunique() > 1  # draws differ
    scenario["model"]["routing"] = "balanced"
    balanced = run(scenario).spans
    even = balanced[(balanced["name"] == "experts_fc1") & (balanced["phase"] == "forward")]
    assert even["end"].sub(even["start"]).round(12).nunique() == 1


ATTENTION_SWEEP = pd.read_csv(SWEEPS / "attention_sweep.csv")


def attention_op(batch, seq, heads, dim, causal, backward=False) -> Op:
    flops = 4.0 * batch * seq * seq * heads * dim * (2.5 if backward else 1.0)
    return Op(OpKind.COMPUTE, "attention", "compute",
              Phase.BACKWARD if backward else Phase.FORWARD, kernel=KernelClass.ATTENTION,
              flops=flops, shape=(batch * heads, seq, seq, dim, int(causal)))


@pytest.mark.parametrize("backend,kernel", [("flash", "flash2"), ("cudnn", "cudnn")])
def test_gqa_shapes_are_timed_by_the_standard_attention_rows(backend, kernel):
    """The H200 sweep's GQA rows (not in the table) from its standard rows."""
    model = ComputeModel.of(H200, "bf16", attention=kernel)
    gqa = ATTENTION_SWEEP[(ATTENTION_SWEEP["backend"] == backend)
                          & (ATTENTION_SWEEP["kv_heads"] < ATTENTION_SWEEP["heads"])]
    for r in gqa.itertuples():
        for backward, seconds in ((False, r.forward_s), (True, r.backward_s)):
            op = attention_op(r.batch, r.seq, r.heads, r.head_dim, r.causal, backward)
            assert model.duration(op) == pytest.approx(seconds, rel=0.1), r


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(["flash2", "cudnn"]), st.integers(1, 8), st.integers(64, 40000),
       st.integers(1, 4000), st.sampled_from([64, 80, 96, 128, 192, 256]), st.booleans(),
       st.booleans())
def test_a_longer_sequence_never_takes_less_time(kernel, batch, seq, more, dim, causal,
                                                 backward):
    model = ComputeModel.of(H200, "bf16", attention=kernel)
    short = model.duration(attention_op(batch, seq, 8, dim, causal, backward))
    longer = model.duration(attention_op(batch, seq + more, 8, dim, causal, backward))
    assert longer >= short * (1 - 1e-12)  # (equal within one block: its fixed time)


def test_causal_attention_does_half_the_work_at_long_sequences():
    model = ComputeModel.of(H200, "bf16", attention="cudnn")
    full = model.duration(attention_op(1, 16384, 16, 128, False))
    causal = model.duration(attention_op(1, 16384, 16, 128, True))
    assert 0.45 < causal / full < 0.6  # half the pairs, at a slightly lower rate


def test_auto_picks_the_frameworks_kernel():
    assert attention.resolve("auto", "megatron", H100) == "cudnn"
    assert attention.resolve("auto", "pytorch", H100) == "flash2"
    assert attention.resolve("auto", "megatron", A100) == "flash2"
    assert attention.resolve("auto", "megatron", H100, fused=False) == "unfused"
    assert attention.resolve("flash3", "pytorch", H100) == "flash3"


SCENARIO = {"name": "k", "cluster": {"preset": "dgx-h100", "nodes": 1},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 4096},
            "training": {"seq_len": 2048, "global_batch": 8}, "parallelism": {"dp": 8}}


def test_the_summary_names_each_kernels_source():
    summary = run(copy.deepcopy(SCENARIO)).summary
    assert "GEMMs by tile model (132 SMs" in summary["compute_model"]
    assert "cudnn attention by shape" in summary["compute_model"]
    assert "measured" in summary["compute_model"] or "arXiv" in summary["compute_model"]


@pytest.mark.parametrize("training,message", [
    ({"attention_kernel": "flash3"}, "runs on Hopper GPUs only, not a100"),
    ({"attention_kernel": "unfused", "flash_attention": True}, "contradicts"),
    ({"attention_kernel": "cudnn", "flash_attention": False}, "use attention_kernel: unfused"),
    ({"attention_kernel": "fast"}, "training.attention_kernel"),
])
def test_a_bad_attention_kernel_is_refused_naming_the_field(training, message):
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"]["preset"] = "dgx-a100"
    scenario["training"].update(training)
    with pytest.raises(ScenarioError, match=message):
        from_dict(scenario)


def test_unfused_is_flash_attention_off():
    scenario = copy.deepcopy(SCENARIO)
    scenario["training"]["attention_kernel"] = "unfused"
    spans = run(scenario).spans
    assert spans["name"].eq("attn_scores").any() and not spans["name"].eq("attention").any()


def test_the_attention_table_cites_a_source_on_every_row():
    table = attention.rows()
    assert table["source"].str.len().min() > 10
    assert set(table["kernel"]) <= set(attention.KERNELS)
    assert (table["tflops"] > 0).all() and math.isfinite(table["tflops"].max())
    assert Path(attention.DATA).exists()
