"""Issue 55's CLI, cluster and run-table items: an NVLink domain of whole
servers, ``init``'s flags each checked and named, several scenarios in one
``run`` each with its row and no empty folders, low precision per job, and
the small ones (``--no-trace``'s reason, a job's GPUs against the cluster's,
``collective --op`` completion, YAML 1.1 booleans in string fields)."""

from __future__ import annotations

import pytest

from simulator.base.fields import ScenarioError
from simulator.config.scenario import machine_from

# -- item 10: an NVLink domain is whole servers -------------------------------------


@pytest.mark.parametrize(("preset", "domain", "per_server"), [
    ("gb200-nvl72", 6, 4), ("gb200-nvl72", 3, 4), ("gb200-nvl72", 18, 4),
    ("dgx-a100", 1, 8), ("dgx-a100", 4, 8), ("dgx-h100", 12, 8)])
def test_a_domain_that_splits_a_server_is_refused(preset, domain, per_server):
    with pytest.raises(ScenarioError, match=(
            rf"^cluster.nvlink_domain: {domain} must be whole servers: a multiple of the "
            rf"{per_server} GPUs per server \({per_server}, {2 * per_server}, ")):
        machine_from({"preset": preset, "nodes": 4, "nvlink_domain": domain})


@pytest.mark.parametrize(("preset", "domain"), [("gb200-nvl72", 8), ("gb200-nvl72", 36),
                                                ("dgx-h100", 16), ("dgx-a100", 8)])
def test_a_domain_of_whole_servers_is_accepted(preset, domain):
    assert machine_from({"preset": preset, "nodes": 4, "nvlink_domain": domain}).gpus > 0


def test_the_reference_no_longer_offers_a_domain_of_zero():
    from simulator.base.field_docs import descriptions
    from topologies.clusters import ClusterSpec

    text = descriptions(ClusterSpec)["nvlink_domain"]
    assert "0:" not in text and "whole number of servers" in text


# -- item 15 and 18: init's flags, each checked and named; its precisions the loader's ----

def _error(capsys, argv: list[str], expected_code: int = 2) -> str:
    from simulator.cli import main

    code = main(argv)
    err = capsys.readouterr().err
    assert code == expected_code, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(("flag", "value", "allowed"), [
    ("--global-batch", "0", "must be an integer >= 1"),
    ("--micro-batch", "0", "must be an integer >= 1"),
    ("--tp", "-1", "must be an integer >= 1"),
    ("--pp", "0", "must be an integer >= 1"),
    ("--cp", "0", "must be an integer >= 1"),
    ("--ep", "0", "must be an integer >= 1"),
    ("--seq-len", "0", "must be an integer >= 1"),
    ("--nodes", "0", "must be an integer >= 1"),
    ("--zero", "4", "is not one of: 0, 1, 2, 3"),
    ("--precision", "fp32", "is not one of: bf16, fp16, fp8"),
    ("--recompute", "some", "is not one of: none, selective, full"),
])
def test_init_names_the_flag_it_refuses(tmp_path, capsys, flag, value, allowed):
    path = tmp_path / "s.yaml"
    err = _error(capsys, ["init", str(path), flag, value])
    shown = repr(int(value)) if value.lstrip("-").isdigit() else repr(value)
    assert err.startswith(f"error: {flag}: {shown} {allowed}"), err
    assert "training.global_batch" not in err or flag == "--global-batch"
    assert not path.exists()


def test_init_writes_the_global_batch_it_is_given(tmp_path, capsys):
    import yaml

    from simulator.cli import main

    path = tmp_path / "s.yaml"
    assert main(["init", str(path), "--global-batch", "64"]) == 0
    assert yaml.safe_load(path.read_text())["training"]["global_batch"] == 64


def test_init_lists_exactly_the_precisions_the_loader_accepts(tmp_path, capsys):
    import re

    from simulator.base.fields import allowed_by
    from simulator.cli import main
    from simulator.config.training import TRAINING_SCHEMA

    path = tmp_path / "s.yaml"
    assert main(["init", str(path)]) == 0
    line = next(t for t in path.read_text().splitlines() if t.lstrip().startswith("precision:"))
    written = set(re.findall(r"\b(?:bf16|fp16|fp32|fp8|mxfp8|nvfp4|fp4|int8)\b",
                             line.partition("#")[2]))
    accepted = set(allowed_by(TRAINING_SCHEMA["precision"][0])[len("one of: "):].split(", "))
    assert written == accepted


