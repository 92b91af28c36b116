"""Hardening, round 2 (issue 36): the features that landed after the first
hardening (several jobs, MoE, stragglers, throttling, faults, search, read-back)
under hostile input. Each test names the issue's item it keeps fixed."""

from __future__ import annotations

import copy
import json

import pytest
import yaml

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.base.user_files import parse_yaml
from simulator.cli import main
from simulator.config.overrides import apply_overrides, split_path
from simulator.config.scenario import from_dict
from tests.test_hardening import one_error

TINY_MODEL = {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000}
MOE_MODEL = {**TINY_MODEL, "experts": 8, "top_k": 2, "expert_ffn_hidden": 256}
TRAIN = {"seq_len": 128, "global_batch": 8, "micro_batch": 1}


def job(model: dict, **parallelism) -> dict:
    return {"nodes": 1, "model": dict(model), "training": dict(TRAIN),
            "parallelism": {"dp": 8, **parallelism}}


def jobs_scenario(jobs: dict, nodes: int = 2) -> dict:
    return {"name": "jobs", "cluster": {"preset": "dgx-h100", "nodes": nodes}, "jobs": jobs}


def write(tmp_path, raw: dict | str, name: str = "s.yaml"):
    path = tmp_path / name
    path.write_text(raw if isinstance(raw, str) else yaml.safe_dump(raw, sort_keys=False))
    return str(path)


# 1. a MoE job beside others ---------------------------------------------------------

@pytest.mark.parametrize("order", [("moe", "dense"), ("dense", "moe")])
def test_a_moe_job_beside_another_prints_its_summary(tmp_path, capsys, order):
    models = {"moe": job(MOE_MODEL, ep=8), "dense": job(TINY_MODEL)}
    path = write(tmp_path, jobs_scenario({name: models[name] for name in order}))
    assert main(["run", path, "--out", str(tmp_path / "r")]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "experts measured, busiest rank x" in out  # the MoE job's own line (the default routing)
    jobs = {j["name"]: j for j in json.loads((tmp_path / "r/summary.json").read_text())["jobs"]}
    assert jobs["moe"]["moe_imbalance_s"] >= 0 and "moe_routing" not in jobs["dense"]


def test_a_moe_job_beside_background_traffic_speaks_for_the_run(tmp_path, capsys):
    background = {"nodes": 1, "kind": "background", "traffic": "all_to_all", "rate": "1 GB/s"}
    summary = run(jobs_scenario({"moe": job(MOE_MODEL, ep=8), "bg": background})).summary
    keys = ("moe_routing", "moe_rank_imbalance", "moe_expert_imbalance", "moe_dropped_fraction",
            "moe_imbalance_s")
    assert all(k in summary for k in keys)  # the run's keys are its only training job's


def test_moe_keys_come_all_together_or_not_at_all():
    from simulator.analysis.summary import MOE_KEYS
    for raw in (jobs_scenario({"a": job(MOE_MODEL, ep=8), "b": job(TINY_MODEL)}),
                jobs_scenario({"a": job(MOE_MODEL, ep=4)}, nodes=1)):
        summary = run(raw).summary
        for part in [summary, *summary.get("jobs", ())]:
            assert sum(k in part for k in MOE_KEYS) in (0, len(MOE_KEYS)), sorted(part)


# 2. job names -------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["1", "true", "null", "~", "0x10", "1.5"])
def test_job_names_are_the_text_written(tmp_path, name):
    text = yaml.safe_dump(jobs_scenario({"x": job(TINY_MODEL), "y": job(TINY_MODEL)}))
    raw = parse_yaml(text.replace("\n  x:\n", f"\n  {name}:\n"), "s.yaml")
    assert list(raw["jobs"]) == [name, "y"]
    names = [j["name"] for j in run(raw).summary["jobs"]]
    assert names == [name, "y"]


def test_job_names_that_are_one_name_are_refused(tmp_path, capsys):
    text = yaml.safe_dump(jobs_scenario({"A": job(TINY_MODEL), "B": job(TINY_MODEL)}))
    path = write(tmp_path, text.replace("\n  A:\n", "\n  1:\n").replace("\n  B:\n", "\n  '1':\n"))
    err = one_error(capsys, main(["run", path]))
    assert "duplicate key '1'" in err
    with pytest.raises(ScenarioError, match="the keys '1' and 1 name one thing"):
        from_dict(jobs_scenario({"1": job(TINY_MODEL), 1: job(TINY_MODEL)}))
    with pytest.raises(ScenarioError, match="is not a job name"):
        from_dict(jobs_scenario({"": job(TINY_MODEL), "b": job(TINY_MODEL)}))
    with pytest.raises(ScenarioError, match="the key None must be a name"):
        from_dict(jobs_scenario({None: job(TINY_MODEL)}))
    assert list(from_dict(jobs_scenario({7: job(TINY_MODEL)}, nodes=1)).source["jobs"]) == ["7"]


def test_yaml_merge_keys_still_merge():
    raw = parse_yaml("base: &b {x: 1, y: 2}\nout:\n  <<: *b\n  y: 3\n", "f")
    assert raw["out"] == {"x": 1, "y": 3}


# 5. dropped tokens ---------------------------------------------------------------------

def _capped(capacity):
    raw = {"name": "moe-cap", "cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {"preset": "mixtral-8x7b", "layers": 2, "routing": "zipf",
                     "routing_skew": 0.6, "capacity_factor": capacity},
           "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1},
           "parallelism": {"dp": 8, "ep": 8, "zero": 1}}
    return run(raw).summary


