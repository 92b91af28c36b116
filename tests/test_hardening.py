"""Bad input, every kind: one line on stderr, the right exit code, nothing lost,
nothing written where it should not be (issue 14), and a fuzz test that feeds
mutated scenarios and fabric files through ``clustersim run``."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simulator.base import footprint
from simulator.base.fields import ScenarioError
from simulator.base.user_files import file_name, finite_numbers, parse_yaml, read_text, yaml_value
from simulator.cli import main
from simulator.experiments.sweep import RESULTS, Results

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scripts/scenarios/quickstart.yaml")
CUSTOM = str(ROOT / "scripts/scenarios/custom-fabric-file.yaml")
FABRIC = ROOT / "scripts/fabrics/two-dgx-one-switch.yaml"
TINY = {"name": "fuzz", "cluster": {"preset": "dgx-a100", "nodes": 1},
        "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000},
        "training": {"seq_len": 128, "global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 2, "dp": 2}}


def one_error(capsys, code: int, expected_code: int = 2) -> str:
    """The command's single stderr line (asserting the exit code and no traceback)."""
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


# -- the readers ------------------------------------------------------------------

@pytest.mark.parametrize(("text", "message"), [
    ("a: 1\na: 2\n", "line 2: duplicate key 'a' (first given at line 1)"),
    ("{a: 1, a: 2}", "duplicate key 'a'"),
    ("x:\n  b: 1\n  b: 3\n", "line 3: duplicate key 'b'"),
    ("[1", "not valid YAML at line 1"),
])
def test_yaml_errors_name_the_line(text, message):
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_yaml(text, "f.yaml")


def test_merge_keys_are_not_duplicates():
    assert parse_yaml("b: &b {x: 1}\no:\n  <<: *b\n  y: 2\n", "f")["o"] == {"x": 1, "y": 2}


def test_text_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: x\n\xff\n")
    with pytest.raises(ScenarioError, match=r"not UTF-8 text \(byte 8"):
        read_text(path, "scenario file")
    with pytest.raises(ScenarioError, match="is a directory"):
        read_text(tmp_path, "scenario file")


def test_values_and_numbers():
    with pytest.raises(ScenarioError, match="no value after '='"):
        yaml_value("  ", "--set training.seq_len")
    with pytest.raises(ScenarioError, match=r"model.layers\[1\]: nan is not a finite number"):
        finite_numbers({"model": {"layers": [1, float("nan")]}}, "")
    finite_numbers({"a": [1, 2.5, "x", None, {"b": True}]}, "")


def test_names_become_safe_path_components():
    assert file_name("../../../tmp/x").startswith("_.._.._tmp_x-")
    assert file_name("...").startswith("scenario-")
    assert "/" not in file_name("a/b\\c d") and not file_name("..a").startswith(".")
    assert file_name("实验") == "实验" and file_name("测试") == "测试"  # letters of any script
    names = ["a/b", "a_b", "a b", "a:b", "..a_b", "a_b-" + "x" * 8, "x" * 300, "x" * 301]
    assert len({file_name(n) for n in names}) == len(names)  # one name, one folder


def test_footprint_refuses_what_cannot_fit():
    with pytest.raises(ScenarioError, match="training.global_batch: 1,000,000 micro-batches"):
        footprint.check_layout(100, 10**6, memory=2**30)
    footprint.check_layout(100, 10**3, memory=2**30)
    with pytest.raises(ScenarioError, match=r"--nodes: 100000: the fabric graph of 800,000 GPUs"):
        footprint.check_fabric(800_000, "--nodes", 100_000, memory=2**30)


# -- the commands -----------------------------------------------------------------

def _fabric_with(tmp_path: Path, old: str, new: str) -> str:
    text = FABRIC.read_text()
    assert old in text
    path = tmp_path / "fabric.yaml"
    path.write_text(text.replace(old, new, 1))
    return f"cluster.fabric.path={path}"


