"""Layout search: the enumeration's rules, the first pass against the simulation
(memory exactly, time as an estimate), the Pareto front, and the command end to
end (outputs, resuming, bad input)."""

import copy

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator.base.fields import ScenarioError
from simulator.cli import main
from simulator.config.scenario import from_dict
from simulator.experiments import layouts as L
from simulator.experiments.estimate import Estimator
from simulator.experiments.search import run_search
from simulator.outputs.search_plot import pareto_front
from simulator.runner.simulate import run

GIB = 2**30
BASE = {
    "name": "search-tiny",
    "seed": 0,
    "cluster": {"preset": "dgx-a100", "nodes": 2, "compute_jitter": 0.0},
    "model": {"layers": 8, "hidden": 1024, "heads": 16, "vocab": 8192},
    "training": {"seq_len": 1024, "global_batch": 32},
}


def lay(tp, pp, cp, dp, mbs, recompute, zero, schedule, virtual_stages, ep=1):
    """A search layout by its values in the order this file writes them."""
    return L.Layout(tp=tp, pp=pp, cp=cp, dp=dp, mbs=mbs, recompute=recompute, zero=zero,
                    schedule=schedule, virtual_stages=virtual_stages, ep=ep)


MIXED = [lay(1, 1, 1, 16, 1, "none", 0, "1f1b", 1),
         lay(2, 4, 1, 2, 1, "selective", 1, "1f1b", 1),
         lay(4, 4, 1, 1, 2, "full", 0, "interleaved", 2),
         lay(4, 2, 1, 2, 4, "none", 1, "1f1b", 1),
         lay(1, 1, 1, 16, 2, "full", 3, "1f1b", 1),
         lay(8, 1, 1, 2, 1, "none", 0, "1f1b", 1),
         lay(2, 8, 1, 1, 1, "selective", 0, "gpipe", 1),
         lay(2, 2, 2, 2, 1, "none", 0, "1f1b", 1),
         lay(1, 4, 1, 4, 1, "none", 1, "interleaved", 2)]


