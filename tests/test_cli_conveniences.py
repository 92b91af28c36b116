"""The command line's conveniences (issue 43, item 3): ``--version``, shell
completion generated from the parsers, ``clustersim init`` and ``clustersim
run`` on several scenarios compared in one table."""

import json
import shutil
import subprocess

import pytest
import yaml

from simulator.cli import _parser, main
from simulator.cli.completion import commands
from simulator.config.scenario import load
from tests.conftest import QUICKSTART


def test_version_names_the_package(capsys):
    from importlib.metadata import version

    with pytest.raises(SystemExit) as done:
        main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"clustersim {version('clustersim')}"


def _complete(script: str, *words: str) -> list[str]:
    """What bash completes for the command line ``words`` (the last one partial)."""
    line = " ".join(f"'{w}'" for w in ("clustersim", *words))
    probe = (f"{script}\nCOMP_WORDS=({line}); COMP_CWORD={len(words)}; _clustersim; "
             'printf "%s\\n" "${COMPREPLY[@]}"')
    done = subprocess.run(["bash", "-c", probe], capture_output=True, text=True, check=True)
    return done.stdout.split()


@pytest.mark.skipif(shutil.which("bash") is None, reason="needs bash")
def test_bash_completion_completes_commands_options_and_their_choices(capsys):
    assert main(["completion", "bash"]) == 0
    script = capsys.readouterr().out
    assert "run" in _complete(script, "ru") and "search" in _complete(script, "se")
    assert _complete(script, "run", "--form") == ["--format"]
    assert sorted(_complete(script, "run", "--format", "")) == ["pdf", "png", "svg"]
    assert "--etp" in _complete(script, "search", "--e")
    assert main(["completion", "zsh"]) == 0
    assert "bashcompinit" in capsys.readouterr().out


def test_every_command_and_option_of_the_parser_is_in_each_script(capsys):
    spec = commands(_parser())
    assert {"run", "search", "init", "completion"} <= set(spec)
    for shell in ("bash", "zsh", "fish"):
        assert main(["completion", shell]) == 0
        script = capsys.readouterr().out
        for name, flags in spec.items():
            assert name in script
            for flag in flags:
                assert (flag if shell != "fish" else flag.lstrip("-")) in script, (shell, flag)


def test_init_writes_a_commented_scenario_that_runs(tmp_path, capsys):
    path = tmp_path / "starter.yaml"
    assert main(["init", str(path), "--cluster", "dgx-a100", "--nodes", "1", "--model",
                 "gpt3-350m", "--tp", "2", "--seq-len", "1024"]) == 0
    text = path.read_text()
    assert text.count("#") > 20 and "clustersim run" in text
    scenario = load(path)
    assert (scenario.parallel.tp, scenario.parallel.dp, scenario.gpus) == (2, 4, 8)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    assert (tmp_path / "run" / "summary.json").exists()


def test_init_takes_expert_parallelism_for_a_model_with_experts(tmp_path):
    path = tmp_path / "moe.yaml"
    assert main(["init", str(path), "--model", "mixtral-8x7b", "--nodes", "4", "--pp", "4",
                 "--ep", "8"]) == 0
    assert yaml.safe_load(path.read_text())["parallelism"]["ep"] == 8
    assert load(path).parallel.ep == 8


@pytest.mark.parametrize(("flags", "match"), [
    (["--tp", "3"], "--tp 3 x --pp 1 x --cp 1 = 3 must divide the 16 GPUs"),
    (["--model", "gpt-9"], "--model: model.preset: 'gpt-9'"),
    (["--ep", "8"], "--ep 8: the model gpt3-1.3b has no experts"),
    (["--precision", "fp3"], "--precision: 'fp3' is not one of: bf16")])
def test_init_refuses_bad_flags_in_one_line(tmp_path, capsys, flags, match):
    assert main(["init", str(tmp_path / "s.yaml"), *flags]) == 2
    err = capsys.readouterr().err
    assert match in err and err.count("\n") == 1
    assert not (tmp_path / "s.yaml").exists()


def test_init_does_not_replace_a_file_unless_forced(tmp_path, capsys):
    path = tmp_path / "s.yaml"
    path.write_text("mine")
    assert main(["init", str(path)]) == 2
    assert "exists" in capsys.readouterr().err and path.read_text() == "mine"
    assert main(["init", str(path), "--force"]) == 0


def _renamed(tmp_path, name: str):
    raw = yaml.safe_load(QUICKSTART.read_text())
    raw["name"] = name
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_run_several_scenarios_compares_them_in_one_table(tmp_path, capsys):
    a, b = _renamed(tmp_path, "first"), _renamed(tmp_path, "second")
    out = tmp_path / "runs"
    assert main(["run", str(a), str(b), "--out", str(out), "--set",
                 "cluster.compute_jitter=0"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["scenario", "GPUs", "iteration"]
    assert [line.split()[0] for line in table[2:]] == ["first", "second"]
    for name in ("first", "second"):
        assert (out / name / "summary.json").exists()
    assert main(["run", str(a), str(b), "--out", str(out), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["name"] for r in rows] == ["first", "second"]
    assert rows[0]["summary"]["iteration_time_s"] == rows[1]["summary"]["iteration_time_s"]


def test_run_several_refuses_two_scenarios_of_one_name_before_running(tmp_path, capsys):
    a = _renamed(tmp_path, "same")
    assert main(["run", str(a), str(QUICKSTART), str(a), "--out", str(tmp_path / "o")]) == 2
    assert "also" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
