"""Megatron-LM SC21 Table 1 rows: simulated TFLOP/s per GPU (counted the paper's
way, Eq. 3) within 15 % of the published figure. The two largest rows take
minutes and are run by ``python scripts/megatron_table1.py`` (README table)."""

import runpy

import pytest

from tests.conftest import ROOT

TABLE = runpy.run_path(str(ROOT / "scripts" / "megatron_table1.py"))
FAST_ROWS = ["1.7b", "3.6b", "7.5b", "18.4b", "39.1b", "76.1b", "145.6b"]


@pytest.mark.parametrize("row", FAST_ROWS)
def test_table1_row_within_fifteen_percent(row):
    result = TABLE["simulate_row"](row)
    assert abs(result["error_pct"]) < 15, result
    assert result["peak_memory_gib"] < 80, "the published configurations fit in 80 GB"


def test_every_row_has_a_scenario():
    scenarios = sorted(p.stem for p in (ROOT / "scripts" / "scenarios" / "megatron").glob(
        "*.yaml"))
    assert scenarios == sorted(f"megatron-{row}" for row in TABLE["PUBLISHED"])
