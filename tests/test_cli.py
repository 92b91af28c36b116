"""End to end: the clustersim command on the quick-start scenario."""

import json
import subprocess
import sys

import pandas as pd
import pytest

from simulator.cli import main
from tests.conftest import QUICKSTART, ROOT

SUMMARY_KEYS = {
    "iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "gpus", "compute_s",
    "exposed_comm_s", "overlapped_comm_s", "comm_wait_s", "bubble_s", "peak_memory_gib",
    "events", "wall_s",
}


@pytest.fixture(scope="module")
def quickstart_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("quickstart")
    assert main(["run", str(QUICKSTART), "--out", str(out)]) == 0
    return out


def test_summary_has_the_contract_keys(quickstart_run):
    summary = json.loads((quickstart_run / "summary.json").read_text())
    assert summary.keys() >= SUMMARY_KEYS
    assert summary["gpus"] == 16
    assert 0 < summary["mfu"] < 1
    assert summary["events"] > 0 and summary["wall_s"] > 0
    assert summary["tokens_per_s"] == pytest.approx(32 * 2048 / summary["iteration_time_s"])
    parts = sum(summary[k] for k in ("compute_s", "exposed_comm_s", "comm_wait_s", "bubble_s",
                                     "idle_s"))
    assert parts == pytest.approx(summary["iteration_time_s"])


def test_spans_csv_has_one_row_per_span(quickstart_run):
    spans = pd.read_csv(quickstart_run / "spans.csv")
    assert list(spans.columns)[:6] == ["rank", "node", "stream", "kind", "name", "start"]
    assert set(spans["kind"]) == {"compute", "comm", "wait"}
    assert spans["rank"].nunique() == 16 and set(spans["node"]) == {0, 1}
    summary = json.loads((quickstart_run / "summary.json").read_text())
    assert spans["end"].max() == pytest.approx(summary["iteration_time_s"])
    comms = pd.read_csv(quickstart_run / "comms.csv")
    assert len(comms) == summary["buckets"]
    assert (comms["ranks"] == 16).all()
    assert set(comms["algorithm"]) <= {"ring", "tree"} and set(comms["protocol"]) <= {
        "ll", "ll128", "simple"}


