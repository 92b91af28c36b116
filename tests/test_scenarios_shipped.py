"""Every scenario file the project ships loads and runs end to end."""

import pytest

from simulator import run
from simulator.config.scenario import load
from tests.conftest import ROOT

SCENARIOS = sorted((ROOT / "scripts" / "scenarios").glob("*.yaml"))


@pytest.mark.parametrize("path", SCENARIOS, ids=[p.stem for p in SCENARIOS])
def test_shipped_scenario_runs(path):
    scenario = load(path)
    summary = run(path).summary
    training = [j for j in scenario.jobs if j.background is None]
    per_node = scenario.gpus // scenario.machine.nodes
    gpus = sum(len(j.nodes) * per_node for j in training) if training else scenario.gpus
    assert summary["gpus"] == gpus
    assert 0 < summary["mfu"] < 1
    assert not summary["oom"]