def test_combinations_divide_evenly_and_keep_tensor_parallelism_in_a_server():
    space = L.check_space({"tp": [1, 2, 4, 8, 16], "pp": [1, 2, 3, 4, 8], "mbs": [1, 2, 3],
                           "schedule": ["1f1b", "interleaved"], "cp": [1, 2]})
    found = L.combinations(space, world=32, layers=8, heads=16, domain=8,
                           global_batch=64)
    assert found and len(set(found)) == len(found)
    for layout in found:
        assert layout.tp * layout.pp * layout.cp * layout.dp == 32
        assert layout.tp <= 8 and 16 % layout.tp == 0 and 8 % layout.pp == 0
        micro = 64 // (layout.dp * layout.mbs)
        assert micro * layout.dp * layout.mbs == 64
        if layout.schedule == "interleaved":
            assert layout.pp > 1 and micro % layout.pp == 0
            assert (8 // layout.pp) % layout.virtual_stages == 0
        else:
            assert layout.virtual_stages == 1
    assert lay(2, 4, 1, 4, 1, "none", 0, "interleaved", 2) in found
    assert not any(layout.pp == 3 or layout.tp == 16 for layout in found)


def test_the_scenario_checks_refuse_what_the_simulator_cannot_run_and_say_why():
    base = copy.deepcopy(BASE)
    base["training"]["flash_attention"] = False  # ring attention needs fused attention
    good, refused = L.candidates(base, L.check_space({"tp": [1], "pp": [1], "mbs": [1],
                                                      "cp": [1, 2]}))
    assert [layout.cp for layout in good] == [1]
    assert [layout.cp for layout in refused] == [2]
    assert "parallelism.cp > 1 needs training.flash_attention" in next(iter(refused.values()))


@pytest.mark.parametrize(("option", "text", "match"), [
    ("--pp", "1-x", r"--pp: '1-x' must be integers \(1,2,4\) or ranges \(1-16\)"),
    ("--tp", ",", r"--tp: ',' must list at least one value")])
def test_bad_values_name_the_flag(option, text, match):
    with pytest.raises(ScenarioError, match=match):
        L.parse_values(text, option)


def test_bad_spaces_name_the_dimension_and_what_is_allowed():
    with pytest.raises(ScenarioError, match="'pipeline' is not a dimension; allowed: tp, pp"):
        L.check_space({"tp": [1], "pp": [1], "mbs": [1], "pipeline": [2]})
    with pytest.raises(ScenarioError, match="--recompute: 'some' is not one of: none"):
        L.check_space({"tp": [1], "pp": [1], "mbs": [1], "recompute": ["some"]})


@pytest.fixture(scope="module")
def simulated():
    """Each mixed layout's scenario, its first pass and its simulation."""
    out, estimator = [], None
    for layout in MIXED:
        scenario = from_dict(layout.scenario(BASE))
        estimator = estimator or Estimator(scenario)
        out.append((layout, estimator.estimate(scenario), run(scenario).summary))
    return out


def test_the_first_pass_memory_is_the_simulated_peak(simulated):
    for layout, estimate, summary in simulated:
        assert estimate.peak_bytes / GIB == pytest.approx(summary["peak_memory_gib"],
                                                          rel=1e-9), layout.label


def test_the_first_pass_time_is_within_ten_percent_of_the_simulation(simulated):
    for layout, estimate, summary in simulated:
        assert estimate.seconds == pytest.approx(summary["iteration_time_s"], rel=0.10), \
            layout.label


@given(st.lists(st.tuples(st.floats(1, 80), st.floats(1, 1e6)), min_size=1, max_size=30))
def test_the_pareto_front_holds_exactly_the_undominated_points(points):
    memory, speed = (np.array(x) for x in zip(*points, strict=True))
    front = pareto_front(memory, speed)
    for i in range(len(points)):
        dominated = any(memory[j] <= memory[i] and speed[j] >= speed[i]
                        and (memory[j] < memory[i] or speed[j] > speed[i])
                        for j in range(len(points)))
        assert front[i] == (not dominated)


def test_a_search_ranks_simulated_layouts_lists_the_rest_and_resumes(tmp_path):
    base = copy.deepcopy(BASE)
    base["cluster"]["gpu"] = "a100-sxm-40gb"
    base["model"].update(layers=16, hidden=4096, heads=32)  # 3.3B: not every layout fits
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(base))
    space = {"tp": [1, 2, 4], "pp": [1, 2], "mbs": [1, 2], "recompute": ["none", "full"]}
    table, _ = run_search(path, space, tmp_path / "out", top=3, workers=1)
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    statuses = table["status"].tolist()
    assert statuses[:3] == ["simulated"] * 3 and "does not fit" in statuses
    simulated = table[table["status"] == "simulated"]
    assert simulated["iteration_time_s"].is_monotonic_increasing
    too_big = table[table["status"] == "does not fit"]
    assert (too_big["peak_memory_gib"] > 40).all()
    assert too_big["why"].str.contains("GiB on stage").all()
    assert pd.read_parquet(tmp_path / "out" / "search.parquet")["layout"].tolist() == \
        table["layout"].tolist()
    log = (tmp_path / "out" / "results.jsonl").read_text()
    estimates = tmp_path / "out" / "estimates.jsonl"
    lines = estimates.read_text().splitlines(keepends=True)
    assert len(lines) == len(table)
    estimates.write_text("".join(lines[:5]) + lines[5][:20])  # killed mid-write
    again, _ = run_search(path, space, tmp_path / "out", top=3, workers=1)
    assert (tmp_path / "out" / "results.jsonl").read_text() == log  # nothing ran again
    assert again["layout"].tolist() == table["layout"].tolist()
    assert estimates.read_text().splitlines(keepends=True)[:5] == lines[:5]
    assert len(estimates.read_text().splitlines()) == len(table)


def test_the_command_writes_the_best_layout_ready_to_run(tmp_path, capsys):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    out = tmp_path / "out"
    assert main(["search", str(path), "--out", str(out), "--tp", "1,2,4", "--pp", "1,2",
                 "--mbs", "1", "--zero", "0", "--recompute", "none", "--top", "3",
                 "--workers", "1", "--compare"]) == 0
    text = capsys.readouterr().out
    assert "best layout" in text and "winner against runner-up" in text
    best = yaml.safe_load((out / "best.yaml").read_text())
    table = pd.read_csv(out / "search.csv")
    assert from_dict(best).parallel.tp == table.iloc[0]["tp"]
    assert (out / "search.png").read_bytes()[:4] == b"\x89PNG"
    assert (out / "best" / "summary.json").exists()
    compare = pd.read_csv(out / "compare.csv")
    assert compare.iloc[0]["part"] == "iteration" and compare.iloc[0]["difference_s"] >= 0


def test_the_command_refuses_bad_flags_with_exit_2(tmp_path, capsys):
    path = tmp_path / "base.yaml"
    path.write_text(yaml.safe_dump(BASE))
    assert main(["search", str(path), "--out", str(tmp_path / "o"), "--tp", "two"]) == 2
    assert "--tp: 'two' must be integers" in capsys.readouterr().err