def test_dropped_tokens_are_no_work_done():
    """Capacity 0.1 drops 90 % of the copies: the model FLOPs count the kept ones
    (MFU used to rise to 53 % against 12 % dropless), and the imbalance is
    measured against the mean rank's kept load (it went negative)."""
    from workloads import kernels as K
    from workloads.models import MODELS
    dropless, capped, tiny = _capped(None), _capped(0.1), _capped(0.01)
    assert capped["moe_dropped_fraction"] > 0.85
    model = MODELS["mixtral-8x7b"]
    from dataclasses import replace
    model = replace(model, layers=2)
    kept = 1 - capped["moe_dropped_fraction"]
    flops = K.model_flops(model, 8, 2048, kept)
    assert capped["model_tflops_per_gpu"] == pytest.approx(
        flops / capped["iteration_time_s"] / 8 / 1e12)
    assert flops < K.model_flops(model, 8, 2048)
    assert capped["mfu"] < dropless["mfu"]
    for summary in (dropless, capped, tiny):
        assert summary["moe_imbalance_s"] >= 0


def test_imbalance_at_capacity_is_measured_against_the_kept_load():
    """At capacity 1.0 the busiest rank is capped at the balanced share, yet it
    still holds more than the mean rank's kept tokens: that costs time."""
    capped = _capped(1.0)
    assert capped["moe_rank_imbalance"] > 1.1 and capped["moe_imbalance_s"] > 0


# 11, 12, 19. bounds, parts named twice, --set paths ------------------------------------

@pytest.mark.parametrize(("sets", "message"), [
    (['cluster.slow={"gpu 3": 1.0e300}'], "must be a slow-down factor from 1 to 100"),
    (['cluster.slow={"gpu 3": 2, "gpu 03": 2}'], "'gpu 03' names gpu 3, as 'gpu 3' does"),
    (['cluster.throttle={"gpu 3": {"1 ms": 2}, "gpu 003": {"2 ms": 2}}'],
     "names gpu 3, as 'gpu 3' does"),
    (['cluster.throttle={"gpu 3": {"1 ms": 1.0e9}}'], "from 1 to 100"),
    (["cluster.fabric.faults=[{nic: n0.nic0, bandwidth: 1.0e-300}]"], "from 0.001 to 1"),
    (["cluster.fabric.faults=[{nic: n0.nic0, bandwidth: 0.5, at: false}]"],
     "faults[0].at: False must be a time"),
    (["cluster.fabric.faults=[{nic: n0.nic0, down: true}, {nic: n0.nic0, bandwidth: 0.5}]"],
     "names the nic n0.nic0 as cluster.fabric.faults[0] does, from the same time"),
    (["cluster.throttle.gpu 12.0.5 ms=3"], 'a --set key that holds a dot is quoted'),
    (['cluster."nodes=1'], "quote a key that holds a dot"),
])
def test_bounds_and_parts_named_twice(tmp_path, capsys, sets, message):
    path = write(tmp_path, {"name": "t", "cluster": {"preset": "dgx-a100", "nodes": 2},
                            "model": TINY_MODEL, "training": dict(TRAIN, global_batch=16),
                            "parallelism": {"dp": 16}})
    args = ["run", path, "--out", str(tmp_path / "r")]
    for assignment in sets:
        args += ["--set", assignment]
    assert message in one_error(capsys, main(args))


