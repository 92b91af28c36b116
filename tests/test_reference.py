"""The generated reference (issue 43, item 1): every scenario key, command,
option and preset has a description, and the pages cover every key the
scenario loader accepts."""

import pytest

from simulator.cli import _parser
from simulator.cli import reference as R


def _section_keys(path: str) -> set[str]:
    return {key for p, _, specs in R.sections() if p == path
            for spec, preset in specs for key, *_ in R.keys(spec, preset)}


def test_every_scenario_key_has_what_it_accepts_and_a_description():
    for path, what, specs in R.sections():
        assert what, path
        for spec, preset in specs:
            for key, accepts, default, text in R.keys(spec, preset):
                assert accepts and default and text, f"{path}.{key} lacks a description"


@pytest.mark.parametrize(("path", "schema"), [
    ("", "simulator.config.scenario:TOP_LEVEL"),
    ("cluster", "simulator.config.cluster:SCHEMA"),
    ("model", "simulator.config.model:SCHEMA"),
    ("training", "simulator.config.training:TRAINING_SCHEMA"),
    ("parallelism", "simulator.config.training:PARALLEL_SCHEMA"),
    ("jobs.NAME", "simulator.config.jobs:PLACEMENT"),
    ("jobs.NAME (kind: background)", "simulator.config.jobs:BACKGROUND"),
    ("network", "simulator.config.network:NetworkSettings"),
    ("simulation", "simulator.config.simulation:SimulationSpec"),
    ("workload", "simulator.config.workload:WorkloadSpec")])
def test_the_reference_lists_exactly_the_keys_the_loader_accepts(path, schema):
    import importlib

    module, name = schema.split(":")
    declared = getattr(importlib.import_module(module), name)
    keys = declared if isinstance(declared, dict) else R.keys(declared, False)
    assert _section_keys(path) == {k if isinstance(k, str) else k[0] for k in keys}


def test_every_command_and_option_has_a_description():
    commands = R.commands(_parser())
    assert {"run", "init", "search", "completion", "presets"} <= set(commands)
    for name, (sub, what) in commands.items():
        assert what, name
        for flags, _, text in R.options(sub):
            assert text, f"clustersim {name} {flags} has no help"


def test_every_preset_is_listed_and_every_cluster_described():
    from topologies import CLUSTERS
    from workloads.models import MODELS

    page = R.presets_page()
    for name in (*CLUSTERS, *MODELS):
        assert f"| `{name}` |" in page
    assert all(c.description for c in CLUSTERS.values())


def test_the_pages_are_written(tmp_path):
    written = R.write(tmp_path)
    assert [p.name for p in written] == ["scenario.md", "cli.md", "presets.md", "summary.md"]
    scenario = (tmp_path / "scenario.md").read_text()
    assert "| `micro_batch` | integer >= 1 | 1 | sequences per micro-batch |" in scenario
    assert "## `clustersim search`" in (tmp_path / "cli.md").read_text()


def test_the_committed_reference_pages_are_the_generated_ones(tmp_path):
    """The pages in docs/reference/ are what the code generates now (the site's
    build writes them again; committed so the README's links resolve): after a
    change, python -c "from simulator.cli.reference import write; write('docs/reference')"."""
    from tests.conftest import ROOT

    for page in R.write(tmp_path):
        assert (ROOT / "docs" / "reference" / page.name).read_text() == page.read_text(), (
            f"docs/reference/{page.name} is stale: regenerate it")


def test_every_summary_key_has_a_description():
    """The golden summaries' keys and those of runs with jobs, MoE, stragglers and
    faults: each is named by a row of ``analysis.summary_keys``."""
    import json

    from simulator import run
    from simulator.analysis.summary_keys import described
    from tests.conftest import ROOT

    keys = set()
    for golden in (ROOT / "tests" / "golden").glob("*.json"):
        keys |= set(json.loads(golden.read_text()))
    for name in ("shared-cluster", "misbehaving-cluster", "moe-deepep-overlap"):
        keys |= set(run(ROOT / "scripts" / "scenarios" / f"{name}.yaml").summary)
    assert keys - described() == set()
