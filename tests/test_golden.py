"""Golden summaries: a change in any simulated figure must be deliberate.

Regenerate after an intended model change with
``CLUSTERSIM_UPDATE_GOLDEN=1 pytest tests/test_golden.py`` and explain the
change in the commit message.
"""

import json
import os

import pytest

from simulator import run
from tests.conftest import QUICKSTART, ROOT

GOLDEN = ROOT / "tests" / "golden"
# Properties of this machine (wall time) or of how the engine works (its event
# and recompute counts), not of what is simulated.
MEASURED = {"wall_s", "events", "network_recomputes", "calls_alone", "steps_replayed",
            "pipeline_steps"}


SCENARIOS = {"quickstart": QUICKSTART,  # A100, the roofline
             "h100": ROOT / "scripts" / "scenarios" / "dgx-h100-gpt3-2.7b-dp64.yaml"}  # table


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_summary_matches_golden(name):
    summary = {k: v for k, v in run(SCENARIOS[name]).summary.items() if k not in MEASURED}
    path = GOLDEN / f"{name}.json"
    if os.environ.get("CLUSTERSIM_UPDATE_GOLDEN"):
        path.write_text(json.dumps(summary, indent=2) + "\n")
    golden = json.loads(path.read_text())
    assert summary.keys() == golden.keys()
    for key, value in golden.items():
        if isinstance(value, float):
            assert summary[key] == pytest.approx(value, rel=1e-9), key
        else:
            assert summary[key] == value, key
