"""Run directories under concurrency, interruption, damage and resource limits
(issue 36): a directory holds one whole run or the one before, never a mix;
a second writer is refused; every reader checks what it reads and names the
damaged file; kills and Ctrl-C leave nothing half written; I/O errors and
memory exhaustion are reported as what they are."""

from __future__ import annotations

import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from simulator.cli import main
from simulator.outputs import out_dirs, run_dir
from tests.test_hardening import TINY, one_error

ROOT = Path(__file__).resolve().parents[1]
READERS = (["gantt"], ["comms"], ["trace"], ["blame"])
LINUX = pytest.mark.skipif(sys.platform != "linux", reason="reads /proc, Linux signals")


@pytest.fixture(scope="module")
def finished(tmp_path_factory) -> Path:
    """A tiny pipelined run's directory, written once; tests damage copies."""
    folder = tmp_path_factory.mktemp("finished")
    path = folder / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(path), "--out", str(folder / "run")]) == 0
    return folder / "run"


def copy_of(finished: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(finished, tmp_path / "run"))


def read_error(capsys, run: Path) -> str:
    """Every reader refuses ``run`` with one line; the message (the same for all)."""
    messages = set()
    for reader in READERS:
        err = one_error(capsys, main([*reader, str(run), *(
            ["--out", str(run.parent / "x.png")] if reader[0] in ("gantt", "blame") else
            ["--out", str(run.parent / "x.json")] if reader[0] == "trace" else [])]))
        messages.add(err)
    assert len(messages) == 1, messages
    return messages.pop()


# 13. damaged run directories --------------------------------------------------------

@pytest.mark.parametrize(("damage", "named"), [
    (lambda run: (run / "summary.json").write_text("[1, 2]"), "summary.json: damaged"),
    (lambda run: (run / "summary.json").write_text("{}"), "summary.json: damaged"),
    (lambda run: (run / "scenario.yaml").write_text("- a\n"), "scenario.yaml: damaged"),
    (lambda run: (run / "placement.csv").unlink(), "placement.csv: missing"),
    (lambda run: (run / "placement.csv").write_text("rank,gpu,node\n0,a,0\n"),
     "placement.csv: damaged"),
    (lambda run: pd.DataFrame({"x": [1]}).to_parquet(run / "spans.parquet"),
     "spans.parquet: damaged"),
    (lambda run: (run / "manifest.json").unlink(), "no manifest.json"),
    (lambda run: (run / "manifest.json").write_text("{"), "manifest.json: damaged"),
    (lambda run: (run / "classes.csv").write_text("rank,representative\n0,0\n"),
     "classes.csv: not part of this run"),
])
def test_a_damaged_run_is_refused_naming_the_file(finished, tmp_path, capsys, damage, named):
    run = copy_of(finished, tmp_path)
    damage(run)
    assert named in read_error(capsys, run)


def test_a_file_from_another_run_is_refused(finished, tmp_path, capsys):
    """A directory mixing two runs (what a kill -9 used to leave): refused."""
    other = tmp_path / "other.yaml"
    other.write_text(yaml.safe_dump({**TINY, "name": "other", "model": {
        **TINY["model"], "layers": 4}}))
    assert main(["run", str(other), "--out", str(tmp_path / "b")]) == 0
    run = copy_of(finished, tmp_path)
    shutil.copy(tmp_path / "b" / "spans.parquet", run / "spans.parquet")
    assert "spans.parquet: damaged or from another run" in read_error(capsys, run)
    capsys.readouterr()


def test_a_whole_run_reads_back(finished, capsys):
    back = run_dir.read(finished)
    assert back.name == "fuzz" and len(back.placement) == 8
    assert main(["gantt", str(finished), "--out", str(finished.parent / "g.png")]) == 0


def test_readers_check_tables_even_when_the_manifest_agrees(finished, tmp_path):
    """The columns and the ranks are checked too (a run written wrongly, or a
    manifest rewritten by hand)."""
    run = copy_of(finished, tmp_path)
    placement = pd.read_csv(run / "placement.csv").head(4)
    placement.to_csv(run / "placement.csv", index=False)
    out_dirs.write_manifest(run, "fuzz")
    with pytest.raises(run_dir.RunDirError, match="spans of rank 7, but placement.csv places 4"):
        run_dir.read(run)


