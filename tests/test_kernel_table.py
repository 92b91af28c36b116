"""Shape-aware compute (``simulator.compute.table``): a measured kernel table
times its own shapes exactly, predicts another model's layer from one model's
rows, fades to the roofline far from every row, and is a scenario key."""

import copy
import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.compute.kernel_file import launch_floor, read_kernels, without_launch_floor
from simulator.compute.model import ComputeModel
from simulator.compute.table import KernelTable, leave_one_out, row_op
from simulator.config.scenario import ScenarioError, from_dict
from simulator.runner.setup import compute_model
from topologies import GPUS
from topologies.gpus import KERNELS

H100 = GPUS["h100-sxm-80gb"]
TABLE = KERNELS / "h100-sxm-80gb.csv"
ROOFLINE = ComputeModel.of(H100.__class__(**{**H100.__dict__, "kernel_table": None}), "bf16")
CURVE = replace(ROOFLINE, tiles=None, gemm_half_dim=900.0)  # one efficiency curve by size
LAYER = ("qkv", "proj", "fc1", "fc2", "attention_forward")


def rows(measured_for: str | None = None):
    table, _ = without_launch_floor(read_kernels(TABLE), H100)
    return table if measured_for is None else table[table["measured_for"] == measured_for]


def predicted(table: KernelTable | None, row: dict, roofline=ROOFLINE) -> float:
    op = row_op(row)[0]
    return roofline.duration(op) * (math.exp(table.log_correction(op)) if table else 1.0)


def gemm(m, n, k, phase=Phase.FORWARD) -> Op:
    return Op(OpKind.COMPUTE, "g", "compute", phase, kernel=KernelClass.GEMM,
              flops=2.0 * m * n * k, bytes=2.0 * (m * k + k * n + m * n), shape=(m, n, k))


def test_the_launch_floor_is_the_largest_latency_every_row_carries():
    table = read_kernels(TABLE)
    floor = launch_floor(table, H100)
    assert 10e-6 < floor < 20e-6  # the reference tables: about 14 us (add over 16M elements)
    shifted = table.copy()
    shifted["seconds"] += 5e-6
    assert launch_floor(shifted, H100) == pytest.approx(floor + 5e-6, rel=1e-9)
    shifted["calls"] = 10  # timed back to back: nothing to take off
    assert launch_floor(shifted, H100) == 0.0
    assert without_launch_floor(shifted, H100)[0] is shifted


def test_a_measured_shape_is_timed_as_measured():
    """At a measured shape the table's time: the geometric mean where the shape
    was measured twice (a layer GEMM that the sweep also timed)."""
    model = ComputeModel.of(H100, "bf16")
    table = rows()
    gemms = table[table["kind"] == "gemm"]
    for row in table.to_dict("records"):
        if row["name"] in LAYER and row["kind"] == "gemm":
            same = gemms[(gemms["m"] == row["m"]) & (gemms["n"] == row["n"])
                         & (gemms["k"] == row["k"])]["seconds"]
            assert model.duration(row_op(row)[0]) == pytest.approx(
                math.exp(np.log(same).mean()), rel=1e-9)


@pytest.mark.parametrize(("train", "test"), [("gpt3-6.7b-tp2", "gpt3-175b-tp8"),
                                             ("gpt3-175b-tp8", "gpt3-6.7b-tp2")])
def test_one_models_rows_predict_the_other_models_layer_within_10_percent(train, test):
    """Cross-validation, the harshest test the two tables allow: 6.7B's rows time
    175B's layer forward within 0.3 %, 175B's rows 6.7B's within 9.1 % (one
    attention row each, 27 % apart: attention is placed by FLOPs only); the
    roofline is 20-25 % slow on both."""
    table = KernelTable.build(rows(train), ROOFLINE, train)
    layer = [r for r in rows(test).to_dict("records") if r["name"] in LAYER]
    measured = sum(r["seconds"] for r in layer)
    by_table = sum(predicted(table, r) for r in layer)
    by_curve = sum(predicted(None, r, CURVE) for r in layer)
    assert by_table == pytest.approx(measured, rel=0.10)
    assert abs(by_curve / measured - 1) > 0.15  # what one efficiency curve gives
    gemms = [r for r in layer if r["kind"] == "gemm"]  # the tile model alone: within 11 %
    assert sum(predicted(None, r) for r in gemms) == pytest.approx(
        sum(r["seconds"] for r in gemms), rel=0.11)


def test_far_from_every_row_the_roofline_returns():
    table = KernelTable.build(rows(), CURVE, "h100")
    near = abs(table.log_correction(gemm(2048, 6144, 4096)))
    assert near > 0.1  # the table moves the curve's layer GEMM (about 20 %)
    corrections = [abs(table.log_correction(gemm(n, n, n))) for n in (512, 128, 32, 8)]
    assert corrections == sorted(corrections, reverse=True) and corrections[-1] < 0.3 * near
    big = Op(OpKind.COMPUTE, "attention", "compute", Phase.FORWARD,
             kernel=KernelClass.ATTENTION, flops=3e16)
    assert abs(table.log_correction(big)) < 0.1 * abs(
        table.log_correction(big._replace(flops=3e10)))


def test_a_backward_gemm_is_its_input_and_weight_gradients():
    table = KernelTable.build(rows(), ROOFLINE, "h100")
    m, n, k = 2048, 1536, 12288
    dgrad, wgrad = table.log_correction(gemm(m, k, n)), table.log_correction(gemm(k, n, m))
    assert table.log_correction(gemm(m, n, k, Phase.BACKWARD)) == pytest.approx(
        (dgrad + wgrad) / 2)


