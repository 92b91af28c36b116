"""Default options pick the fastest exact method: one process per class of ranks
with one program, checked in lockstep while running, classes split where their
ranks diverge, every rank where nothing can be shared.

Wherever a run says it is exact, its summary, per-rank breakdown and
communication log equal a full simulation's (to 1e-9 of the iteration time).
"""

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.engine.gangs import in_step
from simulator.engine.passes import Passes
from simulator.runner.symmetry import equitable, refined
from tests.conftest import ROOT
from tests.test_parallelism import reference, tiny

MEASURED = {"wall_s", "events", "network_recomputes", "simulated_ranks", "simulation",
            "calls_alone", "steps_replayed", "pipeline_steps",
            "simulation_exact", "critical_path"}


def assert_same_run(a, b):
    """Summary, per-rank breakdown and communication log agree to 1e-9 (relative, and
    absolute on the scale of the iteration: a sum of differences of times of order
    one second carries about 1e-13 s of rounding)."""
    scale = 1e-9 * b.summary["iteration_time_s"]
    for key, value in b.summary.items():
        if key in MEASURED:
            continue
        if isinstance(value, float) or (isinstance(value, list) and value and
                                        isinstance(value[0], float)):
            assert a.summary[key] == pytest.approx(value, rel=1e-9, abs=1e-15), key
        elif isinstance(value, list) and value and isinstance(value[0], dict):
            assert len(a.summary[key]) == len(value), key  # (blame: seconds lost per cause)
            for mine, theirs in zip(a.summary[key], value, strict=True):
                assert {k: pytest.approx(v, rel=1e-9, abs=scale) if isinstance(v, float)
                        else v for k, v in mine.items()} == theirs, key
        elif not isinstance(value, dict):
            assert a.summary[key] == value, key
    ra, rb = a.ranks(), b.ranks()
    pd.testing.assert_frame_equal(ra, rb, check_exact=False, rtol=1e-9, atol=scale)
    keys = ["group", "group_index", "collective", "bytes"]
    ca = a.comms.sort_values(keys + ["start"], kind="stable").reset_index(drop=True)
    cb = b.comms.sort_values(keys + ["start"], kind="stable").reset_index(drop=True)
    assert len(ca) == len(cb)
    for column in ("start", "end"):
        assert ca[column].to_numpy() == pytest.approx(cb[column].to_numpy(), rel=1e-9,
                                                      abs=scale)


def test_each_stage_shares_a_process_by_default_and_says_so():
    auto = run(tiny(tp=2, pp=2, dp=4))
    assert auto.summary["simulated_ranks"] == 2  # one per pipeline stage
    assert auto.summary["simulation"].startswith("2 of 16 ranks simulated, exact by symmetry")
    assert auto.summary["simulation_exact"] is True
    assert_same_run(auto, run(reference(tiny(tp=2, pp=2, dp=4))))


@settings(max_examples=6, deadline=None)
@given(tp=st.sampled_from([2, 4]), pp=st.sampled_from([1, 2]),
       zero=st.sampled_from([0, 1]), sp=st.booleans(), micro=st.sampled_from([1, 2]))