def test_selective_recompute_is_the_same_run_as_none_under_fused_attention():
    good, refused = L.candidates(BASE, L.check_space({"tp": [1], "pp": [1], "mbs": [1],
                                                      "recompute": ["none", "selective"]}))
    assert [layout.recompute for layout in good] == ["none"]
    assert "the same run as recompute none" in refused[lay(1, 1, 1, 16, 1, "selective", 0,
                                                                "1f1b", 1)]


def test_a_space_file_gives_the_dimensions_and_flags_replace_one(tmp_path):
    from simulator.cli.search import space_from

    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({"tp": [1, 2], "pp": [1], "mbs": [1, 2],
                                     "recompute": "full"}))

    class Args:
        pass

    args = Args()
    args.space = str(space)
    for dim in ("tp", "pp", "cp", "ep", "mbs", "recompute", "zero", "schedule",
                "virtual_stages"):
        setattr(args, dim, None)
    args.pp = "1-2"
    got = space_from(args, 16, 8, 16, 8, 32)
    assert got == {"tp": [1, 2], "pp": [1, 2], "mbs": [1, 2], "recompute": ["full"]}
    args.space = None
    default = space_from(args, 16, 8, 16, 8, 32)
    assert default["pp"] == [1, 2] and default["tp"] == [1, 2, 4, 8] and default["ep"] == [1]
    # a rack-scale NVLink domain lets tp grow past a server; experts add ep's powers of two
    rack = space_from(args, 144, 8, 64, 72, 32, experts=64)
    assert rack["tp"] == [1, 2, 4, 8, 16, 32, 64] and rack["ep"] == [1, 2, 4, 8, 16, 32, 64]
    args.ep = "4,8"
    assert space_from(args, 144, 8, 64, 72, 32, experts=64)["ep"] == [4, 8]


def test_pipeline_messages_on_the_steady_state_cycle():
    """1F1B: 2 (p - 1) messages per p micro-batches; interleaved: one each way per
    chunk step (the ring of stages); GPipe and no pipeline: none."""
    from simulator.experiments.estimate import _cycle_messages
    from workloads.schedules import Schedule
    assert _cycle_messages(Schedule.ONE_F_ONE_B, 4) == pytest.approx(1.5)
    assert _cycle_messages(Schedule.INTERLEAVED, 4) == 2.0
    assert _cycle_messages(Schedule.GPIPE, 4) == 0.0
    assert _cycle_messages(Schedule.ONE_F_ONE_B, 1) == 0.0


def test_the_python_api_returns_the_ranked_table(tmp_path):
    import simulator
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    table = simulator.search(base, {"tp": [2, 4], "pp": [1, 2], "mbs": [1]}, tmp_path / "out",
                             top=2)
    assert list(table["rank"]) == list(range(1, len(table) + 1))
    assert (table["status"] == "simulated").sum() == 2
    assert (tmp_path / "out" / "search.parquet").exists()


def test_the_search_simulates_on_dask_as_it_does_locally(tmp_path):
    distributed = pytest.importorskip("distributed")
    base = tmp_path / "base.yaml"
    base.write_text(yaml.safe_dump(BASE))
    space = {"tp": [2, 4], "pp": [1, 2], "mbs": [1]}
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False,
                                  dashboard_address=None) as cluster:
        on_dask, _ = run_search(base, space, tmp_path / "dask", top=3,
                                dask=cluster.scheduler_address)
    local, _ = run_search(base, space, tmp_path / "local", top=3)
    columns = ["layout", "status", "iteration_time_s", "peak_memory_gib"]
    pd.testing.assert_frame_equal(on_dask[columns], local[columns])


def test_a_rack_scale_domain_lets_tensor_parallelism_leave_the_tray_and_ep_is_searched():
    base = {"name": "moe-rack", "cluster": {"preset": "gb200-nvl72", "nodes": 4},
            "model": {"preset": "mixtral-8x7b", "kv_heads": 32},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallelism": {"tp": 1, "pp": 1}}
    space = L.check_space({"tp": [8, 16], "pp": [1], "mbs": [1], "ep": [1, 8]})
    good, refused = L.candidates(base, space)
    assert {(layout.tp, layout.ep) for layout in good} >= {(8, 1), (16, 1), (8, 8)}
    assert "ep8" in lay(8, 1, 1, 2, 1, "none", 0, "1f1b", 1, 8).label
    # on 8-GPU servers tp 16 leaves the NVLink domain: not in the space
    base["cluster"] = {"preset": "dgx-b200", "nodes": 2}
    assert all(layout.tp <= 8 for layout in L.candidates(base, space)[0])
