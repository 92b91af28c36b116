"""The study scripts run end to end (in their --quick designs) and write their
CSV and figure."""

import subprocess
import sys

import pandas as pd
import pytest

from tests.conftest import ROOT

STUDIES = ["pp_vs_dp_bandwidth", "bucket_size", "pipeline_partition", "fsdp_thresholds",
           "dp_scaling_polaris", "comm_characteristics", "layout_search",
           "moe_expert_parallel", "stragglers", "failed_spine", "job_placement",
           "polaris_variability", "nvlink_domain", "low_precision"]


@pytest.mark.parametrize("name", STUDIES)
def test_study_writes_its_csv_and_figure(tmp_path, name):
    script = ROOT / "scripts" / "studies" / f"{name}.py"
    done = subprocess.run([sys.executable, str(script), "--quick", "--out", str(tmp_path),
                           "--runs", str(tmp_path / "runs"), "--workers", "1"],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    table = pd.read_csv(tmp_path / f"{name}-quick.csv")
    assert len(table) >= 2
    assert (tmp_path / f"{name}-quick.png").read_bytes()[:4] == b"\x89PNG"


def test_the_studies_page_shows_every_study():
    page = (ROOT / "docs" / "studies.md").read_text()
    for name in STUDIES:
        assert f"](studies/{name}.png)" in page, name
        assert (ROOT / "docs" / "studies" / f"{name}.png").exists()
        assert (ROOT / "docs" / "studies" / f"{name}.csv").exists()
