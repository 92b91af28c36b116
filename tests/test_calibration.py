"""Calibration: the fit recovers known efficiencies, a calibration file changes
compute times as it should, and bad tables or files get clear errors."""

import copy
import importlib.util

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.cli import main
from simulator.compute.calibration import fit, modelled
from simulator.compute.kernel_file import CalibrationError, read_kernels
from simulator.config.scenario import ScenarioError, from_dict
from simulator.runner.setup import compute_model
from tests.conftest import ROOT
from topologies import GPUS
from topologies.gpus import CALIBRATION_FIELDS

TRUE = {"gemm_efficiency": 0.62, "gemm_half_dim": 450.0, "attention_efficiency": 0.41,
        "memory_efficiency": 0.83, "kernel_overhead": 4e-6}


def synthetic(gpu, values, noise=0.0, seed=0) -> pd.DataFrame:
    """A kernel table whose times the compute model gives with ``values``."""
    rows = [{"kind": "gemm", "name": f"g{m}", "m": m, "n": n, "k": k}
            for m, n, k in [(1024, 4096, 1024), (2048, 2048, 2048), (4096, 4096, 4096),
                            (4096, 12288, 4096), (8192, 8192, 8192)]]
    rows += [{"kind": "attention", "name": "a", "flops": f} for f in (1e12, 4e12)]
    rows += [{"kind": "memory", "name": "m", "bytes": b} for b in (1e8, 1e9, 4e9)]
    table = pd.DataFrame(rows, columns=["kind", "name", "m", "n", "k", "flops", "bytes"])
    table["seconds"] = 1.0  # placeholder so the table reads as valid
    table["calls"] = 10  # timed back to back: no launch floor to take off
    path_free = read_kernels_frame(table)
    seconds = modelled(path_free, gpu, values)
    rng = np.random.default_rng(seed)
    path_free["seconds"] = seconds * (1 + noise * rng.standard_normal(len(seconds)))
    return path_free


def read_kernels_frame(table: pd.DataFrame) -> pd.DataFrame:
    import io

    buffer = io.StringIO()
    table.to_csv(buffer, index=False)
    buffer.seek(0)
    return read_kernels(buffer)


@pytest.mark.parametrize("gpu", ["a100-sxm-80gb", "h100-sxm-80gb"])
def test_fit_recovers_known_efficiencies(gpu):
    got = fit(synthetic(GPUS[gpu], TRUE), GPUS[gpu])
    assert got == pytest.approx(TRUE, rel=1e-6)


def test_fit_with_measurement_noise_predicts_the_true_times():
    gpu = GPUS["h100-sxm-80gb"]
    noisy = synthetic(gpu, TRUE, noise=0.02, seed=3)
    got = fit(noisy, gpu)
    assert got["attention_efficiency"] == pytest.approx(TRUE["attention_efficiency"], rel=0.05)
    truth = modelled(noisy, gpu, TRUE)  # parameters trade off; the times they give must not
    assert modelled(noisy, gpu, got) == pytest.approx(truth, rel=0.08)  # 2 % noise per row


def test_kinds_without_rows_keep_the_gpu_files_figures():
    gpu = GPUS["a100-sxm-80gb"]
    table = synthetic(gpu, TRUE)
    got = fit(table[table["kind"] == "gemm"], gpu)
    assert got["attention_efficiency"] == gpu.attention_efficiency
    assert got["memory_efficiency"] == gpu.memory_efficiency


def write_calibration(tmp_path, **changes) -> str:
    gpu = GPUS["a100-sxm-80gb"]
    values = {"gpu": gpu.name, **{k: getattr(gpu, k) for k in CALIBRATION_FIELDS},
              "gemm_half_dim": 700.0, **changes}  # a calibration fits the size curve
    path = tmp_path / "cal.yaml"
    path.write_text(yaml.safe_dump(values))
    return str(path)


SCENARIO = {"name": "cal", "cluster": {"preset": "dgx-a100", "nodes": 1},
            "model": {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 4096},
            "training": {"seq_len": 1024, "global_batch": 8}, "parallelism": {"dp": 8}}


def gemm_seconds(scenario_dict) -> float:
    op = Op(OpKind.COMPUTE, "g", "compute", Phase.FORWARD, kernel=KernelClass.GEMM,
            flops=2 * 8192**3, bytes=6 * 8192**2, shape=(8192, 8192, 8192))
    return compute_model(from_dict(scenario_dict)).duration(op)