# -- item 16: several scenarios in one run: every row, the table, no empty folders -----

TINY = {"cluster": {"preset": "dgx-a100", "nodes": 1},
        "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000},
        "training": {"seq_len": 128, "global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 2, "dp": 2}}


def _scenario(tmp_path, name: str) -> str:
    import yaml

    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({"name": name, **TINY}))
    return str(path)


def _failing(monkeypatch, name: str, error: Exception) -> None:
    """``simulate`` raising ``error`` for the scenario called ``name``."""
    from simulator.runner import simulate

    real = simulate.run

    def run(scenario, *args, **kwargs):
        if scenario.name == name:
            raise error
        return real(scenario, *args, **kwargs)
    monkeypatch.setattr(simulate, "run", run)


@pytest.mark.parametrize(("error", "code", "said"), [
    (RuntimeError("boom"), 3, "internal error: RuntimeError: boom"),
    (ScenarioError("training.x: 1 is refused"), 2, "error: training.x: 1 is refused")])
def test_a_failed_scenario_among_several_is_a_row_and_leaves_no_folder(
        tmp_path, capsys, monkeypatch, error, code, said):
    from simulator.cli import main

    _failing(monkeypatch, "b", error)
    out = tmp_path / "runs"
    assert main(["run", _scenario(tmp_path, "a"), _scenario(tmp_path, "b"),
                 _scenario(tmp_path, "c"), "--out", str(out)]) == code
    captured = capsys.readouterr()
    rows = captured.out.splitlines()
    assert rows[0].split()[:3] == ["scenario", "GPUs", "iteration"]
    assert [r.split()[0] for r in rows[2:]] == ["a", "b", "c"]
    assert said[:30] in rows[3] and "Traceback" not in captured.err
    assert f"b.yaml: {said}" in captured.err
    assert (out / "a" / "summary.json").is_file() and (out / "c" / "summary.json").is_file()
    assert not (out / "b").exists()


def test_several_as_json_give_the_failed_one_its_error(tmp_path, capsys, monkeypatch):
    import json

    from simulator.cli import main

    _failing(monkeypatch, "b", RuntimeError("boom"))
    out = tmp_path / "runs"
    assert main(["run", _scenario(tmp_path, "a"), _scenario(tmp_path, "b"), "--out", str(out),
                 "--json"]) == 3
    rows = json.loads(capsys.readouterr().out)
    assert "summary" in rows[0] and rows[1]["error"].startswith("internal error: RuntimeError")


@pytest.mark.parametrize(("error", "code"), [(RuntimeError("boom"), 3),
                                             (ScenarioError("x: 1 is refused"), 2)])
def test_a_failed_single_run_leaves_no_empty_folder(tmp_path, capsys, monkeypatch, error,
                                                    code):
    from simulator.cli import main

    _failing(monkeypatch, "a", error)
    out = tmp_path / "deep" / "run"
    assert main(["run", _scenario(tmp_path, "a"), "--out", str(out)]) == code
    capsys.readouterr()
    assert not out.exists()
    existing = tmp_path / "existing"
    existing.mkdir()
    assert main(["run", _scenario(tmp_path, "a"), "--out", str(existing)]) == code
    assert existing.is_dir()  # (a folder the user made is the user's)


# -- item 17: low precision reported per job ---------------------------------------

def _two_precisions(second: str = "fp8") -> dict:
    gpt = {"model": {"preset": "gpt3-125m"},
           "training": {"seq_len": 512, "global_batch": 8, "micro_batch": 1},
           "parallelism": {"dp": 8}}
    return {"name": "mixed", "cluster": {"preset": "dgx-h100", "nodes": 2},
            "jobs": {"bf": {"nodes": 1, **gpt},
                     "low": {"nodes": 1, **gpt,
                             "training": {**gpt["training"], "precision": second}}}}


def _summary_of(raw: dict) -> dict:
    from simulator.config.scenario import from_dict
    from simulator.runner.simulate import run

    return run(from_dict(raw)).summary


def test_jobs_of_two_precisions_each_report_their_own_low_precision():
    from simulator.config.scenario import from_dict

    summary = _summary_of(_two_precisions())
    jobs = {job["name"]: job for job in summary["jobs"]}
    assert "precision" not in summary and "mfu_lowp" not in summary  # (no mixed figure)
    assert "precision" not in jobs["bf"] and "mfu_lowp" not in jobs["bf"]
    low = jobs["low"]
    assert low["precision"] == "fp8" and low["lowp_overhead_s"] >= 0
    gpu = from_dict(_two_precisions()).gpu
    fp8_peak, bf16_peak = gpu.peak("fp8"), gpu.peak("bf16")
    assert low["mfu_lowp"] == pytest.approx(low["mfu"] * bf16_peak / fp8_peak)


def test_each_jobs_line_says_its_own_low_precision():
    from simulator.cli.run import _job_lines

    summary = _summary_of(_two_precisions())
    lines = _job_lines(summary)
    low = next(line for line in lines if "low on nodes" in line)
    bf = next(line for line in lines if "bf on nodes" in line)
    assert "fp8: MFU" in low and "of its dense peak" in low
    assert "fp8" not in bf


def test_jobs_of_one_low_precision_keep_the_top_level_figure():
    summary = _summary_of(_two_precisions("fp8") | {"jobs": {
        name: {**job, "training": {**job["training"], "precision": "fp8"}}
        for name, job in _two_precisions()["jobs"].items()}})
    assert summary["precision"] == "fp8" and "mfu_lowp" in summary
    assert all(job["precision"] == "fp8" for job in summary["jobs"])


# -- item 18: --no-trace gives its real reason ---------------------------------------

def test_no_trace_says_it_was_asked_for_not_that_the_run_is_large(tmp_path, capsys):
    from simulator.cli import main

    out = tmp_path / "r"
    assert main(["run", _scenario(tmp_path, "a"), "--out", str(out), "--no-trace"]) == 0
    line = next(t for t in capsys.readouterr().out.splitlines() if t.startswith("outputs"))
    assert not (out / "trace.json").exists()
    assert "this large" not in line and "--no-trace" in line, line
    assert f"clustersim trace {out}" in line


# -- item 18: a job's traces against the job's GPUs, not the cluster's ---------------

def test_a_jobs_traces_of_the_wrong_size_name_the_jobs_gpus_and_the_clusters(tmp_path,
                                                                             capsys):
    import yaml

    from simulator.cli import main
    from simulator.config.scenario import from_dict

    traces = tmp_path / "traces"
    assert main(["export-chakra", _scenario(tmp_path, "a"), "--out", str(traces)]) == 0
    capsys.readouterr()
    raw = {"name": "j", "cluster": {"preset": "dgx-a100", "nodes": 3},
           "jobs": {"t": {"nodes": 2, "workload": {"chakra": str(traces)}}}}
    with pytest.raises(ScenarioError) as caught:
        from_dict(yaml.safe_load(yaml.safe_dump(raw)))
    message = str(caught.value)
    assert "holds 8 ranks' traces" in message and "the cluster has 16" not in message
    assert "the job has 16 GPUs (2 of the cluster's 3 nodes, 24 GPUs)" in message, message
    plain = {**TINY, "name": "p", "cluster": {"preset": "dgx-a100", "nodes": 2},
             "workload": {"chakra": str(traces)}}
    for key in ("model", "training", "parallelism"):
        plain.pop(key)
    with pytest.raises(ScenarioError, match="holds 8 ranks' traces; the cluster has 16 GPUs"):
        from_dict(plain)


# -- item 18: completion offers collective --op's names ----------------------------

def test_completion_offers_the_collectives_for_op(capsys):
    from simulator.base.ir import Collective
    from simulator.cli import _parser, main
    from simulator.cli.completion import commands

    names = [c.value for c in Collective]
    assert commands(_parser())["collective"]["--op"] == names
    scripts = {}
    for shell in ("bash", "fish"):
        assert main(["completion", shell]) == 0
        scripts[shell] = capsys.readouterr().out
    assert f'collective:--op) COMPREPLY=( $(compgen -W "{" ".join(names)}"' in scripts["bash"]
    assert f'-l op -x -a "{" ".join(names)}"' in scripts["fish"]


# -- item 18: YAML 1.1's booleans in a string field ---------------------------------

@pytest.mark.parametrize(("section", "key", "word"), [
    ("", "name", "off"), ("", "name", "yes"), ("training", "recompute", "off"),
    ("simulation", "symmetry", "on")])
def test_a_yaml_boolean_in_a_string_field_says_to_quote_it(tmp_path, capsys, section, key,
                                                           word):
    import copy

    import yaml

    from simulator.cli import main  # noqa: F401 - (through _error)

    raw = copy.deepcopy({"name": "x", **TINY})
    (raw.setdefault(section, {}) if section else raw)[key] = "WORD"
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(raw).replace("WORD", word))
    err = _error(capsys, ["run", str(path), "--out", str(tmp_path / "r")])
    dotted = f"{section}.{key}".lstrip(".")
    assert err.startswith(f"error: {dotted}: "), err
    example = "on" if word in ("on", "yes") else "off"
    assert "YAML 1.1" in err and f'{key}: "{example}"' in err, err