def test_set_reaches_keys_with_dots_when_quoted():
    assert split_path('cluster.throttle."gpu 12"."0.5 ms"') == [
        "cluster", "throttle", "gpu 12", "0.5 ms"]
    assert split_path("jobs.'run.2'.nodes") == ["jobs", "run.2", "nodes"]
    raw = apply_overrides({}, ['cluster.throttle."gpu 12"."0.5 ms"=3', 'a."b=c"=4'])
    assert raw == {"cluster": {"throttle": {"gpu 12": {"0.5 ms": 3}}}, "a": {"b=c": 4}}
    for bad in ("a..b", "a.", '"a', '"a"b.c'):
        with pytest.raises(ScenarioError):
            split_path(bad)


def test_a_part_named_by_several_faults_is_in_the_worst_state_started():
    """A link at half its rate from the start, down from 0.1 ms; a switch down from
    the start stays down when a milder fault names it later (nothing recovers:
    a part's state came back with links the first fabric never had)."""
    def scenario(*faults):
        return {"name": "f", "cluster": {"preset": "dgx-h100", "nodes": 2, "leaf_ports": 8,
                                         "fabric": {"faults": list(faults)}},
                "model": TINY_MODEL, "training": dict(TRAIN, global_batch=16),
                "parallelism": {"dp": 16}}
    worse = from_dict(scenario({"link": ["n0.nic0", "leaf0"], "bandwidth": 0.5},
                               {"link": ["n0.nic0", "leaf0"], "down": True, "at": "0.1 ms"}))
    (when, later), = worse.machine.changes
    assert when == 0.0001 and not later.has_edge("n0.nic0", "leaf0")
    assert worse.machine.build_graph().edges["n0.nic0", "leaf0"]["bandwidth"] == 25e9
    milder = scenario({"switch": "spine1", "down": True},
                      {"switch": "spine1", "bandwidth": 0.1, "at": "0.1 ms"})
    (_, later), = from_dict(milder).machine.changes
    assert "spine1" not in later
    summary = run(milder).summary  # (it used to fail: a KeyError on the spine's links)
    assert summary["faults"] == ["switch spine1 down",
                                 "switch spine1 at 10% of its bandwidth from 0.1 ms"]


def test_a_gpus_failed_link_to_its_nic_moves_it_to_another_nic():
    raw = {"name": "f", "cluster": {"preset": "dgx-a100", "nodes": 2, "fabric": {"faults": [
        {"link": ["n0.gpu0", "n0.nic0"], "down": True}]}},
        "model": TINY_MODEL, "training": dict(TRAIN, global_batch=16), "parallelism": {"dp": 16}}
    graph = from_dict(raw).machine.build_graph()
    assert graph.nodes["n0.gpu0"]["nic"] == "n0.nic1"  # the nearest NIC left
    assert run(raw).summary["iteration_time_s"] > 0  # (it used to fail mid-simulation)
    lone = {**raw, "cluster": {**raw["cluster"], "nics_per_node": 1}}
    with pytest.raises(ScenarioError, match="its link to its NIC n0.nic0 failed and server 0 "
                                            "has no other NIC"):
        from_dict(lone)


# 8. background traffic that cannot be simulated ----------------------------------------

@pytest.mark.parametrize(("edit", "message"), [
    ({"message": "1 B"}, "message: '1 B' at 10 GB/s is a message every 0.1 ns"),
    ({"rate": "1000 TB/s"}, "is a message every 4.19 ns"),
    ({"servers": 1}, "servers: 1 is a key of storage traffic"),
    ({"direction": "read"}, "direction: 'read' is a key of storage traffic"),
])
def test_background_traffic_that_cannot_be_simulated_is_refused(edit, message):
    background = {"nodes": 1, "kind": "background", "traffic": "all_to_all", "rate": "10 GB/s",
                  **edit}
    with pytest.raises(ScenarioError, match=message.replace("(", r"\(")):
        from_dict(jobs_scenario({"a": job(TINY_MODEL), "bg": background}))


def test_too_many_background_messages_are_refused_before_they_are_built():
    from simulator.base import footprint
    with pytest.raises(ScenarioError, match=r"jobs.bg.message: 4,000,000 messages per GPU"):
        footprint.check_ops(8_000_000, "jobs.bg.message", "4,000,000 messages per GPU over "
                            "4 ms", "give a larger message", memory=2**30)


# 10. clustersim collective and faults -----------------------------------------------------

def test_collective_names_its_faults_and_refuses_a_fault_in_time(capsys):
    args = ["collective", "--cluster", "dgx-a100", "--nodes", "2", "-b", "1M", "-e", "1M"]
    assert main([*args, "--set", "fabric.faults=[{nic: n0.nic0, down: true}]"]) == 0
    assert "# fault: nic n0.nic0 down" in capsys.readouterr().out
    err = one_error(capsys, main([*args, "--set",
                                  'fabric.faults=[{nic: n0.nic0, down: true, at: "1 ms"}]']))
    assert "a fault applies from the start or not at all: drop its at:" in err