def test_chrome_trace_is_valid_trace_event_json(quickstart_run):
    trace = json.loads((quickstart_run / "trace.json").read_text())
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    meta = [e for e in events if e["ph"] == "M"]
    spans = pd.read_csv(quickstart_run / "spans.csv")
    assert len(complete) == len(spans)
    for e in complete:
        assert {"name", "cat", "ts", "dur", "pid", "tid", "args"} <= e.keys()
        assert e["dur"] >= 0 and isinstance(e["pid"], int) and isinstance(e["tid"], int)
    processes = {e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {"node 0", "node 1"}
    threads = {e["args"]["name"] for e in meta if e["name"] == "thread_name"}
    assert "rank 0 n0.gpu0 compute" in threads and "rank 15 n1.gpu7 dp" in threads


def test_gantt_and_scenario_copy(quickstart_run):
    assert (quickstart_run / "gantt.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (quickstart_run / "memory.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "dgx-a100" in (quickstart_run / "scenario.yaml").read_text()


@pytest.mark.parametrize(("fmt", "magic"), [("pdf", b"%PDF"), ("svg", b"<?xml")])
def test_other_figure_formats(tmp_path, fmt, magic):
    args = ["run", str(QUICKSTART), "--out", str(tmp_path), "--format", fmt,
            "--set", "model.preset=gpt3-125m"]
    assert main(args) == 0
    assert (tmp_path / f"gantt.{fmt}").read_bytes()[:len(magic)] == magic
    assert (tmp_path / f"memory.{fmt}").read_bytes()[:len(magic)] == magic


def test_json_flag_and_overrides(tmp_path, capsys):
    args = ["run", str(QUICKSTART), "--out", str(tmp_path), "--json",
            "--set", "model.preset=gpt3-350m", "--set", "cluster.nic_bandwidth=100 Gb/s"]
    assert main(args) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads((tmp_path / "summary.json").read_text())
    assert printed["parameters"] < 0.5e9


def test_human_summary(tmp_path, capsys):
    assert main(["run", str(QUICKSTART), "--out", str(tmp_path),
                 "--set", "model.preset=gpt3-125m"]) == 0
    text = capsys.readouterr().out
    assert "iteration time" in text and "MFU" in text and "events" in text


@pytest.mark.parametrize(("override", "message"), [
    ("cluster.nodes=0", "error: cluster.nodes: 0 must be an integer >= 1"),
    ("parallelism.dp=5", "error: parallelism.dp: 5 must divide the GPU count 16"),
    ("cluster.preset=nope", "error: cluster.preset: 'nope' is not one of"),
    ("cluster.nic_bandwidth=0 GB/s", "error: cluster.nic_bandwidth: '0 GB/s' must be positive"
                                     .replace("must be positive", "must be a positive")),
    ("training.global_batch=20", "error: training.global_batch: 20 must be divisible by"),
    ("model.colour=blue", "error: model.colour: unknown key"),
])
def test_bad_input_exits_2_with_one_line(tmp_path, capsys, override, message):
    code = main(["run", str(QUICKSTART), "--out", str(tmp_path / "x"), "--set", override])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "x").exists(), "nothing runs before the input is checked"


def test_python_dash_m_and_presets(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "simulator", "run", str(QUICKSTART), "--out", str(tmp_path),
         "--json", "--set", "model.preset=gpt3-125m"],
        capture_output=True, text=True, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["gpus"] == 16
    listing = subprocess.run([sys.executable, "-m", "simulator", "presets"],
                             capture_output=True, text=True, check=True).stdout
    for name in ("dgx-a100", "dgx-h100", "polaris", "h200-sxm-141gb", "gpt3-1.3b", "llama3-8b"):
        assert name in listing


def test_the_command_leaves_with_mains_code_and_its_output_flushed(tmp_path):
    """``console`` skips freeing the run's objects at exit: the exit code and the
    output are still main's, a piped reader that leaves early is no error, and
    the printed wall time counts the imports."""
    missing = subprocess.run([sys.executable, "-m", "simulator", "run", "no/such.yaml"],
                             capture_output=True, text=True, check=False)
    assert missing.returncode == 2 and missing.stderr.startswith("error: no/such.yaml")
    done = subprocess.run([sys.executable, "-m", "simulator", "run", str(QUICKSTART), "--out",
                           str(tmp_path), "--set", "model.preset=gpt3-125m"],
                          capture_output=True, text=True, cwd=ROOT, check=True)
    assert done.stdout.rstrip().endswith(f"outputs          {tmp_path}/")
    head = subprocess.run(f"{sys.executable} -m simulator presets | head -1", shell=True,
                          capture_output=True, text=True, check=False)
    assert head.returncode == 0 and head.stdout.startswith("clusters") and not head.stderr


def test_missing_file_is_a_clean_error(capsys):
    assert main(["run", "no/such/file.yaml"]) == 2
    assert capsys.readouterr().err.startswith("error: no/such/file.yaml: cannot read")


def test_same_scenario_same_files_byte_for_byte(tmp_path):
    outs = []
    for name in ("a", "b"):
        out = tmp_path / name
        assert main(["run", str(QUICKSTART), "--out", str(out),
                     "--set", "model.preset=gpt3-350m"]) == 0
        outs.append(out)
    for file in ("trace.json", "spans.csv", "comms.csv", "comms.parquet", "scenario.yaml",
                 "ranks.csv", "streams.csv", "critical_path.csv", "gantt.png", "memory.png"):
        assert (outs[0] / file).read_bytes() == (outs[1] / file).read_bytes(), file
    a, b = (json.loads((o / "summary.json").read_text()) for o in outs)
    a.pop("wall_s"), b.pop("wall_s")
    assert a == b


def test_collective_tool_prints_the_nccl_tests_table(tmp_path, capsys):
    csv = tmp_path / "ar.csv"
    args = ["collective", "--cluster", "dgx-a100", "--nodes", "2", "--op", "all_reduce",
            "--min-bytes", "1M", "--max-bytes", "8G", "--csv", str(csv)]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "(B)" in out and "algbw" in out and "busbw" in out and "Avg bus bandwidth" in out
    table = pd.read_csv(csv)
    assert table["size"].tolist() == [2**k for k in range(20, 34)]
    assert (table["count"] == table["size"] // 4).all()
    assert table["busbw"].tolist() == pytest.approx((table["algbw"] * 2 * 15 / 16).tolist(),
                                                    rel=1e-6)
    assert table["busbw"].is_monotonic_increasing


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter", "broadcast", "reduce",
                                "all_to_all", "send_recv", "alltoall", "sendrecv"])
def test_collective_tool_runs_every_operation(op, capsys):
    args = ["collective", "--cluster", "polaris", "--nodes", "2", "--op", op, "-b", "8",
            "-e", "64M", "-f", "64", "--group", "0-5"]
    assert main(args) == 0
    rows = [line for line in capsys.readouterr().out.splitlines() if not line.startswith("#")]
    assert len(rows) == 4  # 8 B, 512 B, 32 KiB, 2 MiB


def test_collective_tool_forced_choices(capsys):
    args = ["collective", "--cluster", "dgx-h100", "--op", "all_reduce", "-b", "1G", "-e", "1G",
            "--algorithm", "ring", "--protocol", "ll128", "--set", "nvlink_bandwidth=900 GB/s"]
    assert main(args) == 0
    assert "ring      ll128" in capsys.readouterr().out


def test_collective_tool_names_the_operations_it_knows(capsys):
    with pytest.raises(SystemExit) as exit_code:
        main(["collective", "--cluster", "dgx-a100", "--op", "alltoallv"])
    assert exit_code.value.code == 2
    assert "--op: 'alltoallv' is not one of: all_reduce" in capsys.readouterr().err


@pytest.mark.parametrize(("args", "message"), [
    (["--min-bytes", "1X"], "error: collective: '1X' is not a size"),
    (["--group", "0-99"], "error: collective: '0-99' is outside ranks 0-15"),
    (["--algorithm", "nvls"], "error: network.algorithm: 'nvls' needs an NVSwitch"),
    (["--set", "nic_bandwidth=fast"], "error: cluster.nic_bandwidth: 'fast' is not a bandwidth"),
])
def test_collective_tool_bad_input(capsys, args, message):
    base = ["collective", "--cluster", "dgx-a100", "--nodes", "2"]
    assert main(base + args) == 2
    assert capsys.readouterr().err.startswith(message)