@pytest.mark.parametrize(("edit", "message"), [
    (('bandwidth: "200 Gb/s"', "bandwidth: .nan"), "bandwidth: nan must be a finite"),
    (('bandwidth: "200 Gb/s"', 'bandwidth: "1e400 Gb/s"'), "too large to be a bandwidth"),
    (('latency: "', 'latency: "-'), "must be a finite, non-negative quantity"),
    (("efficiency: 0.", "efficiency: x0."), "must be a number in (0, 1]"),
    (("nodes:", "nodes: 5\nold_nodes:"), "nodes: 5 must be a list"),
    (("links:", "links: [\n"), "not valid YAML"),
])
def test_bad_fabric_files(tmp_path, capsys, edit, message):
    override = _fabric_with(tmp_path, *edit)
    code = main(["run", CUSTOM, "--set", override, "--out", str(tmp_path / "r")])
    assert message in one_error(capsys, code)
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


@pytest.mark.parametrize(("config", "message"), [
    ({"num_key_value_heads": -2}, "num_key_value_heads: -2 must be a positive integer"),
    ({"intermediate_size": -5}, "intermediate_size: -5 must be a positive integer"),
    ({"intermediate_size": "big"}, "intermediate_size: 'big' must be a positive integer"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings: 'yes' must be true or false"),
    ({"twice": 1}, "vocab_size: given twice"),
    ({"rope_theta": float("nan")}, "NaN is not a number a model size can be"),
])
def test_bad_hf_configs(tmp_path, capsys, config, message):
    path = tmp_path / "config.json"
    text = json.dumps({"num_hidden_layers": 2, "hidden_size": 512,
                       "num_attention_heads": 8, "vocab_size": 1000, **config})
    path.write_text(text.replace('"twice": 1', '"vocab_size": 7'))
    code = main(["run", QUICKSTART, "--set", "model.preset=null", "--set",
                 f"model.hf_config={path}", "--out", str(tmp_path / "r")])
    assert message in one_error(capsys, code)


@pytest.mark.parametrize(("sets", "message"), [
    (["cluster.nvlink_bandwidth=1e400 GB/s"], "too large to be a bandwidth"),
    (["cluster.link_latency=1e400 s"], "too large to be a time"),
    (["cluster.compute_jitter=.inf"], "cluster.compute_jitter: inf is not a finite number"),
    (["training.seq_len="], "--set training.seq_len: no value after '='"),
    (["training.seq_len=[1"], "--set training.seq_len: not valid YAML"),
    (["parallelism.tensor_paralel=2"], "did you mean 'tp'?"),
    (["training.global_batch=1099511627776"], "training.global_batch: 68,719,476,736 "
                                              "micro-batches"),
    (["model.preset=llama2-70b", "model.heads=12", "model.hidden=768"],
     "kv_heads 8 comes from the preset llama2-70b; set model.kv_heads"),
])
def test_bad_values(tmp_path, capsys, sets, message):
    args = ["run", QUICKSTART, "--out", str(tmp_path / "r")]
    for assignment in sets:
        args += ["--set", assignment]
    assert message in one_error(capsys, main(args))
    assert not (tmp_path / "r").exists() or not any((tmp_path / "r").iterdir())


def test_heads_without_kv_heads_stay_multi_head(tmp_path, capsys):
    code = main(["run", QUICKSTART, "--set", "model.heads=8", "--json",
                 "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err


def test_scenario_files(tmp_path, capsys):
    twice = tmp_path / "twice.yaml"
    twice.write_text("parallelism: {dp: 1}\n" + Path(QUICKSTART).read_text())
    assert "duplicate key 'parallelism'" in one_error(capsys, main(["run", str(twice)]))
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\xff\xfe" + Path(QUICKSTART).read_bytes())
    assert "not UTF-8" in one_error(capsys, main(["run", str(binary)]))


def test_names_cannot_escape_runs(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    scenario = dict(TINY, name="../../escaped")
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    assert main(["run", str(path)]) == 0, capsys.readouterr().err
    assert (tmp_path / "runs" / file_name("../../escaped") / "summary.json").exists()
    assert not (tmp_path.parent / "escaped").exists()


def _tiny_run(tmp_path: Path, capsys) -> tuple[Path, Path]:
    """The tiny scenario's file and its finished run directory."""
    run, path = tmp_path / "run", tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    assert main(["run", str(path), "--out", str(run)]) == 0
    capsys.readouterr()
    return path, run


def test_output_paths_are_made_or_refused_before_any_work(tmp_path, capsys):
    path, run = _tiny_run(tmp_path, capsys)
    deep = tmp_path / "new" / "deeper"
    for args in (["gantt", str(run), "--out", str(deep / "g.png")],
                 ["comms", str(run), "--plot", str(deep / "c.png"), "--csv",
                  str(deep / "c.csv")],
                 ["trace", str(run), "--out", str(deep / "t.json")]):
        assert main(args) == 0, capsys.readouterr().err
    assert {p.name for p in deep.iterdir()} == {"g.png", "c.png", "c.csv", "t.json"}
    capsys.readouterr()
    blocker = tmp_path / "file"
    blocker.write_text("")
    code = main(["comms", str(run), "--csv", str(blocker / "x.csv")])
    printed = capsys.readouterr()
    assert code == 2 and "--csv: " in printed.err and "is a file, not a folder" in printed.err
    assert printed.out == ""  # refused before printing the profile
    code = main(["run", str(path), "--out", str(blocker / "r")])
    assert "--out: cannot create the folder" in one_error(capsys, code)


def test_gantt_windows_and_ranks(tmp_path, capsys):
    _, run = _tiny_run(tmp_path, capsys)
    out = str(tmp_path / "g.png")
    assert "is at or after the run's end" in one_error(
        capsys, main(["gantt", str(run), "--from", "1000 s", "--out", out]))
    assert "the range starts after it ends" in one_error(
        capsys, main(["gantt", str(run), "--ranks", "5-2", "--out", out]))


@pytest.mark.parametrize(("args", "message"), [
    (["--factor", "nan"], "factor nan must be a finite number > 1"),
    (["-b", "1.5", "-e", "8"], "less than one element (4 B)"),
    (["-b", "1M", "-e", "8G", "--factor", "1.0000001"], "at most 1,000"),
    (["--nodes", "0"], "--nodes: 0 must be at least 1"),
])
def test_collective_bounds(capsys, args, message):
    code = main(["collective", "--cluster", "dgx-a100", *args])
    assert message in one_error(capsys, code)


def test_internal_errors_exit_3_with_the_traceback_saved(tmp_path, capsys, monkeypatch):
    import simulator.runner.simulate as runner

    def broken(*_args, **_kwargs):
        raise KeyError("a bug")
    monkeypatch.setattr(runner, "run", broken)
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    err = one_error(capsys, main(["run", str(path), "--out", str(tmp_path / "r")]), 3)
    assert "internal error: KeyError: 'a bug' (a clustersim bug; please report it" in err
    saved = list(tmp_path.glob("clustersim-error-*.txt"))  # beside the run directory
    assert len(saved) == 1 and "Traceback" in saved[0].read_text()


# -- sweeps -----------------------------------------------------------------------

def test_a_vast_model_ends_instead_of_hanging(tmp_path, capsys):
    """Transfers of 2**62-vocabulary embeddings end where the clock can no longer
    resolve their last bytes (the flow loop used to wait for them forever), and
    byte counts past int64 still make the log's table."""
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(TINY))
    code = _bounded(["run", str(path), "--set", "model.vocab=4611686018427387904",
                     "--out", str(tmp_path / "r")], seconds=30)
    assert code == 0, capsys.readouterr().err


def test_finished_flows_at_the_clock_resolution():
    import numpy as np

    from simulator.network.maxmin import finished_flows
    one = np.array([1.0])
    assert not finished_flows(np.array([1.0]), np.array([1e6]), one * 1e9, now=1.0)
    assert finished_flows(np.array([1.0]), np.array([1e6]), one * 1e9, now=1e9)


def test_sweep_file_axes_cannot_be_given_again(tmp_path, capsys):
    design = tmp_path / "sweep.yaml"
    design.write_text(yaml.safe_dump({"base": QUICKSTART, "grid": {"parallelism.dp": [8, 16]}}))
    code = main(["sweep", str(design), "--grid", "parallelism.dp=4", "--out",
                 str(tmp_path / "s")])
    assert "parallelism.dp is given twice" in one_error(capsys, code)


def test_sweep_axes_given_twice_and_all_invalid(tmp_path, capsys):
    out = str(tmp_path / "sweep")
    code = main(["sweep", QUICKSTART, "--grid", "parallelism.dp=1,2", "--grid",
                 "parallelism.dp=4", "--out", out])
    assert "parallelism.dp is given twice" in one_error(capsys, code)
    code = main(["sweep", QUICKSTART, "--grid", "parallelism.dp=3,5", "--out", out])
    err = capsys.readouterr().err
    assert code == 2 and "every case of the sweep is invalid (2)" in err


def test_a_cut_results_line_is_repaired(tmp_path):
    log = tmp_path / RESULTS
    whole = json.dumps({"case": "a", "status": "ok"})
    log.write_text(whole + "\n" + '{"case": "b", "sta')
    results = Results(tmp_path)
    assert set(results.rows) == {"a"}
    assert log.read_text() == whole + "\n"
    results.add({"case": "b", "status": "ok"})
    assert [json.loads(line)["case"] for line in log.read_text().splitlines()] == ["a", "b"]


@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc")
def test_sweep_workers_leave_with_a_killed_sweep(tmp_path):
    """kill -9 of the sweep: its workers notice within a second and exit (before,
    they finished their cases for nobody, a minute or more)."""
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(TINY))
    sweep = subprocess.Popen(
        [sys.executable, "-c", "from simulator.cli import console; console()", "sweep",
         str(base), "--grid", "training.global_batch=4096,8192,16384,32768", "--workers", "2",
         "--out", str(tmp_path / "s")], cwd=ROOT, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    children: list[int] = []
    while time.monotonic() < deadline and len(children) < 2:
        time.sleep(0.2)
        children = _children(sweep.pid)
    assert len(children) >= 2
    sweep.send_signal(signal.SIGKILL)
    sweep.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(pid) for pid in children):
        time.sleep(0.2)
    assert not any(_alive(pid) for pid in children)


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- fuzz -------------------------------------------------------------------------

class Hang(Exception):
    """Raised by the alarm: the CLI reports it as an internal error (exit 3)."""


def _bounded(args: list[str], seconds: int = 60) -> int:
    def ring(_signum, _frame):
        raise Hang(f"clustersim {' '.join(args)} ran over {seconds} s")
    previous = signal.signal(signal.SIGALRM, ring)
    signal.alarm(seconds)
    try:
        return main(args)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(-3, 64), st.sampled_from([2**62, 10**18]),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=8),
    st.sampled_from(["25 GB/s", "1e400 GB/s", "-5 us", "0 Gb/s", "nan GB/s", "1 s", "80 GiB",
                     "1f1b", "interleaved", "full", "selective", "ring", "tree", "bf16"]),
    st.lists(st.integers(-1, 4), max_size=3), st.dictionaries(st.text(max_size=3),
                                                              st.integers(), max_size=2))
