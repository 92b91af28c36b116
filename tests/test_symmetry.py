"""Default options pick the fastest exact method: tensor-parallel gangs where the
ranks are provably equivalent (checked while running), every rank otherwise.

Wherever a run says it is exact, its summary, per-rank breakdown and
communication log equal a full simulation's (to 1e-9).
"""

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from tests.conftest import ROOT
from tests.test_parallelism import reference, tiny

MEASURED = {"wall_s", "events", "network_recomputes", "simulated_ranks", "simulation",
            "simulation_exact", "critical_path"}


def assert_same_run(a, b):
    """Summary, per-rank breakdown and communication log agree to 1e-9."""
    for key, value in b.summary.items():
        if key in MEASURED:
            continue
        if isinstance(value, float) or (isinstance(value, list) and value and
                                        isinstance(value[0], float)):
            assert a.summary[key] == pytest.approx(value, rel=1e-9, abs=1e-15), key
        elif not isinstance(value, dict):
            assert a.summary[key] == value, key
    ra, rb = a.ranks(), b.ranks()
    pd.testing.assert_frame_equal(ra, rb, check_exact=False, rtol=1e-9, atol=1e-15)
    keys = ["group", "group_index", "collective", "bytes"]
    ca = a.comms.sort_values(keys + ["start"], kind="stable").reset_index(drop=True)
    cb = b.comms.sort_values(keys + ["start"], kind="stable").reset_index(drop=True)
    assert len(ca) == len(cb)
    for column in ("start", "end"):
        assert ca[column].to_numpy() == pytest.approx(cb[column].to_numpy(), rel=1e-9)


def test_tensor_parallel_layouts_share_a_process_by_default_and_say_so():
    auto = run(tiny(tp=2, pp=2, dp=4))
    assert auto.summary["simulated_ranks"] == 8
    assert auto.summary["simulation"].startswith("8 of 16 ranks simulated, exact by symmetry")
    assert auto.summary["simulation_exact"] is True
    assert_same_run(auto, run(reference(tiny(tp=2, pp=2, dp=4))))


@settings(max_examples=6, deadline=None)
@given(tp=st.sampled_from([2, 4]), pp=st.sampled_from([1, 2]),
       zero=st.sampled_from([0, 1]), sp=st.booleans(), micro=st.sampled_from([1, 2]))
def test_random_layouts_by_default_equal_a_full_simulation(tp, pp, zero, sp, micro):
    scenario = tiny(tp=tp, pp=pp, dp=16 // (tp * pp), zero=zero, sequence_parallel=sp)
    scenario["training"]["micro_batch"] = micro
    auto = run(scenario)
    assert auto.summary["simulation_exact"] and auto.summary["simulated_ranks"] == 16 // tp
    assert_same_run(auto, run(reference(scenario)))


def test_jitter_and_the_full_option_simulate_every_rank():
    jittery = tiny(tp=2, dp=8)
    jittery["cluster"]["compute_jitter"] = 0.05
    result = run(jittery)
    assert result.summary["simulated_ranks"] == 16
    assert result.summary["simulation"] == "all 16 ranks: compute jitter breaks symmetry"
    full = run(reference(tiny(tp=2, dp=8)))
    assert full.summary["simulation"] == "all 16 ranks: simulation.symmetry is full"
    assert run(tiny(dp=16)).summary["simulation"].endswith(
        "no tensor-parallel groups to share a process")


def test_an_asymmetric_fabric_falls_back_to_every_rank(tmp_path):
    """One GPU's PCIe link to its NIC at a quarter of the others': its
    tensor-parallel mate's data-parallel calls end later, so the gang is not
    exact and every rank is simulated instead."""
    text = (ROOT / "scripts" / "fabrics" / "two-dgx-one-switch.yaml").read_text()
    slow = "{a: a.gpu1, b: a.nic0, bandwidth: \"8 GB/s\""
    fabric = tmp_path / "fabric.yaml"
    fabric.write_text(text.replace("{a: a.gpu1, b: a.nic0, bandwidth: \"32 GB/s\"", slow))
    scenario = {"name": "asymmetric", "cluster": {"preset": "dgx-a100", "fabric": {
                    "type": "file", "path": str(fabric)}},
                "model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 4096},
                "training": {"seq_len": 512, "global_batch": 16},
                "parallelism": {"tp": 2, "dp": 4}}
    auto = run(copy.deepcopy(scenario))
    assert auto.summary["simulated_ranks"] == 8
    assert auto.summary["simulation"].startswith("all 8 ranks: tensor-parallel mates of rank")
    assert "so symmetry does not hold" in auto.summary["simulation"]
    assert_same_run(auto, run(reference(scenario)))
    forced = copy.deepcopy(scenario)
    forced["simulation"] = {"tensor_parallel_gangs": True}
    gang = run(forced)
    assert gang.summary["simulation_exact"] is False
    assert "not exact: tensor-parallel mates" in gang.summary["simulation"]
    assert np.isfinite(gang.summary["iteration_time_s"])