def _string_checks():
    """Every scenario key whose check takes text (a string or one of some words)."""
    from simulator.base.fields import allowed_by, schema_of
    from simulator.config import cluster, model, scenario, simulation, training
    from simulator.config.network import NetworkSettings

    schemas = {"": scenario.TOP_LEVEL, "cluster": cluster.SCHEMA,
               "training": training.TRAINING_SCHEMA, "parallelism": training.PARALLEL_SCHEMA,
               "network": schema_of(NetworkSettings),
               "simulation": schema_of(simulation.SimulationSpec),
               "model": model.SCHEMA}
    for section, schema in schemas.items():
        for key, (check, _) in schema.items():
            said = allowed_by(check)
            if said == "text" or (said.startswith("one of: ") and any(
                    c.isalpha() for c in said.split(": ", 1)[1].split(", ")[0])):
                yield f"{section}.{key}".lstrip("."), check


@pytest.mark.parametrize(("path", "check"), [pytest.param(p, c, id=p) for p, c in
                                            _string_checks()])
def test_every_string_field_says_a_boolean_was_a_yaml_word(path, check):
    for value, example in ((False, '"off"'), (True, '"on"')):
        with pytest.raises(ScenarioError) as caught:
            check(path, value)
        assert "YAML 1.1" in str(caught.value) and example in str(caught.value), caught.value


