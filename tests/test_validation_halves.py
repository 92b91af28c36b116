"""Issue 56, item 7: validation that cannot fool itself. Every case belongs to
the ``fit`` or the ``check`` half by its source (declared once, under
``sources:``), and ``clustersim validate`` reports mean absolute and mean
signed error (positive: simulated faster or higher than measured) per group
and per half, with the gap between the halves."""

from __future__ import annotations

import math

import pandas as pd
import pytest
import yaml

from simulator.base.fields import ScenarioError
from simulator.cli import main
from simulator.experiments import validate
from simulator.experiments import validation_stats as stats

CASES = validate.load_cases()
# groups of at least 4 cases that have only one half today (docs/accuracy.md,
# "Two halves"): the end-to-end groups of the check sources are all check, the two
# A100 papers' (a100-2022, korthikanti) all fit, the kernels all fit; end-to-end has both
ONE_SIDED = {"a100-2022", "kernels", "korthikanti", "lowp", "lowp-pairs", "megatron",
             "modern", "moe", "mpt"}

SOURCES = {"paper": {"citation": "A paper", "half": "check"},
           "bench": {"citation": "A benchmark guide", "half": "fit"}}
CASE = {"name": "c1", "tags": ["kernels"], "source": "A benchmark guide, table 1",
        "source_id": "bench", "metric": "hbm_tbs", "counting": "kernel", "unit": "TB/s",
        "measured": 2.0, "assumptions": ["none"], "kernel": {"gpu": "h100-sxm", "bytes": 1e9}}


def _write(tmp_path, sources=None, cases=(CASE,), text: str | None = None):
    """A validation set of ``cases``; by default the sources they name."""
    path = tmp_path / "cases.yaml"
    if sources is None:
        sources = {k: v for k, v in SOURCES.items() if k in {c.get("source_id") for c in cases}}
    path.write_text(text if text is not None else yaml.safe_dump(
        {"sources": sources, "cases": [dict(c) for c in cases]}, sort_keys=False))
    return path


# -- the rules of the set -----------------------------------------------------------

def test_a_case_takes_its_half_from_its_source(tmp_path):
    other = {**CASE, "name": "c2", "source_id": "paper"}
    (fit, check) = validate.load_cases(_write(tmp_path, cases=(CASE, other)))
    assert (fit.basis, fit.source_id, check.basis, check.source_id) == (
        "fit", "bench", "check", "paper")


@pytest.mark.parametrize(("change", "message"), [
    ({"source_id": "nope"}, r"case c1: source_id 'nope' is not declared under sources: "
                            r"\(declared: bench\)"),
    ({"source_id": None}, r"case 1 \(c1\): missing source_id"),
    ({"source_id": ["bench"]}, r"case c1: source_id \['bench'\] is not declared"),
    ({"basis": "check"}, r"case c1: basis 'check' disagrees with its source 'bench', "
                         r"which is in the fit half"),
    ({"basis": "maybe"}, r"case c1: basis 'maybe' disagrees"),
])
def test_a_case_that_breaks_the_rules_is_refused(tmp_path, change, message):
    case = {k: v for k, v in {**CASE, **change}.items() if v is not None}
    with pytest.raises(validate.ValidationError, match=message):
        validate.load_cases(_write(tmp_path, sources={"bench": SOURCES["bench"]}, cases=(case,)))


def test_a_case_that_set_a_parameter_must_be_in_the_fit_half(tmp_path):
    case = {**CASE, "source_id": "paper", "fitted": True}
    with pytest.raises(validate.ValidationError,
                       match="case c1: fitted: a case that set a model parameter is in the fit "
                             "half, but its source 'paper' is in the check half"):
        validate.load_cases(_write(tmp_path, cases=(case,)))
    with pytest.raises(validate.ValidationError, match="case c1: fitted: 'yes' is not true or "
                                                       "false"):
        validate.load_cases(_write(tmp_path, cases=({**CASE, "fitted": "yes"},)))
    (fitted,) = validate.load_cases(_write(tmp_path, cases=({**CASE, "fitted": True},)))
    assert fitted.fitted and fitted.basis == "fit"


@pytest.mark.parametrize(("sources", "message"), [
    ({"bench": {"citation": "x", "half": "both"}},
     "source bench: half 'both' is not one of fit, check"),
    ({"bench": {"half": "fit"}}, "source bench: missing citation"),
    ({"bench": "fit"}, "source bench: must be a mapping of citation and half"),
    ({"bench": {"citation": "x", "half": "fit", "year": 1}}, "source bench: unknown key year"),
    ({}, "sources: must declare at least one source"),
])
def test_a_source_that_breaks_the_rules_is_refused(tmp_path, sources, message):
    with pytest.raises(validate.ValidationError, match=message):
        validate.load_cases(_write(tmp_path, sources=sources))


def test_a_source_declared_twice_is_refused(tmp_path):
    text = ("sources:\n  bench: {citation: x, half: fit}\n  bench: {citation: x, half: check}\n"
            "cases: []\n")
    with pytest.raises(ScenarioError, match="duplicate key 'bench'"):
        validate.load_cases(_write(tmp_path, text=text))