KEYS = ["name", "seed", "cluster.preset", "cluster.nodes", "cluster.compute_jitter",
        "cluster.nic_bandwidth", "cluster.link_latency", "cluster.gpu", "model.layers",
        "model.hidden", "model.heads", "model.kv_heads", "model.vocab", "model.ffn_hidden",
        "model.preset", "training.seq_len", "training.global_batch", "training.micro_batch",
        "training.precision", "training.recompute", "parallelism.tp", "parallelism.pp",
        "parallelism.dp", "parallelism.cp", "parallelism.zero", "parallelism.schedule",
        "parallelism.virtual_stages", "parallelism.stage_layers",
        "parallelism.sequence_parallel", "network.algorithm", "simulation.symmetry",
        "simulation.jitter", "unknown_section", "model.unknown"]
# CLUSTERSIM_FUZZ=N runs N random examples each (a longer hunt); by default 30 fixed ones
HUNT = int(os.environ.get("CLUSTERSIM_FUZZ", "0"))
FUZZ = settings(max_examples=HUNT or 30, deadline=None, derandomize=not HUNT, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


def _set(tree: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for key in parents:
        tree = tree.setdefault(key, {}) if isinstance(tree.get(key, {}), dict) else {}
    if value is _DELETE:
        tree.pop(last, None)
    else:
        tree[last] = value


_DELETE = object()


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(KEYS), st.one_of(VALUES, st.just(_DELETE))),
                min_size=1, max_size=3))