# 12. keys that need experts, and experts that need a MoE layer ------------------------------

@pytest.mark.parametrize(("model", "parallelism", "message"), [
    ({"top_k": 2}, {}, "model.top_k: 2 needs a model with experts"),
    ({"capacity_factor": 1.0}, {}, "model.capacity_factor: 1.0 needs a model with experts"),
    ({}, {"moe_token_dispatcher_type": "flex"},
     "parallelism.moe_token_dispatcher_type: 'flex' needs a model with experts"),
    ({"experts": 8, "first_dense_layers": 2}, {},
     "first_dense_layers: 2 with moe_layer_freq 1 leaves no MoE layer"),
])
def test_expert_keys_need_experts(model, parallelism, message):
    raw = {"name": "m", "cluster": {"preset": "dgx-h100", "nodes": 1},
           "model": {**TINY_MODEL, **model}, "training": dict(TRAIN),
           "parallelism": {"dp": 8, **parallelism}}
    with pytest.raises(ScenarioError, match=message):
        from_dict(raw)


def test_a_routing_histogram_has_one_row_or_one_per_moe_layer(tmp_path):
    model = {**MOE_MODEL, "layers": 4, "routing": "histogram"}
    raw = {"name": "m", "cluster": {"preset": "dgx-h100", "nodes": 1}, "model": model,
           "training": dict(TRAIN), "parallelism": {"dp": 8, "ep": 8}}
    for rows, good in ((1, True), (4, True), (3, False)):
        (tmp_path / "h.csv").write_text("\n".join(["1,2,3,4,5,6,7,8"] * rows) + "\n")
        model["routing_histogram"] = "h.csv"
        if good:
            from_dict(raw, base_dir=tmp_path)
        else:
            with pytest.raises(ScenarioError, match="holds 3 rows; give one row for every MoE "
                                                    r"layer or one per MoE layer \(4\)"):
                from_dict(raw, base_dir=tmp_path)


# 18. the search says what its estimates leave out ------------------------------------------

def test_the_search_estimate_counts_the_slowest_gpu_and_names_what_it_leaves_out():
    from simulator.experiments.estimate import Estimator, unmodelled
    raw = {"name": "s", "cluster": {"preset": "dgx-a100", "nodes": 1},
           "model": TINY_MODEL, "training": dict(TRAIN), "parallelism": {"dp": 8}}
    healthy = from_dict(copy.deepcopy(raw))
    slow = copy.deepcopy(raw)
    slow["cluster"]["slow"] = {"gpu 5": 2.0}
    slowed = from_dict(slow)
    assert Estimator(slowed).slowest == 2.0 and Estimator(healthy).slowest == 1.0
    assert Estimator(slowed).estimate(slowed).seconds > Estimator(healthy).estimate(
        healthy).seconds
    throttled = copy.deepcopy(raw)
    throttled["cluster"]["throttle"] = {"gpu 1": {"1 ms": 2}}
    assert unmodelled(from_dict(throttled)) == ["cluster.throttle"]
    assert unmodelled(healthy) == []


# fuzz: jobs, MoE, faults, throttle and background keys -------------------------------------

FUZZ_BASE = {"name": "fuzz-jobs", "cluster": {"preset": "dgx-h100", "nodes": 3},
             "jobs": {"a": job(MOE_MODEL, ep=4),
                      "bg": {"nodes": 2, "kind": "background", "traffic": "storage",
                             "rate": "2 GB/s", "message": "1 MiB"}}}
FUZZ_KEYS = ["jobs.a.nodes", "jobs.a.placement", "jobs.a.kind", "jobs.a.model.experts",
             "jobs.a.model.top_k", "jobs.a.model.capacity_factor", "jobs.a.model.routing",
             "jobs.a.model.routing_skew", "jobs.a.model.first_dense_layers",
             "jobs.a.parallelism.ep", "jobs.a.parallelism.etp",
             "jobs.a.parallelism.moe_token_dispatcher_type", "jobs.bg.traffic", "jobs.bg.rate",
             "jobs.bg.message", "jobs.bg.servers", "jobs.bg.direction", "jobs.bg.duration",
             "jobs.bg.nodes", "jobs.bg.kind", "cluster.slow", "cluster.throttle",
             "cluster.gpu_speed_spread", "cluster.fabric.faults", "cluster.nodes", "jobs"]