def test_a_set_without_its_sources_table_is_refused(tmp_path):
    path = tmp_path / "cases.yaml"
    path.write_text(yaml.safe_dump([CASE]))
    with pytest.raises(validate.ValidationError, match="must be a mapping with sources and cases"):
        validate.load_cases(path)


def test_an_unused_source_is_refused(tmp_path):
    with pytest.raises(validate.ValidationError,
                       match="sources: paper is declared but no case names it"):
        validate.load_cases(_write(tmp_path, sources=SOURCES))


def test_the_validation_set_obeys_the_rules():
    """Every case names a declared source (load_cases refuses one that does
    not), each source's cases are on one side, both halves hold cases, the
    cases that set a parameter are fit, and the groups of at least 4 cases
    that lack a half are the ones the accuracy page lists."""
    by_source: dict[str, set[str]] = {}
    for case in CASES:
        by_source.setdefault(case.source_id, set()).add(case.basis)
        assert case.basis in ("fit", "check"), case.name
        assert case.basis == "fit" or not case.fitted, case.name
    assert all(len(halves) == 1 for halves in by_source.values()), by_source
    assert {c.basis for c in CASES} == {"fit", "check"}
    assert sum(c.fitted for c in CASES) == 13
    assert set(stats.one_sided_groups(CASES, minimum=4)) == ONE_SIDED


# -- the statistics ----------------------------------------------------------------

def test_the_sign_says_faster_for_every_metric():
    """Positive is simulated faster (or higher) than measured: a rate's error,
    and for a time the error of its rate (2 s measured, 1.6 s simulated is
    25 % faster)."""
    assert validate.case_error_pct("tokens_per_s_per_gpu", 200.0, 210.0) == 5.0
    assert validate.case_error_pct("iteration_time_s", 2.0, 1.6) == pytest.approx(25.0)
    assert validate.case_error_pct("iteration_time_s", 2.0, 2.5) == pytest.approx(-20.0)
    assert validate.case_error_pct("peak_memory_gib", 50.0, 55.0) == pytest.approx(10.0)


def test_errors_summarised_by_hand():
    assert stats.summarise([-5.0, 15.0]) == (2, 10.0, 5.0)
    assert stats.summarise([]) == (0, None, None)


TABLE = pd.DataFrame([
    {"case": "a", "tags": "g", "basis": "fit", "error_pct": 4.0},
    {"case": "b", "tags": "g", "basis": "fit", "error_pct": -2.0},
    {"case": "c", "tags": "g,h", "basis": "check", "error_pct": 10.0},
    {"case": "d", "tags": "g", "basis": "check", "error_pct": -6.0},
])


def test_the_halves_by_hand():
    halves = stats.by_half(TABLE).set_index("group")
    assert list(halves.index) == ["all", "g", "h"]
    g = halves.loc["g"]
    assert (g.fit_cases, g.fit_mae, g.fit_signed) == (2, 3.0, 1.0)
    assert (g.check_cases, g.check_mae, g.check_signed) == (2, 8.0, 2.0)
    assert (g.gap_mae, g.gap_signed) == (5.0, 1.0)
    h = halves.loc["h"]
    assert (h.fit_cases, h.check_cases, h.check_mae) == (0, 1, 10.0)
    assert math.isnan(h.fit_mae) and math.isnan(h.gap_mae)
    assert halves.loc["all"].equals(g)


def test_the_groups_report_their_mean_signed_error():
    groups = validate.by_group(TABLE).set_index("group")
    assert groups.loc["g", "mean_signed_error_pct"] == 1.5
    assert groups.loc["g", "mean_abs_error_pct"] == 5.5


def test_one_sided_groups_by_hand():
    def case(name, tags, basis):
        return validate.Case(name, tags, "s", "busbw", "", "GB/s", 1.0, basis, (), "collective",
                             {})
    cases = [case("a", ("g", "h"), "fit"), case("b", ("g", "h"), "check"),
             case("c", ("h",), "check"), case("d", ("k",), "check")]
    assert stats.one_sided_groups(cases, minimum=1) == ["k"]
    assert stats.one_sided_groups(cases, minimum=2) == []


# -- the command and the page --------------------------------------------------------

def test_validate_prints_the_halves(capsys):
    args = ["validate", "--tag", "nccl-tests", "--tag", "kernels"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "mean signed" in out and "gap" in out
    line = next(x for x in out.splitlines() if x.startswith("all "))
    assert "fit" not in line and line.count("%") == 4, line
    assert main([*args, "--markdown"]) == 0
    out = capsys.readouterr().out
    assert "| group | fit: cases | fit: mean abs. | fit: mean signed | check: cases |" in out
    assert main([*args, "--summary"]) == 0
    summary = capsys.readouterr().out
    assert "gemm-a100-8192" not in summary and "mean signed" in summary


def test_the_page_is_rendered_from_one_run(capsys):
    """``scripts/refresh_accuracy.py`` runs every case once and renders each
    block from that one table: what it renders is what the command prints."""
    from simulator.cli import validate as command

    table = validate.run_cases(validate.select(CASES, tags=["kernels", "nccl-tests"]))
    for args in (["--tag", "kernels", "--markdown"], ["--summary", "--tag", "nccl-tests"]):
        assert main(["validate", *args]) == 0
        assert command.block(table, CASES, args) == capsys.readouterr().out