# -- fuzz: init's flags at random never crash ---------------------------------------

INIT_FLAGS = ("--tp", "--pp", "--cp", "--ep", "--zero", "--nodes", "--seq-len", "--micro-batch",
              "--global-batch")


def _fuzz_init():
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.test_hardening import FUZZ

    flags = st.dictionaries(st.sampled_from(INIT_FLAGS), st.integers(-2, 9) | st.sampled_from(
        [2**31, 10**12]), max_size=4)
    precision = st.sampled_from(["bf16", "fp32", "fp8", "nvfp4", "x"])

    @FUZZ
    @given(flags=flags, precision=precision)
    def check(tmp_path, capsys, flags, precision):
        from simulator.cli import main

        path = tmp_path / "fuzz.yaml"
        argv = ["init", str(path), "--force", "--precision", precision,
                *[part for flag, value in flags.items() for part in (flag, str(value))]]
        code = main(argv)
        err = capsys.readouterr().err
        assert code in (0, 2) and "Traceback" not in err, (argv, err)
        if code == 2:
            assert err.count("\n") == 1 and err.startswith("error: "), err
            bad = [f for f, v in flags.items() if v < (0 if f == "--zero" else 1)]
            assert not bad or err.startswith(f"error: {bad[0]}") or any(
                err.startswith(f"error: {f}") for f in bad), (argv, err)
    return check


def test_init_never_crashes_on_any_flags(tmp_path, capsys):
    _fuzz_init()(tmp_path, capsys)