def test_memory_kernels_read_their_family():
    table = KernelTable.build(rows(), ROOFLINE, "h100")
    def elementwise(name):
        return Op(OpKind.COMPUTE, name, "compute", Phase.FORWARD,
                  kernel=KernelClass.ELEMENTWISE, bytes=67108864.0)
    norm, add, step = (table.log_correction(elementwise(n)) for n in ("ln1", "act", "optimizer"))
    assert norm == table.log_correction(elementwise("final_ln"))
    assert len({round(norm, 9), round(add, 9), round(step, 9)}) == 3


def test_leave_one_out_reports_each_rows_error():
    errors = leave_one_out(rows("gpt3-175b-tp8"), ROOFLINE)
    assert len(errors) == 24 and np.all(np.isfinite(errors))
    gemms = rows("gpt3-175b-tp8")["kind"].to_numpy() == "gemm"
    assert np.median(np.abs(errors[gemms])) < 0.1  # layer GEMMs from their neighbours


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 2**16), st.integers(1, 2**16), st.integers(1, 2**16),
       st.sampled_from([Phase.FORWARD, Phase.BACKWARD]))
def test_every_gemm_gets_a_positive_finite_time(m, n, k, phase):
    seconds = ComputeModel.of(H100, "bf16").duration(gemm(m, n, k, phase))
    assert math.isfinite(seconds) and seconds > 0


SCENARIO = {"name": "t", "cluster": {"preset": "dgx-h100", "nodes": 1},
            "model": {"preset": "gpt3-6.7b"},
            "training": {"seq_len": 2048, "global_batch": 4, "micro_batch": 1},
            "parallelism": {"tp": 2, "dp": 4}}


def test_h100_runs_time_the_layer_by_the_table_and_none_turns_it_off():
    result = run(copy.deepcopy(SCENARIO))
    assert "kernel table h100-sxm-80gb.csv" in result.summary["compute_model"]
    spans = result.spans
    table = rows()
    for r in rows("gpt3-6.7b-tp2").to_dict("records"):
        if r["name"] not in ("qkv", "proj", "fc1", "fc2"):
            continue  # (fc1's shape the sweep measured too: the two times' geometric mean)
        same = table[(table["kind"] == "gemm") & (table["m"] == r["m"]) & (table["n"] == r["n"])
                     & (table["k"] == r["k"])]["seconds"]
        forward = spans[(spans["name"] == r["name"]) & (spans["phase"] == "forward")]
        assert forward["end"].sub(forward["start"]).median() == pytest.approx(
            math.exp(np.log(same).mean()), rel=1e-6)
    off = copy.deepcopy(SCENARIO)
    off["cluster"]["kernel_table"] = "none"
    roofline = run(off).summary
    assert roofline["compute_model"].startswith("roofline; GEMMs by tile model")
    # the tile model alone comes within 5 % of the measured table's compute
    assert roofline["compute_s"] != result.summary["compute_s"]
    assert roofline["compute_s"] == pytest.approx(result.summary["compute_s"], rel=0.05)


def test_a_users_table_is_read_relative_to_the_scenario(tmp_path):
    path = tmp_path / "mine.csv"
    path.write_text("kind,name,m,n,k,seconds,calls\n"
                    "gemm,big,8192,8192,8192,0.003,10\n")  # half the roofline's speed
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"]["kernel_table"] = "mine.csv"
    model = compute_model(from_dict(scenario, base_dir=tmp_path))
    assert "mine.csv (1 rows)" in model.describe()
    assert model.duration(gemm(8192, 8192, 8192)) == pytest.approx(0.003)


@pytest.mark.parametrize(("text", "message"), [
    (None, "cluster.kernel_table: .*missing.csv"),
    ("kind,seconds\nmatmul,1\n", "cluster.kernel_table: .*line 2: kind 'matmul'"),
    ("kind,bytes,seconds,calls\nmemory,100,1,-1\n", "line 2: calls -1 must be a whole number"),
])
def test_a_bad_kernel_table_is_refused_naming_the_field(tmp_path, text, message):
    if text is not None:
        (tmp_path / "missing.csv").write_text(text)
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"]["kernel_table"] = str(tmp_path / "missing.csv")
    with pytest.raises(ScenarioError, match=message):
        from_dict(scenario)


def test_a_low_precision_run_keeps_the_bf16_table_and_scales_its_gemms():
    """An FP8 run's BF16 kernels take the table as a BF16 run's do, and its FP8
    GEMMs BF16's correction at their shape, at the FP8 peak with the GPU file's
    efficiency relative to BF16's."""
    fp8, bf16 = ComputeModel.of(H100, "fp8"), ComputeModel.of(H100, "bf16")
    assert fp8.table is not None and fp8.peak_flops == bf16.peak_flops == H100.peak("bf16")
    gemm = Op(OpKind.COMPUTE, "fc1", "compute", Phase.FORWARD, kernel=KernelClass.GEMM,
              flops=2.0 * 8192 * 8192 * 4096, bytes=0.0, shape=(8192, 8192, 4096))
    low = gemm._replace(kernel=KernelClass.LOWP_GEMM)
    ratio = H100.peak("fp8") / H100.peak("bf16") * H100.low_precision["fp8"]
    assert fp8.duration(gemm) == bf16.duration(gemm)
    # the tile model's pipeline fill holds twice the FP8 elements: only the curve
    # scales a GEMM's whole time by the peaks' ratio
    fp8, bf16 = (replace(m, tiles=None, gemm_half_dim=900.0) for m in (fp8, bf16))
    assert fp8.duration(low) - fp8.kernel_overhead * math.exp(fp8.table.log_correction(low)) \
        == pytest.approx((bf16.duration(gemm) - bf16.kernel_overhead * math.exp(
            bf16.table.log_correction(gemm))) / ratio)
