"""``clustersim calibrate`` reads a PyTorch profiler trace: operators' shapes
from ``Input Dims``, their kernels' GPU times summed by ``External id``, NCCL
and unknown kernels skipped, and the fit recovers the efficiencies the trace
was made with."""

import copy
import gzip
import json

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.compute.calibration import modelled
from simulator.compute.kernel_file import CalibrationError
from simulator.compute.kineto import classify, gemm_shape, kernel_table
from simulator.config.scenario import from_dict
from simulator.runner.setup import compute_model
from tests.test_calibration import TRUE, read_kernels_frame
from topologies import GPUS

BF16 = "c10::BFloat16"
OPS = [  # (operator, input dims, kernels it launches)
    ("aten::mm", [[2048, 4096], [4096, 6144]], 1),
    ("aten::addmm", [[4096], [2048, 2048], [2048, 4096]], 1),
    ("aten::mm", [[8192, 8192], [8192, 8192]], 1),
    ("aten::bmm", [[8, 2048, 2048], [8, 2048, 2048]], 1),  # compute-bound, as the fit needs
    ("aten::mm", [[1024, 1024], [1024, 1024]], 1),
    ("aten::_scaled_dot_product_flash_attention", [[1, 16, 2048, 128]] * 3, 1),
    ("aten::_scaled_dot_product_flash_attention_backward", [[1, 16, 2048, 128]] * 4, 3),
    ("aten::native_layer_norm", [[2048, 4096], [4096], [4096], [4096]], 1),
    ("aten::native_layer_norm", [[16384, 4096], [4096], [4096], [4096]], 1),
    ("aten::add", [[2048, 4096], [2048, 4096]], 1),
    ("aten::add", [[65536, 4096], [65536, 4096]], 1),
]


def trace(ops=OPS, seconds=None, extra=()) -> dict:
    """A Chrome trace as torch.profiler exports it: a cpu_op per operator and its
    kernels, linked by External id; an NCCL kernel and an unknown operator too."""
    events, ts = [], 0.0
    for i, (name, dims, kernels) in enumerate(ops):
        events.append({"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": 5.0,
                       "pid": 1, "tid": 1, "args": {"External id": i + 1, "Input Dims": dims,
                                                    "Input type": [BF16] * len(dims)}})
        total = 1e6 * (seconds[i] if seconds is not None else 1e-5)
        for j in range(kernels):
            events.append({"ph": "X", "cat": "kernel", "name": f"kernel_{i}_{j}", "ts": ts,
                           "dur": total / kernels, "pid": 0, "tid": 7,
                           "args": {"External id": i + 1, "stream": 7}})
        ts += 100.0
    events.append({"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_bf16",
                   "ts": ts, "dur": 50.0, "args": {"External id": 999}})
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::nonzero", "ts": ts, "dur": 1.0,
                   "args": {"External id": 998, "Input Dims": [[10]]}})
    events.append({"ph": "X", "cat": "kernel", "name": "nonzero_kernel", "ts": ts, "dur": 3.0,
                   "args": {"External id": 998}})
    return {"traceEvents": events + list(extra), "displayTimeUnit": "ms"}


def true_seconds(gpu):
    rows = pd.DataFrame([{**classify({"name": n, "args": {"Input Dims": d,
                                                          "Input type": [BF16] * len(d)}}),
                          "seconds": 1.0, "calls": 0} for n, d, _ in OPS])
    return modelled(read_kernels_frame(rows), gpu, TRUE)


def test_operators_map_to_shapes():
    assert gemm_shape("aten::mm", [[2048, 4096], [4096, 6144]]) == (2048, 6144, 4096)
    assert gemm_shape("aten::addmm", [[6144], [2048, 4096], [4096, 6144]]) == (2048, 6144, 4096)
    assert gemm_shape("aten::bmm", [[32, 1024, 128], [32, 128, 1024]]) == (32768, 1024, 128)
    back = classify({"name": "aten::_scaled_dot_product_flash_attention_backward",
                     "args": {"Input Dims": [[2, 16, 4096, 128]] * 4}})
    assert back["name"] == "attention_backward" and back["flops"] == 2 * 4 * 2 * 16 * 4096**2 * 128
    norm = classify({"name": "aten::native_layer_norm",
                     "args": {"Input Dims": [[2048, 4096], [4096], [4096], [4096]]}})
    assert norm["name"] == "layernorm" and norm["bytes"] == 2 * (2048 * 4096 * 2 + 3 * 4096)
    assert classify({"name": "aten::nonzero", "args": {"Input Dims": [[10]]}}) is None


def test_the_trace_becomes_a_kernel_table(tmp_path):
    path = tmp_path / "step.json"
    path.write_text(json.dumps(trace()))
    table, report = kernel_table(path)
    assert report["kernels"] == 13 + 2 and report["nccl"] == 1
    assert report["unmapped"] == {"aten::nonzero": 1}
    assert report["kinds"] == {"gemm": 5, "memory": 4, "attention": 2}
    backward = table[table["name"] == "attention_backward"]
    assert backward["seconds"].item() == pytest.approx(1e-5)  # three kernels, summed
    assert set(table["calls"]) == {0}  # GPU timestamps: no launch floor


def test_calibrate_from_a_gzipped_trace_recovers_the_efficiencies(tmp_path, capsys):
    gpu = GPUS["h100-sxm-80gb"]
    path = tmp_path / "step.pt.trace.json.gz"
    with gzip.open(path, "wt") as file:
        json.dump(trace(seconds=true_seconds(gpu)), file)
    out, csv = tmp_path / "cal.yaml", tmp_path / "kernels.csv"
    assert main(["calibrate", str(path), "--gpu", gpu.name, "--out", str(out),
                 "--table", str(csv)]) == 0
    printed = capsys.readouterr().out
    assert "11 operator calls mapped to 11 shapes" in printed and "1 NCCL skipped" in printed
    assert "aten::nonzero (1)" in printed
    written = yaml.safe_load(out.read_text())
    for key, value in TRUE.items():
        assert written[key] == pytest.approx(value, rel=1e-4), key
    scenario = {"name": "k", "cluster": {"preset": "dgx-h100", "nodes": 1,
                                         "kernel_table": str(csv)},
                "model": {"layers": 2, "hidden": 1024, "heads": 8, "vocab": 4096},
                "training": {"seq_len": 1024, "global_batch": 8}, "parallelism": {"dp": 8}}
    assert "kernels.csv (11 rows)" in compute_model(from_dict(copy.deepcopy(scenario))).describe()


@pytest.mark.parametrize(("text", "message"), [
    ("not json", "not a Chrome-trace JSON file"),
    ('{"other": 1}', "no 'traceEvents' list"),
    ('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "dur": 1}]}',
     "no GPU kernel of a GEMM, attention or memory-bound operator with shapes"),
])
def test_bad_traces_exit_2_with_the_reason(tmp_path, capsys, text, message):
    path = tmp_path / "t.json"
    path.write_text(text)
    code = main(["calibrate", str(path), "--gpu", "h100-sxm-80gb", "--out",
                 str(tmp_path / "c.yaml")])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1
    with pytest.raises(CalibrationError):
        kernel_table(path)


def test_table_is_only_for_traces(tmp_path, capsys):
    path = tmp_path / "k.csv"
    path.write_text("kind,bytes,seconds\nmemory,1000000,0.001\n")
    code = main(["calibrate", str(path), "--gpu", "h100-sxm-80gb", "--out",
                 str(tmp_path / "c.yaml"), "--table", str(tmp_path / "t.csv")])
    assert code == 2 and "--table: only a profiler trace" in capsys.readouterr().err