def test_a_calibration_file_changes_compute_times_as_expected(tmp_path):
    gpu = GPUS["a100-sxm-80gb"]
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"]["calibration"] = write_calibration(tmp_path)  # the file's figures
    scenario.setdefault("training", {})["kernel_launch"] = "0 s"
    base = gemm_seconds(scenario) - gpu.kernel_overhead
    x = 8192.0  # the size curve's efficiency at 8192^3, not the tile model's
    curve = 2 * 8192**3 / (gpu.peak("bf16") * gpu.gemm_efficiency * x / (x + 700.0))
    assert base == pytest.approx(curve, rel=1e-12)
    normal = run(copy.deepcopy(scenario)).summary
    scenario["cluster"]["calibration"] = write_calibration(
        tmp_path, gemm_efficiency=gpu.gemm_efficiency / 2)
    assert gemm_seconds(scenario) - gpu.kernel_overhead == pytest.approx(2 * base, rel=1e-12)
    slower = run(scenario).summary
    # without the host's launches (kernel_launch 0: no kernel waits for one) the
    # GEMMs take twice as long; the element-wise kernels and the optimizer do not move
    gemms = slower["compute_s_by_kind"]["gemm"], normal["compute_s_by_kind"]["gemm"]
    assert gemms[0] == pytest.approx(2 * gemms[1], rel=0.05)
    assert slower["compute_s"] > 1.3 * normal["compute_s"]


@pytest.mark.parametrize(("changes", "message"), [
    ({"gpu": "h100-sxm-80gb"}, "cluster.calibration: .* was fitted for gpu 'h100-sxm-80gb', "
                               "but the cluster's GPU is 'a100-sxm-80gb'"),
    ({"gemm_efficiency": 1.4}, "cluster.calibration: gemm_efficiency 1.4 must be in \\[0.01, 1\\]"),
    ({"speed": 2}, "cluster.calibration: unknown key 'speed'"),
])
def test_bad_calibration_files_are_refused(tmp_path, changes, message):
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"]["calibration"] = write_calibration(tmp_path, **changes)
    with pytest.raises(ScenarioError, match=message):
        from_dict(scenario)


def test_calibrate_command_end_to_end(tmp_path, capsys):
    gpu = GPUS["h100-sxm-80gb"]
    table = synthetic(gpu, TRUE)
    kernels = tmp_path / "kernels.csv"
    table.to_csv(kernels, index=False)
    out = tmp_path / "h100.yaml"
    assert main(["calibrate", str(kernels), "--gpu", gpu.name, "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "gemm_efficiency" in printed and "worst 0.0 %" in printed
    written = yaml.safe_load(out.read_text())
    assert written["gpu"] == gpu.name and written["gemm_efficiency"] == pytest.approx(0.62)
    assert written["fit"]["rows"] == len(table)
    scenario = copy.deepcopy(SCENARIO)
    scenario["cluster"] = {"preset": "dgx-h100", "nodes": 1, "calibration": str(out)}
    assert from_dict(scenario).gpu.attention_efficiency == pytest.approx(0.41)


@pytest.mark.parametrize(("csv", "message"), [
    ("kind,seconds\nmatmul,1\n", "line 2: kind 'matmul' is not one of gemm, attention, memory"),
    ("kind,m,n,seconds\ngemm,1,2,1\n", "line 2: k (no such column) must be a positive number"),
    ("name,seconds\nx,1\n", "no 'kind' column"),
    ("kind,bytes,seconds\nmemory,1000,abc\n", "line 2: seconds 'abc' must be a positive number"),
    ("kind,bytes,seconds\nmemory,1000,nan\n", "line 2: seconds"),
    ("kind,name,m,n,k,flops,bytes,seconds\n", "the kernel table has no rows"),
    ("kind,seconds,seconds\nmemory,1,2\n", "the column 'seconds' is given twice"),
    ("kind,bytes,flops,seconds\nmemory,1000,inf,1\n", "line 2: flops inf is not finite"),
])
def test_bad_kernel_tables_exit_2(tmp_path, capsys, csv, message):
    path = tmp_path / "k.csv"
    path.write_text(csv)
    code = main(["calibrate", str(path), "--gpu", "a100-sxm-80gb", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    with pytest.raises(CalibrationError):
        read_kernels(path)


def test_measure_kernels_uses_the_simulators_gemm_shapes():
    spec = importlib.util.spec_from_file_location(
        "measure_kernels", ROOT / "scripts" / "measure_kernels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    shapes = {name: (m, n, k) for name, m, n, k in module.gemm_shapes("gpt3-6.7b", 2, 2048, 1)}
    assert shapes["qkv"] == (2048, 3 * 4096 // 2, 4096)
    assert shapes["fc2"] == (2048, 4096, 4 * 4096 // 2)
    assert shapes["square8192"] == (8192, 8192, 8192)
    assert module.COLUMNS == ("kind", "name", "m", "n", "k", "flops", "bytes", "seconds",
                              "calls", "dtype")


def test_a_fit_outside_what_a_scenario_accepts_is_refused(tmp_path, capsys):
    """Two memory rows of one size cannot separate bandwidth from overhead; the
    fallback's figure (0.05 % of HBM bandwidth) is refused, not written as 0.0."""
    path = tmp_path / "k.csv"
    path.write_text("kind,bytes,seconds,calls\nmemory,1000000,0.001,10\n"
                    "memory,1000000,0.0011,10\n")
    out = tmp_path / "c.yaml"
    code = main(["calibrate", str(path), "--gpu", "a100-sxm-80gb", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "memory_efficiency: the table gives 0.000468, outside [0.01, 1]" in err
    assert not out.exists()