def test_random_layouts_by_default_equal_a_full_simulation(tp, pp, zero, sp, micro):
    scenario = tiny(tp=tp, pp=pp, dp=16 // (tp * pp), zero=zero, sequence_parallel=sp)
    scenario["training"]["micro_batch"] = micro
    auto = run(scenario)
    assert auto.summary["simulation_exact"] and auto.summary["simulated_ranks"] == pp
    assert_same_run(auto, run(reference(scenario)))


def test_classes_split_where_the_fabric_treats_their_ranks_differently():
    """Three servers to a leaf: a data-parallel ring's flow between leaves shares an
    uplink with some replicas' pipeline messages, so those replicas fall behind the
    others; the classes split (each split checked by a further run) and the result
    is still every rank's exact timeline."""
    scenario = tiny(tp=8, pp=4, dp=4)
    scenario["cluster"] = {"preset": "dgx-a100", "nodes": 16,
                           "fabric": {"type": "fat_tree", "leaf_ports": 24}}
    scenario["training"]["global_batch"] = 64
    scenario["training"]["seq_len"] = 2048  # kernels long enough for the flows to meet
    scenario["training"]["cuda_graphs"] = True  # (the tiny model's kernels: not host-bound)
    auto = run(copy.deepcopy(scenario))
    assert auto.summary["simulation_exact"] is True
    assert "classes split" in auto.summary["simulation"]
    assert 4 < auto.summary["simulated_ranks"] < 128
    assert_same_run(auto, run(reference(scenario)))


def test_refining_replaces_one_class_by_its_parts():
    assert refined({0: (1, 2, 3), 4: (5, 6)}, [(0, 3), (1,), (2,)]) == {
        4: (5, 6), 0: (3,), 1: (), 2: ()}
    assert in_step({5: 1.0, 7: 1.0 + 1e-12, 9: 0.5}) == [(5, 7), (9,)]


def test_a_split_is_carried_along_pipeline_pairs():
    """Stage 0's ranks {0, 1} and {2, 3} diverged; their pipeline peers 4-7 are
    split the same way, and stage 2 (8-11) after them, in one refinement."""
    pairs = ((0, 4), (1, 5), (2, 6), (3, 7), (4, 8), (5, 9), (6, 10), (7, 11))
    classes = equitable({0: (1,), 2: (3,), 4: (5, 6, 7), 8: (9, 10, 11)}, {"pp": pairs})
    assert classes == {0: (1,), 2: (3,), 4: (5,), 6: (7,), 8: (9,), 10: (11,)}


@given(labels=st.lists(st.integers(0, 2), min_size=8, max_size=8),
       pairs=st.lists(st.tuples(st.integers(0, 7), st.integers(0, 7)), max_size=10))
def test_equitable_classes_only_refine_and_are_stable(labels, pairs):
    """Every class of the result lies inside one given class, and refining the
    result again changes nothing."""
    given: dict[int, list[int]] = {}
    for rank, label in enumerate(labels):
        given.setdefault(label, []).append(rank)
    represents = {ranks[0]: tuple(ranks[1:]) for ranks in given.values()}
    groups = {"pp": tuple(pair for pair in pairs if pair[0] != pair[1])}
    out = equitable(represents, groups)
    assert sorted(r for rep, mates in out.items() for r in (rep, *mates)) == list(range(8))
    for rep, mates in out.items():
        assert len({labels[r] for r in (rep, *mates)}) == 1
    assert equitable(out, groups) == out


def test_jitter_and_the_full_option_simulate_every_rank():
    jittery = tiny(tp=2, dp=8)
    jittery["cluster"]["compute_jitter"] = 0.05
    result = run(jittery)
    assert result.summary["simulated_ranks"] == 16
    assert result.summary["simulation"].startswith("all 16 ranks: compute jitter breaks symmetry")
    full = run(reference(tiny(tp=2, dp=8)))
    assert full.summary["simulation"] == "all 16 ranks: simulation.symmetry is full"
    assert run(tiny(pp=8, dp=2)).summary["simulated_ranks"] == 8  # dp mates share
    one_server = tiny(pp=8, dp=1)
    one_server["cluster"]["nodes"] = 1
    assert run(one_server).summary["simulation"].endswith(
        "every rank runs a program of its own")


def test_an_asymmetric_fabric_splits_the_class(tmp_path):
    """One GPU's PCIe link to its NIC at a quarter of the others': its
    data-parallel calls end later, so the class splits and the run is still exact;
    forced tensor-parallel gangs report themselves not exact."""
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
    assert auto.summary["simulation_exact"] is True
    assert "classes split" in auto.summary["simulation"]
    assert 1 < auto.summary["simulated_ranks"] <= 8
    assert_same_run(auto, run(reference(scenario)))
    forced = copy.deepcopy(scenario)
    forced["simulation"] = {"tensor_parallel_gangs": True}
    gang = run(forced)
    assert gang.summary["simulation_exact"] is False
    assert "not exact: the ranks rank" in gang.summary["simulation"]
    assert np.isfinite(gang.summary["iteration_time_s"])


@pytest.mark.parametrize("parallelism", [
    dict(tp=8, pp=2, dp=2, cluster__nodes=4),
    dict(tp=8, pp=2, dp=2, cluster__nodes=4, zero=1, schedule="interleaved", virtual_stages=2,
         sequence_parallel=True),
    dict(tp=8, pp=4, cluster__nodes=4, training__recompute="full"),
    dict(tp=4, cp=2, pp=2, dp=2, cluster__nodes=4, zero=1, schedule="interleaved",
         virtual_stages=2, sequence_parallel=True),
    dict(tp=2, cp=2, pp=2, dp=4, cluster__nodes=4, bucket_size="1 MB")], ids=str)
def test_replayed_pipeline_steps_by_default_equal_a_full_simulation(parallelism, monkeypatch):
    """Tensor parallelism filling each server (or with context parallelism, the two
    filling it and data-parallel groups sharing servers: ``link_sharing``) makes
    its calls exclusive, so the default run replays pipeline steps
    (engine.passes); its summary, per-rank breakdown and log still equal
    simulating every rank op by op."""
    replays = []
    plain = Passes.run

    def counted(self):
        result = plain(self)
        replays.append(len(self.span_runs.records))
        return result

    monkeypatch.setattr(Passes, "run", counted)
    scenario = tiny(**parallelism)
    auto = run(copy.deepcopy(scenario))
    assert replays and replays[-1] > 0
    assert auto.summary["simulation_exact"] is True
    assert_same_run(auto, run(reference(scenario)))


def test_pipeline_steps_are_replayed_only_without_jitter():
    """A template replays every step of a kind in its first instance's time: with
    per-kernel jitter (approximated or per gang) the steps differ, so no replay."""
    from simulator.config.scenario import from_dict
    from simulator.network.fabric import Fabric
    from simulator.runner.symmetry import choose
    from workloads.program import build_program

    for jitter, expected in ((0.0, True), (0.05, False)):
        scenario = tiny(tp=8, pp=2)
        scenario["cluster"]["compute_jitter"] = jitter
        scenario["simulation"] = {"jitter": "approximate"}
        loaded = from_dict(scenario)
        fabric = Fabric(loaded.machine.build_graph())
        program = build_program(loaded.model, loaded.training, loaded.parallel)
        placement = fabric.graph.graph["gpus"][:program.ranks]
        method = choose(loaded, program, placement, fabric)
        assert ("passes" in method.plugins) is expected
        assert "exclusive_links" in method.plugins
