"""Sweeps: design expansion and validation, nothing lost (failures, interruption,
resume), local workers and a real Dask cluster, and the CLI."""

import json

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.experiments import sweep
from simulator.experiments.sweep_design import Case, SweepError, expand, split_values

BASE = {
    "name": "sweep-base",
    "seed": 1,
    "cluster": {"preset": "dgx-a100", "nodes": 1, "compute_jitter": 0.0},
    "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1024},
    "training": {"seq_len": 256, "global_batch": 16, "micro_batch": 1},
    "parallelism": {"dp": 8},
}
GRID = {"cluster.nic_bandwidth": ["100 Gb/s", "200 Gb/s"], "training.seq_len": [128, 256],
        "parallelism.dp": [8, 3]}  # dp=3 does not divide 8 GPUs: invalid


@pytest.fixture
def base_file(tmp_path):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    return path


def comparable(table: pd.DataFrame) -> pd.DataFrame:
    """The table without the one column that measures this machine."""
    return table.drop(columns=["wall_s"]).reset_index(drop=True)


def test_grid_is_the_cartesian_product_in_order():
    cases = expand(GRID)
    assert len(cases) == 8
    assert cases[0].overrides == (("cluster.nic_bandwidth", "100 Gb/s"),
                                  ("training.seq_len", 128), ("parallelism.dp", 8))
    assert cases[-1].overrides[0] == ("cluster.nic_bandwidth", "200 Gb/s")
    assert len({c.id for c in cases}) == 8 and Case(cases[3].overrides).id == cases[3].id


def test_zip_pairs_and_must_have_equal_lengths():
    cases = expand({"a": [1, 2]}, {"b": [1, 2, 3], "c": [4, 5, 6]})
    assert len(cases) == 6 and cases[1].overrides == (("a", 1), ("b", 2), ("c", 5))
    with pytest.raises(SweepError, match="zip: lists must have equal lengths, got b 2, c 3"):
        expand({}, {"b": [1, 2], "c": [4, 5, 6]})
    with pytest.raises(SweepError, match="a: 3 must be a non-empty list"):
        expand({"a": 3})


def test_values_split_on_top_level_commas():
    assert split_values("12.5 GB/s,25 GB/s") == ["12.5 GB/s", "25 GB/s"]
    assert split_values("[3, 5],[4, 4]") == [[3, 5], [4, 4]]
    assert split_values("1,2,true") == [1, 2, True]


def test_invalid_cases_are_reported_and_skipped(base_file, tmp_path):
    results, invalid = sweep.sweep(base_file, GRID, {}, tmp_path / "out")
    assert len(invalid) == 4 and all("parallelism.dp: 3 must divide" in e
                                      for e in invalid.values())
    table = results.table()
    assert len(table) == 4 and (table["status"] == "ok").all()
    assert len(pd.read_csv(tmp_path / "out" / "invalid.csv")) == 4
    assert {"cluster.nic_bandwidth", "model.hidden", "iteration_time_s", "mfu",
            "critical_path.compute_s", "memory_gib.parameters"} <= set(table.columns)
    parquet = pd.read_parquet(tmp_path / "out" / "results.parquet")
    assert comparable(parquet).equals(comparable(table))


def test_a_failing_case_does_not_stop_the_others(base_file, tmp_path, monkeypatch):
    from simulator.runner import simulate as runner

    real = runner.run

    def flaky(scenario, **kwargs):
        if scenario.training.seq_len == 128 and scenario.machine.cluster.nic_bandwidth < 20e9:
            raise RuntimeError("boom")
        return real(scenario, **kwargs)

    monkeypatch.setattr(runner, "run", flaky)  # forked workers inherit it
    for workers in (1, 2):
        results, _ = sweep.sweep(base_file, GRID, {}, tmp_path / f"out{workers}",
                                 workers=workers)
        table = results.table()
        assert list(table["status"]) == ["failed", "ok", "ok", "ok"]
        assert table["error"].iloc[0] == "RuntimeError: boom"
    monkeypatch.setattr(runner, "run", real)
    results, _ = sweep.sweep(base_file, GRID, {}, tmp_path / "out1")  # failures stay
    assert list(results.table()["status"]) == ["failed", "ok", "ok", "ok"]
    results, _ = sweep.sweep(base_file, GRID, {}, tmp_path / "out1", retry_failed=True)
    assert (results.table()["status"] == "ok").all()


def test_interrupted_and_resumed_equals_uninterrupted(base_file, tmp_path, monkeypatch):
    whole, _ = sweep.sweep(base_file, GRID, {}, tmp_path / "whole", workers=2)
    real = sweep.execute

    def interrupted(*args, **kwargs):
        for n, row in enumerate(real(*args, **kwargs)):
            if n == 2:
                raise KeyboardInterrupt  # Ctrl-C after two cases ended
            yield row

    monkeypatch.setattr(sweep, "execute", interrupted)
    with pytest.raises(KeyboardInterrupt):
        sweep.sweep(base_file, GRID, {}, tmp_path / "part", workers=2)
    partial = pd.read_csv(tmp_path / "part" / "results.csv")
    assert len(partial) == 2, "a consistent table of the cases that finished"
    with open(tmp_path / "part" / "results.jsonl", "a") as log:
        log.write('{"case": "cut sho')  # a crash in the middle of a line
    monkeypatch.setattr(sweep, "execute", real)
    real_case, ran = sweep.run_case, []

    def counting(*args):
        ran.append(args[-1])
        return real_case(*args)

    monkeypatch.setattr(sweep, "run_case", counting)
    resumed, _ = sweep.sweep(base_file, GRID, {}, tmp_path / "part", workers=1)
    assert len(ran) == 2, "only the unfinished cases run again"
    assert comparable(resumed.table()).equals(comparable(whole.table()))