# 3. one writer at a time, and never a mix --------------------------------------------

def test_a_second_writer_is_refused(finished, tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "busy"
    out.mkdir()
    with out_dirs.exclusive(out, "--out"):  # another clustersim is writing it
        err = one_error(capsys, main(["run", str(path), "--out", str(out)]))
        assert "is being written by another clustersim command now" in err
        err = one_error(capsys, main(["sweep", str(path), "--grid", "seed=1,2", "--out",
                                      str(out), "--workers", "1"]))
        assert "is being written by another clustersim command now" in err
    assert not any(out.iterdir())  # nothing was written


def _slow_writer(out: Path, scenario: Path, signal_file: Path, background: bool) -> str:
    """A Python program that runs ``scenario`` and writes it into ``out`` slowly
    (each table task waits), touching ``signal_file`` once it has begun."""
    return f"""
import pathlib, sys, time
from simulator.outputs import exports, run_dir
slow = exports.write_table
def write_table(frame, path):
    pathlib.Path({str(signal_file)!r}).touch()
    time.sleep(30)
    slow(frame, path)
exports.write_table = write_table
run_dir.BACKGROUND_ROWS = 0 if {background} else 10**9
from simulator.cli import console
sys.argv = ["clustersim", "run", {str(scenario)!r}, "--out", {str(out)!r}]
console()
"""


def _start(tmp_path: Path, background: bool = False) -> tuple[subprocess.Popen, Path, Path]:
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(TINY))
    out, began = tmp_path / "out", tmp_path / "began"
    assert main(["run", str(scenario), "--out", str(out)]) == 0  # a whole run is there
    proc = subprocess.Popen([sys.executable, "-c", _slow_writer(out, scenario, began,
                                                                 background)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_interruptible)
    deadline = time.monotonic() + 60
    while not began.exists() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    assert began.exists(), proc.communicate()
    return proc, out, scenario


def _interruptible() -> None:
    """Ctrl-C's default in the child even where the tests run as a background job
    (whose shell ignores SIGINT, an ignoring its children inherit)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@LINUX
def test_kill_9_while_writing_leaves_the_run_before_whole(tmp_path, capsys):
    proc, out, scenario = _start(tmp_path)
    before = json.loads((out / "summary.json").read_text())
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert run_dir.read(out).summary == before  # the earlier run, whole
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]  # its leftovers
    capsys.readouterr()
    assert main(["run", str(scenario), "--out", str(out)]) == 0
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]  # cleaned


@LINUX
@pytest.mark.parametrize(("sig", "code", "word"), [(signal.SIGINT, 130, "interrupted"),
                                                   (signal.SIGTERM, 143, "terminated")])
def test_ctrl_c_and_sigterm_end_in_one_line_and_remove_partial_outputs(tmp_path, sig, code,
                                                                       word):
    proc, out, _ = _start(tmp_path)
    before = (out / "manifest.json").read_text()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == code, err
    assert err.strip() == f"{word} (partial outputs removed)"
    assert (out / "manifest.json").read_text() == before
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".out")]


@LINUX
@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="the forked writer needs two cores")
def test_a_killed_run_takes_its_forked_writer_with_it(tmp_path):
    proc, _, _ = _start(tmp_path, background=True)
    deadline = time.monotonic() + 30
    children: list[int] = []
    while not children and time.monotonic() < deadline:
        children = _children(proc.pid)
        time.sleep(0.05)
    assert children
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.monotonic() + 10
    while any(_alive(c) for c in children) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(_alive(c) for c in children)


def _children(pid: int) -> list[int]:
    from tests.test_hardening import _children as children
    return children(pid)


def _alive(pid: int) -> bool:
    from tests.test_hardening import _alive as alive
    return alive(pid)


# 15. names and folders ---------------------------------------------------------------

def test_distinct_names_never_share_a_run_directory(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in ("实验", "测试", "a/b", "a_b"):
        path = tmp_path / "s.yaml"
        path.write_text(yaml.safe_dump({**TINY, "name": name}, allow_unicode=True))
        assert main(["run", str(path)]) == 0
    captured = capsys.readouterr()
    assert "Glyph" not in captured.err and "note:" not in captured.err
    assert len(list((tmp_path / "runs").iterdir())) == 4


def test_replacing_another_scenarios_run_says_so_and_a_foreign_folder_is_refused(
        tmp_path, capsys):
    path = tmp_path / "s.yaml"
    out = tmp_path / "out"
    for name in ("first", "second"):
        path.write_text(yaml.safe_dump({**TINY, "name": name}))
        assert main(["run", str(path), "--out", str(out)]) == 0
    assert f"note: {out} held a run of the scenario 'first'" in capsys.readouterr().err
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    err = one_error(capsys, main(["run", str(path), "--out", str(mine)]))
    assert "holds files that are not a clustersim run's (notes.txt" in err
    assert (mine / "notes.txt").read_text() == "mine"
    err = one_error(capsys, main(["run", str(path), "--out", "."]))
    assert "holds the current folder" in err


def test_a_very_long_out_path_is_a_one_line_error(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    err = one_error(capsys, main(["run", str(path), "--out", str(tmp_path / ("x" * 6000))]))
    assert "--out: cannot create the folder" in err and "characters" in err


# 14. files a run names, resolved ----------------------------------------------------

def test_a_run_directory_keeps_its_files_paths_absolute(tmp_path, capsys):
    scenario = ROOT / "scripts/scenarios/custom-fabric-file.yaml"
    out = tmp_path / "elsewhere" / "run"
    assert main(["run", str(scenario), "--set", "model.layers=2", "--out", str(out)]) == 0
    kept = yaml.safe_load((out / "scenario.yaml").read_text())
    assert Path(kept["cluster"]["fabric"]["path"]).is_absolute()
    capsys.readouterr()
    assert main(["blame", str(out)]) == 0
    assert "not drawn: the run's scenario no longer loads" not in capsys.readouterr().out


# 17. resource limits ---------------------------------------------------------------

@LINUX
def test_a_file_size_limit_is_an_output_error_naming_the_file(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))
    done = subprocess.run([sys.executable, "-m", "simulator", "run", str(path), "--out",
                           str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True,
                          preexec_fn=limit, timeout=120)
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("output failed: ") and "File too large" in done.stderr
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
    assert "iteration time" in done.stdout  # the results are not lost
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_memory_exhaustion_is_reported_as_such(tmp_path, capsys, monkeypatch):
    import simulator.runner.simulate as runner

    def exhausted(*_args, **_kwargs):
        raise MemoryError()
    monkeypatch.setattr(runner, "run", exhausted)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    err = one_error(capsys, main(["run", str(path), "--out", str(tmp_path / "r")]), 1)
    assert err.startswith("failed: out of memory")


# 6, 7, 19. other readers' options -----------------------------------------------------

def test_compare_ranks_missing_from_one_run_are_named(finished, tmp_path, capsys):
    bigger = tmp_path / "big.yaml"
    bigger.write_text(yaml.safe_dump({**TINY, "cluster": {"preset": "dgx-a100", "nodes": 2},
                                      "parallelism": {"tp": 2, "pp": 2, "dp": 4}}))
    assert main(["run", str(bigger), "--out", str(tmp_path / "b")]) == 0
    capsys.readouterr()
    err = one_error(capsys, main(["compare", str(finished), str(tmp_path / "b"), "--ranks",
                                  "12", "--out", str(tmp_path / "c.png")]))
    assert f"--ranks: rank 12 is not in {finished}" in err


@pytest.mark.parametrize(("args", "message"), [
    (["blame", "{run}", "--top", "0"], "--top: 0 must be at least 1"),
    (["blame", "{run}", "--top", "-5"], "--top: -5 must be at least 1"),
    (["gantt", "{run}", "--from", "0.001", "--out", "{tmp}/g.png"],
     "--from: '0.001' is not a time"),
])
def test_reader_options_are_checked(finished, tmp_path, capsys, args, message):
    args = [a.format(run=finished, tmp=tmp_path) for a in args]
    assert message in one_error(capsys, main(args))


def test_a_search_range_is_cut_to_what_the_gpus_allow(tmp_path, capsys):
    from simulator.experiments.layouts import parse_values
    started = time.perf_counter()
    assert parse_values("1-1000000000", "--pp", most=8) == list(range(1, 9))
    assert time.perf_counter() - started < 1
    with pytest.raises(Exception, match="more than a million"):
        parse_values("0-100000000", "--zero")


def test_a_folded_runs_classes_are_checked(tmp_path, capsys, monkeypatch):
    """A run that keeps one timeline per class: without classes.csv its spans
    would read as a partial run (8 of 16 ranks); refused, naming the file."""
    import simulator.runner.result as result_module
    from simulator.config.scenario import from_dict
    from simulator.runner.simulate import run as simulate
    from tests.test_parallelism import tiny
    scenario = tiny(tp=2, pp=2, dp=4)
    scenario["cluster"]["nodes"] = 2
    monkeypatch.setattr(result_module, "EXPAND_SPANS", 10)
    result = simulate(from_dict(scenario))
    assert result.folded is not None
    run_dir.write(result, tmp_path / "run")
    assert run_dir.read(tmp_path / "run").classes()
    (tmp_path / "run" / "classes.csv").unlink()
    assert "classes.csv: missing" in read_error(capsys, tmp_path / "run")


def test_fuzzed_damage_to_a_run_directory_is_named_or_harmless(finished, tmp_path, capsys):
    """Any file of a run cut, emptied, replaced, swapped with another or deleted:
    a reader either reads the run whole (the file was not one it reads) or
    refuses it in one line, never a traceback or a partial result."""
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.test_hardening import FUZZ
    names = sorted(p.name for p in finished.iterdir())
    damages = st.one_of(
        st.tuples(st.just("delete"), st.sampled_from(names)),
        st.tuples(st.just("cut"), st.sampled_from(names), st.integers(0, 4096)),
        st.tuples(st.just("bytes"), st.sampled_from(names), st.binary(max_size=64)),
        st.tuples(st.just("swap"), st.sampled_from(names), st.sampled_from(names)),
        st.tuples(st.just("append"), st.sampled_from(names), st.binary(min_size=1, max_size=8)))

    @FUZZ
    @given(st.lists(damages, min_size=1, max_size=2))
    def fuzz(edits):
        run = tmp_path / "run"
        shutil.rmtree(run, ignore_errors=True)
        shutil.copytree(finished, run)
        for kind, name, *arg in edits:
            path = run / name
            if kind == "delete":
                path.unlink(missing_ok=True)
            elif kind == "cut" and path.exists():
                path.write_bytes(path.read_bytes()[:arg[0]])
            elif kind == "bytes":
                path.write_bytes(arg[0])
            elif kind == "swap" and path.exists() and (run / arg[0]).exists():
                path.write_bytes((run / arg[0]).read_bytes())
            elif kind == "append" and path.exists():
                path.write_bytes(path.read_bytes() + arg[0])
        code = main(["comms", str(run)])
        err = capsys.readouterr().err
        assert code in (0, 2), (edits, err)
        assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)
        if code == 0:  # read whole: the same run
            assert run_dir.read(run).summary == run_dir.read(finished).summary
    fuzz()


def test_a_damaged_sweep_table_is_named(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    out = tmp_path / "sweep"
    assert main(["sweep", str(path), "--grid", "seed=1,2", "--out", str(out), "--workers",
                 "1"]) == 0
    (out / "results.parquet").write_text("garbage")
    capsys.readouterr()
    err = one_error(capsys, main(["plot", str(out), "--x", "seed", "--y", "mfu"]))
    assert f"{out / 'results.parquet'}: damaged" in err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
@pytest.mark.parametrize("command", [["comms", "{run}", "--csv", "/dev/full"],
                                     ["trace", "{run}", "--out", "/dev/full"]])
def test_a_full_disk_under_a_readers_output_names_the_file(finished, capsys, command):
    err = one_error(capsys, main([a.format(run=finished) for a in command]), 1)
    assert err.startswith("output failed: /dev/full: cannot write it (No space left")