def _fuzz_values():
    from hypothesis import strategies as st

    from tests.test_hardening import VALUES
    part = st.sampled_from(["gpu 3", "gpu 03", "node 1", "node 9", "rack 1", "gpu -1"])
    factor = st.one_of(st.floats(0, 1e6, allow_nan=False), st.sampled_from([1, 1.5, 100, 101]))
    time = st.sampled_from(["0 s", "1 ms", "-1 ms", "1e9 s", "5", False, None])
    fault = st.fixed_dictionaries(
        {"nic": st.sampled_from(["n0.nic0", "n1.nic3", "node 1 nic 2", "leaf0", "n9.nic0"])},
        optional={"down": st.booleans(), "bandwidth": st.one_of(factor, st.just(1e-9)),
                  "at": time})
    link = st.fixed_dictionaries({"link": st.sampled_from([["n0.nic0", "leaf0"],
                                                           ["n0.gpu0", "n0.nic0"], ["a"]])},
                                 optional={"down": st.booleans(), "bandwidth": factor,
                                           "at": time})
    return st.one_of(
        VALUES, st.dictionaries(part, factor, max_size=2),
        st.dictionaries(part, st.dictionaries(time.filter(lambda t: isinstance(t, str)),
                                              factor, max_size=2), max_size=2),
        st.lists(st.one_of(fault, link), max_size=3),
        st.dictionaries(st.sampled_from(["1", "true", "", "a"]), st.just({"nodes": 1}),
                        max_size=2),
        st.sampled_from(["1 B", "1000 TB/s", "1 GB/s", "4 MiB", "storage", "all_to_all",
                         "flex", "allgather", "zipf", "histogram", "background"]))


def test_fuzzed_jobs_moe_faults_and_throttles_end_in_a_result_or_one_line(tmp_path, capsys):
    from hypothesis import given
    from hypothesis import strategies as st

    from tests.test_hardening import FUZZ, _bounded, _set, _without_notes

    @FUZZ
    @given(st.lists(st.tuples(st.sampled_from(FUZZ_KEYS), _fuzz_values()), min_size=1,
                    max_size=3))
    def fuzz(edits):
        scenario = copy.deepcopy(FUZZ_BASE)
        for key, value in edits:
            _set(scenario, key, value)
        path = tmp_path / "fuzz.yaml"
        path.write_text(yaml.safe_dump(scenario, allow_unicode=True))
        code = _bounded(["run", str(path), "--out", str(tmp_path / "out")])
        err = _without_notes(capsys.readouterr().err)
        assert code in (0, 2), (edits, err)
        assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)
        codes.append(code)
    codes: list[int] = []
    fuzz()
    assert 0 in codes and 2 in codes  # (some edits run, some are refused)


def test_fuzzed_faults_on_every_kind_of_part_end_in_a_result_or_one_line(tmp_path, capsys):
    """Faults on any link (NVLink, PCIe, NIC, spine), NIC or switch, failed or
    degraded, from the start or later, several on one part: a result or one line
    (an NVLink down used to reach NVLS, a milder later fault to bring a failed
    switch back, both as internal errors)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from tests.test_hardening import FUZZ, HUNT, _bounded
    base = {"name": "faults", "cluster": {"preset": "dgx-h100", "nodes": 2, "leaf_ports": 8},
            "model": TINY_MODEL, "training": dict(TRAIN),
            "parallelism": {"tp": 2, "pp": 2, "dp": 4}}
    graph = from_dict(base).machine.build_graph()
    links = sorted(graph.edges())
    parts = sorted(n for n, d in graph.nodes(data=True) if d["kind"] in ("nic", "switch"))
    part = st.one_of(st.builds(lambda e: {"link": list(e)}, st.sampled_from(links)),
                     st.builds(lambda n: {graph.nodes[n]["kind"]: n}, st.sampled_from(parts)))
    state = st.one_of(st.just({"down": True}),
                      st.builds(lambda b: {"bandwidth": b}, st.sampled_from([0.001, 0.3, 1.0])))
    when = st.one_of(st.just({}), st.builds(lambda t: {"at": t},
                                            st.sampled_from(["0 s", "0.1 ms", "2 ms"])))
    fault = st.builds(lambda p, s, w: {**p, **s, **w}, part, state, when)

    @settings(FUZZ, max_examples=HUNT or 12)  # (each example writes a whole run)
    @given(st.lists(fault, min_size=1, max_size=4))
    def fuzz(faults):
        raw = copy.deepcopy(base)
        raw["cluster"]["fabric"] = {"faults": faults}
        path = write(tmp_path, raw, "faults.yaml")
        code = _bounded(["run", path, "--out", str(tmp_path / "out")])
        err = capsys.readouterr().err
        assert code in (0, 2), (faults, err)
        assert "Traceback" not in err and err.count("\n") == (code == 2), (faults, err)
    fuzz()
