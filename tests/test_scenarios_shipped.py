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
    assert summary["gpus"] == scenario.gpus
    assert 0 < summary["mfu"] < 1
    assert not summary["oom"]
