"""Things declared once and read from their declaration (issue 42, items 5 and
6): each parallel dimension (``workloads.strategies.dimension``) agrees with the
scenario's fields, the rank layout, the streams and the program's groups, and a
new one reaches the layout search and ``clustersim search`` with no other edit;
the ``simulation``, ``network`` and cluster run-time keys are settings on their
specs."""

import argparse
import dataclasses

import pytest

from simulator.base.ir import COMMUNICATION_STREAMS
from simulator.cli.search import add_parser, space_from
from simulator.config.scenario import from_dict
from simulator.experiments import layouts as L
from workloads import layout as rank_layout
from workloads import program
from workloads.strategies.dimension import Dimension, only_one
from workloads.training import ParallelSpec

MOE = {"name": "dims", "seed": 0, "cluster": {"preset": "dgx-h100", "nodes": 2},
       "model": {"preset": "mixtral-8x7b", "layers": 4},
       "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
       "parallelism": {"tp": 2, "pp": 2, "ep": 4, "etp": 2, "sequence_parallel": True}}


def test_each_dimension_is_a_scenario_field_with_a_stream_and_its_own_groups():
    names = [d.name for d in program.DIMENSIONS]
    assert len(set(names)) == len(names) == 6
    fields = {f.name for f in dataclasses.fields(ParallelSpec)}
    assert set(names) <= fields
    assert {d.stream for d in program.DIMENSIONS} <= set(COMMUNICATION_STREAMS)
    # the dimensions that take GPUs are the rank layout's
    assert {d.name for d in program.DIMENSIONS if not d.carved} == set(rank_layout.DIMENSIONS)
    scenario = from_dict(MOE)
    groups = program.build_program(scenario.model, scenario.training, scenario.parallel).groups
    for d in program.DIMENSIONS:
        assert any(name == d.name or name.startswith(f"{d.name}.") for name in groups), d.name


def test_a_new_dimension_reaches_the_search_and_its_flag_with_no_other_edit(monkeypatch):
    """A toy dimension put in ``program.DIMENSIONS`` (as its strategy module's
    declaration would) is a search column, a default-space entry, a flag with
    its help, a label part above 1 and a scenario override."""
    toy = Dimension("xp", "ep", "toy-parallel sizes", only_one, carved=True)
    monkeypatch.setattr(program, "DIMENSIONS", (*program.DIMENSIONS, toy))
    assert "xp" in L.columns() and L.default_space(16, 8, 16, 8, 32)["xp"] == [1]
    assert L.flags()["xp"] == ("--xp", int, "toy-parallel sizes")
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["search", "base.yaml", "--xp", "1,2"])
    assert space_from(args, 16, 8, 16, 8, 32)["xp"] == [1, 2]
    layout = L.Layout(tp=2, pp=1, dp=8, xp=2)
    assert "xp2" in layout.label and ("parallelism.xp", 2) in layout.overrides()
    space = L.check_space({"tp": [1, 2], "pp": [1], "mbs": [1], "xp": [1, 2]})
    found = L.combinations(space, world=16, layers=8, heads=16, domain=8, global_batch=32)
    assert {layout.xp for layout in found} == {1, 2}


def test_expert_tensor_parallelism_is_searched_where_asked():
    base = {key: value for key, value in MOE.items() if key != "parallelism"}
    space = L.check_space({"tp": [2], "pp": [1], "mbs": [1], "ep": [4], "etp": [1, 2]})
    good, refused = L.candidates(base, space)
    assert {layout.etp for layout in good} == {1, 2}
    assert "etp2" in next(layout for layout in good if layout.etp == 2).label


def test_a_layout_rejects_what_is_not_a_column():
    with pytest.raises(TypeError, match="a layout takes tp, pp"):
        L.Layout(tp=1, pipeline=2)


@pytest.mark.parametrize(("section", "spec"), [
    ("simulation", "simulator.config.simulation:SimulationSpec"),
    ("network", "simulator.config.network:NetworkSettings")])
def test_the_run_time_sections_keys_are_the_settings_their_spec_declares(section, spec):
    """Issue 42, item 6: ``simulation.*`` and ``network.*`` are read from their
    spec's declared settings, so a key added there is a scenario key (and an
    unknown one is refused with the spec's list)."""
    import importlib

    from simulator.base.fields import ScenarioError, schema_of

    module, name = spec.split(":")
    declared = sorted(schema_of(getattr(importlib.import_module(module), name)))
    raw = {**{k: v for k, v in MOE.items() if k != "parallelism"}, section: {"nope": 1}}
    with pytest.raises(ScenarioError, match=f"allowed: {', '.join(declared)}$"):
        from_dict(raw)


def test_the_clusters_run_time_keys_are_settings_on_the_machine():
    from simulator.base.fields import schema_of
    from simulator.config.cluster import SCHEMA, Machine

    run_time = set(schema_of(Machine))
    assert {"compute_jitter", "slow", "gpu_speed_spread", "throttle", "calibration",
            "kernel_table", "overlap_slowdown"} == run_time and run_time <= set(SCHEMA)
    raw = {**MOE, "cluster": {**MOE["cluster"], "slow": {"gpu 3": 1.5},
                              "compute_jitter": 0.01}}
    machine = from_dict(raw).machine
    assert machine.compute_jitter == 0.01 and machine.slow == (("gpu", 3, 1.5),)