def test_another_base_in_the_same_directory_is_refused(base_file, tmp_path):
    sweep.sweep(base_file, {"training.seq_len": [128]}, {}, tmp_path / "out")
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**BASE, "seed": 2}))
    with pytest.raises(SweepError, match="holds a sweep of a different base"):
        sweep.sweep(other, {"training.seq_len": [128]}, {}, tmp_path / "out")


def test_dask_path_on_a_local_cluster(base_file, tmp_path):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        results, invalid = sweep.sweep(base_file, GRID, {}, tmp_path / "dask",
                                       dask=cluster.scheduler_address)
    local, _ = sweep.sweep(base_file, GRID, {}, tmp_path / "local")
    assert len(invalid) == 4
    assert comparable(results.table()).equals(comparable(local.table()))


def test_cli_sweep_file_and_plot(base_file, tmp_path, capsys):
    design = tmp_path / "design.yaml"
    design.write_text(yaml.safe_dump({"base": "base.yaml",
                                      "grid": {"cluster.nic_bandwidth": ["50 Gb/s", "200 Gb/s"]},
                                      "zip": {"training.seq_len": [128, 256],
                                              "training.global_batch": [8, 16]}}))
    out = tmp_path / "out"
    assert main(["sweep", str(design), "--out", str(out), "--workers", "1"]) == 0
    assert "4 cases" in capsys.readouterr().out
    assert main(["plot", str(out), "--x", "cluster.nic_bandwidth", "--y", "mfu",
                 "--hue", "training.seq_len"]) == 0
    assert (out / "plot.png").read_bytes()[:4] == b"\x89PNG"
    assert main(["plot", str(out), "--x", "cluster.nic_bandwidth", "--y", "training.seq_len",
                 "--z", "iteration_time_s", "--out", str(out / "heat.svg")]) == 0
    assert (out / "heat.svg").read_bytes()[:5] == b"<?xml"
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4


@pytest.mark.parametrize(("args", "message"), [
    (["sweep", "{base}", "--out", "{out}", "--grid", "parallelism.dp"],
     "error: --grid: 'parallelism.dp' must look like key.path=value1,value2"),
    (["sweep", "{base}", "--out", "{out}"], "error: sweep: give --grid"),
    (["sweep", "{base}", "--out", "{out}", "--zip", "a=1,2", "--zip", "b=1"],
     "error: zip: lists must have equal lengths"),
    (["plot", "{out}", "--x", "nope", "--y", "mfu"], "error: {out}: no results.parquet"),
])
def test_bad_sweep_arguments_exit_2(base_file, tmp_path, capsys, args, message):
    out = tmp_path / "out"
    code = main([a.format(base=base_file, out=out) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message.format(out=out)) and err.count("\n") == 1


def test_the_table_follows_the_current_design(base_file, tmp_path):
    out = tmp_path / "out"
    sweep.sweep(base_file, {"training.seq_len": [128, 256]}, {}, out)
    results, _ = sweep.sweep(base_file, {"training.seq_len": [256, 512]}, {}, out)
    assert list(results.table()["training.seq_len"]) == [256, 512]
    assert len((out / "results.jsonl").read_text().splitlines()) == 3, "the log keeps all"


def test_ctrl_c_leaves_a_consistent_table_and_the_sweep_resumes(tmp_path):
    """A real SIGINT to the command's process group, as Ctrl-C sends it."""
    import os
    import signal
    import subprocess
    import sys
    import time

    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump({**BASE, "model": {"preset": "gpt3-1.3b"},
                                    "training": {"seq_len": 2048, "global_batch": 64},
                                    "simulation": {"symmetry": "full"}}))  # slow enough
    out = tmp_path / "out"
    command = [sys.executable, "-m", "simulator", "sweep", str(base), "--out", str(out),
               "--workers", "1", "--grid", "cluster.nic_bandwidth=" + ",".join(
                   f"{10 * (n + 1)} Gb/s" for n in range(12))]
    def as_from_a_shell() -> None:  # a shell starts commands with Ctrl-C's default action,
        signal.signal(signal.SIGINT, signal.SIG_DFL)  # whatever this test process ignores

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True, preexec_fn=as_from_a_shell)
    log = out / "results.jsonl"
    deadline = time.time() + 60
    while time.time() < deadline and not (log.exists() and log.read_text().count("\n") >= 1):
        time.sleep(0.05)
    os.killpg(process.pid, signal.SIGINT)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130 and "Traceback" not in err and "interrupted" in err
    finished = log.read_text().count("\n")
    assert 1 <= finished < 12
    assert len(pd.read_csv(out / "results.csv")) == finished
    done = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(pd.read_csv(out / "results.csv")) == 12
    assert log.read_text().count("\n") == 12, "finished cases did not run again"


def test_the_python_api_runs_a_sweep(tmp_path):
    """``simulator.sweep`` (the API page's) runs the cases and returns their table."""
    import simulator
    from tests.conftest import QUICKSTART

    table = simulator.sweep(QUICKSTART, grid={"cluster.compute_jitter": [0.0, 0.01]},
                            out=tmp_path / "api")
    assert len(table) == 2 and set(table["status"]) == {"ok"}
    assert (tmp_path / "api" / "results.csv").exists()