def test_fuzzed_scenarios_end_in_a_result_or_one_line(tmp_path, capsys, edits):
    scenario = copy.deepcopy(TINY)
    for key, value in edits:
        _set(scenario, key, value)
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump(scenario, allow_unicode=True))
    code = _bounded(["run", str(path), "--out", str(tmp_path / "out")])
    err = _without_notes(capsys.readouterr().err)
    assert code in (0, 2), (edits, err)
    assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)


def _without_notes(err: str) -> str:
    """stderr without ``note:`` lines (a run replacing another scenario's says so)."""
    return "".join(line for line in err.splitlines(keepends=True)
                   if not line.startswith("note: "))


def _fabric_items(fabric: dict) -> list[tuple[str, int]]:
    return [("nodes", i) for i in range(len(fabric["nodes"]))] + [
        ("links", i) for i in range(len(fabric["links"]))]


FABRIC_KEYS = ["name", "kind", "node", "local", "nic", "a", "b", "bandwidth", "latency",
               "efficiency", "link", "directed"]


@FUZZ
@given(st.lists(st.tuples(st.integers(0, 10**6), st.sampled_from(FABRIC_KEYS),
                          st.one_of(VALUES, st.just(_DELETE))), min_size=1, max_size=3))
def test_fuzzed_fabric_files_end_in_a_result_or_one_line(tmp_path, capsys, edits):
    fabric = yaml.safe_load(FABRIC.read_text())
    items = _fabric_items(fabric)
    for pick, key, value in edits:
        section, index = items[pick % len(items)]
        entry = fabric[section][index]
        if value is _DELETE:
            entry.pop(key, None)
        else:
            entry[key] = value
    path = tmp_path / "fabric.yaml"
    path.write_text(yaml.safe_dump(fabric, allow_unicode=True))
    code = _bounded(["run", CUSTOM, "--set", f"cluster.fabric.path={path}", "--set",
                     "model.layers=2", "--out", str(tmp_path / "out")])
    err = _without_notes(capsys.readouterr().err)
    assert code in (0, 2), (edits, err)
    assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)


def test_the_footprint_counts_only_the_ranks_a_folded_run_simulates():
    """``simulation.fold_ranks`` runs the first rank of each program: the memory
    check counts those (Table 1's 1T row, 3,072 GPUs, was refused counting all)."""
    from simulator.config.scenario import from_dict
    from simulator.engine.assemble import Plan
    from tests.test_parallelism import tiny
    from workloads.program import build_program
    scenario = from_dict(tiny(pp=2, dp=8))
    program = build_program(scenario.model, scenario.training, scenario.parallel)
    folded = Plan(("batching", "folding")).simulated_ranks(program)
    assert folded == [0, 8]  # one rank per pipeline stage (order tp-cp-dp-pp)
    assert Plan(("batching",)).simulated_ranks(program) is None  # every rank
    ops = len(program.ops[0]) + len(program.ops[8])
    footprint.check_run(program, folded, memory=ops * footprint.BYTES_PER_OP)
    with pytest.raises(ScenarioError, match="16 simulated ranks"):
        footprint.check_run(program, None, memory=ops * footprint.BYTES_PER_OP)
