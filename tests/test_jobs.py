"""Several jobs on one fabric: placement, merged programs, per-job summaries and
slow-downs, background traffic, blame naming the other job, and bad input."""

import copy

import numpy as np
import pytest
import yaml

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.base.ir import Program
from simulator.cli import main
from simulator.config.scenario import from_dict
from tests.test_faults import assert_same_run
from topologies.placement import PlacementError, place
from workloads.background import BackgroundSpec, background_program, messages
from workloads.jobs import merge

GPT = {"model": {"preset": "gpt3-125m"},
       "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
       "parallelism": {"dp": 16}}


def shared(placement: str = "scattered", oversubscription: float = 4, nodes: int = 4,
           **extra) -> dict:
    """Two equal GPT jobs of two DGX H100 servers each, two servers per leaf,
    uplinks ``oversubscription``:1."""
    return {"name": "shared", "cluster": {"preset": "dgx-h100", "nodes": nodes,
                                          "leaf_ports": 16,
                                          "oversubscription": oversubscription},
            "jobs": {"a": {"nodes": 2, "placement": placement, **copy.deepcopy(GPT)},
                     "b": {"nodes": 2, "placement": placement, **copy.deepcopy(GPT)},
                     **extra}}


def by_name(summary: dict) -> dict:
    return {job["name"]: job for job in summary["jobs"]}


# placement (pure) ----------------------------------------------------------------

def test_contiguous_jobs_take_consecutive_free_nodes():
    assert place([("a", 3, "contiguous"), ("b", 2, "contiguous")], 6) == [(0, 1, 2), (3, 4)]


def test_scattered_jobs_spread_over_the_free_nodes():
    assert place([("a", 2, "scattered"), ("b", 2, "scattered")], 4) == [(0, 2), (1, 3)]
    assert place([("a", 3, "scattered")], 9) == [(0, 3, 6)]


def test_given_nodes_are_placed_first_and_random_is_seeded():
    out = place([("a", 2, "contiguous"), ("b", (0, 1), "given")], 4)
    assert out == [(2, 3), (0, 1)]
    draw = place([("a", 3, "random")], 16, seed=7)
    assert draw == place([("a", 3, "random")], 16, seed=7)
    assert draw != place([("a", 3, "random")], 16, seed=8)
    assert len(set(draw[0])) == 3 and all(0 <= n < 16 for n in draw[0])


@pytest.mark.parametrize("requests, message", [
    ([("a", 5, "contiguous")], "needs 5 node(s), only 4"),
    ([("a", (4,), "given")], "outside the cluster"),
    ([("a", (1,), "given"), ("b", (1,), "given")], "given to another job"),
    ([("a", (1,), "given"), ("b", 3, "contiguous")], "no 3 consecutive nodes"),
])
def test_impossible_placements_name_the_job(requests, message):
    with pytest.raises(PlacementError, match="job [ab]: .*" + message.replace("(", r"\(")
                       .replace(")", r"\)")):
        place(requests, 4)


def test_merged_programs_keep_each_jobs_groups_on_its_own_ranks():
    a = Program(((), ()), {"dp": ((0, 1),), "pp": ((0,), (1,))}, ({}, {}), 1.0, 2)
    b = Program(((), (), ()), {"dp": ((0, 1, 2),)}, ({}, {}, {}), 2.0, 3)
    merged = merge([a, b])
    assert merged.groups == {"dp": ((0, 1), (2, 3, 4)), "pp": ((0,), (1,))}
    assert (merged.ranks, merged.model_flops, merged.tokens) == (5, 3.0, 5)


def test_background_paces_its_messages_and_pairs_storage_clients_with_servers():
    spec = BackgroundSpec("storage", rate=1e9, message=1e6, servers=1)
    assert messages(spec, 0.01) == 10
    program = background_program(spec, ranks_per_node=2, nodes=3, duration=0.01)
    # clients 2..5 write to servers 0 and 1; a server's k-th client is its pair in bg.k
    assert program.groups == {"bg.0": ((2, 0), (3, 1)), "bg.1": ((4, 0), (5, 1))}
    assert sum(op.name == "background pacing" for op in program.ops[2]) == 10
    assert len(program.ops[0]) == 20  # a server receives ten messages of each client


# runs -------------------------------------------------------------------------------

def test_one_job_on_the_first_nodes_is_the_plain_scenario():
    raw = shared()
    alone = {"name": "shared", "cluster": {**raw["cluster"], "nodes": 2}, **GPT}
    job = {**raw, "cluster": {**raw["cluster"], "nodes": 2},
           "jobs": {"a": {"nodes": [0, 1], **GPT}}}
    plain, jobs = run(from_dict(alone)), run(from_dict(job))
    assert_same_run(jobs, plain)
    (only,) = jobs.summary["jobs"]
    assert only["slowdown"] == 1.0 and only["iteration_time_s"] == plain.summary[
        "iteration_time_s"]


def test_jobs_under_their_own_leaves_do_not_slow_each_other():
    summary = run(from_dict(shared("contiguous"))).summary
    for job in summary["jobs"]:
        assert job["slowdown"] == pytest.approx(1.0, abs=1e-9)
    assert summary["blame"] == []


def test_jobs_sharing_oversubscribed_uplinks_slow_each_other_and_blame_names_the_other():
    summary = run(from_dict(shared("scattered"))).summary
    jobs = by_name(summary)
    assert jobs["a"]["nodes"] == [0, 2] and jobs["b"]["nodes"] == [1, 3]
    assert jobs["a"]["slowdown"] > 1.05 and jobs["b"]["slowdown"] > 1.05
    assert summary["iteration_time_s"] == max(j["iteration_time_s"] for j in jobs.values())
    kinds = {(c["kind"], c["cause"]) for c in summary["blame"]}
    critical_job = "a" if summary["critical_rank"] < 16 else "b"
    other = "b" if critical_job == "a" else "a"
    assert ("job", other) in kinds
    lost = summary["iteration_time_s"] - jobs[critical_job]["alone_s"]
    assert sum(c["seconds"] for c in summary["blame"]) >= 0.9 * lost


def test_more_uplink_bandwidth_never_slows_shared_jobs():
    times = [run(from_dict(shared("scattered", o))).summary["iteration_time_s"]
             for o in (4, 2, 1)]
    assert times[0] >= times[1] >= times[2]


def test_symmetry_and_every_rank_agree_with_jobs():
    raw = shared("scattered", noise={"kind": "background", "traffic": "all_to_all",
                                     "rate": "20 GB/s", "nodes": 2, "placement": "scattered"},
                 nodes=6)
    fast = run(from_dict(raw))
    full = run(from_dict({**raw, "simulation": {"symmetry": "full"}}))
    assert fast.summary["simulated_ranks"] < 48
    for a, b in zip(fast.summary["jobs"], full.summary["jobs"], strict=True):
        for key in ("iteration_time_s", "delivered_gb_s"):
            if key in a:
                assert a[key] == pytest.approx(b[key], rel=1e-9)


@pytest.mark.parametrize("traffic, direction", [("all_to_all", "write"), ("storage", "write"),
                                                ("storage", "read")])
def test_background_delivers_what_it_offers_on_an_idle_fabric(traffic, direction):
    raw = shared("contiguous", nodes=6, noise={
        "kind": "background", "traffic": traffic, "rate": "5 GB/s", "message": "4 MiB",
        "nodes": 2, **({"direction": direction} if traffic == "storage" else {})})
    summary = run(from_dict(raw)).summary
    noise = by_name(summary)["noise"]
    assert noise["delivered_gb_s"] == pytest.approx(5.0, rel=0.05)
    assert noise["until_s"] >= summary["iteration_time_s"]  # it lasts the whole iteration
    for name in ("a", "b"):  # on leaves of their own: no slow-down
        assert by_name(summary)[name]["slowdown"] == pytest.approx(1.0, abs=1e-9)


def test_heavier_background_traffic_slows_a_job_more():
    def time(rate: str) -> float:
        raw = {"name": "noisy", "cluster": {"preset": "dgx-h100", "nodes": 4,
                                            "leaf_ports": 16, "oversubscription": 4},
               "jobs": {"a": {"nodes": [0, 2], **GPT},
                        "noise": {"kind": "background", "traffic": "all_to_all",
                                  "rate": rate, "nodes": [1, 3]}}}
        return by_name(run(from_dict(raw)).summary)["a"]["slowdown"]
    light, heavy = time("2 GB/s"), time("40 GB/s")
    assert 1.0 <= light < heavy


def test_a_slow_gpu_is_the_clusters_gpu_not_the_jobs_rank():
    raw = shared("scattered", oversubscription=1)
    raw["cluster"]["slow"] = {"gpu 8": 1.5}  # node 1's first GPU: job b's rank 16
    summary = run(from_dict(raw)).summary
    jobs = by_name(summary)
    assert summary["stragglers"][0][0] == 16
    assert jobs["b"]["iteration_time_s"] > 1.1 * jobs["a"]["iteration_time_s"]
    assert jobs["b"]["slowdown"] == pytest.approx(1.0)  # it is as slow alone on its nodes


def test_runs_with_jobs_are_deterministic():
    raw = shared("random")
    one, two = run(from_dict(raw)), run(from_dict(copy.deepcopy(raw)))
    assert one.summary["jobs"] == two.summary["jobs"]
    assert np.array_equal(one.spans["end"].to_numpy(), two.spans["end"].to_numpy())


# input ------------------------------------------------------------------------------

@pytest.mark.parametrize("edit, message", [
    (lambda r: r.update(model={"preset": "gpt3-125m"}), "model: .*cannot be given beside jobs"),
    (lambda r: r["jobs"]["b"].update(nodes=4), r"jobs: job b: needs 4 node\(s\), only 3"),
    (lambda r: r["jobs"]["a"].update(colour=1), "jobs.a: colour: .*not a key of a training job"),
    (lambda r: r["jobs"]["a"].update(nodes=[0, 0]), "jobs.a.nodes: .*lists a node twice"),
    (lambda r: r["jobs"]["a"].update(nodes=[0, 1], placement="contiguous"),
     "jobs.a.placement: .*cannot be given with a list"),
    (lambda r: r["jobs"]["a"].update(placement="anywhere"), "jobs.a.placement: 'anywhere'"),
    (lambda r: r["jobs"]["a"]["parallelism"].update(dp=8), "jobs.a: parallelism"),
    (lambda r: r["jobs"].update(bg={"kind": "background", "traffic": "storage",
                                    "rate": "1 GB/s", "nodes": 1}),
     "jobs.bg: servers: 1 must leave client nodes"),
    (lambda r: r["jobs"].update(bg={"kind": "background", "traffic": "gossip",
                                    "rate": "1 GB/s", "nodes": 1}), "jobs.bg: traffic: 'gossip'"),
    (lambda r: r.update(simulation={"fold_ranks": True}), "simulation.fold_ranks: .*jobs"),
    (lambda r: r.update(jobs={}), "jobs: {} must be a mapping"),
])
def test_bad_jobs_name_the_field(edit, message):
    raw = shared(nodes=5)
    edit(raw)
    with pytest.raises(ScenarioError, match=message):
        from_dict(raw)


def test_clustersim_run_prints_each_job_and_set_reaches_a_job(tmp_path, capsys):
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(shared("contiguous")))
    assert main(["run", str(path), "--out", str(tmp_path / "run"),
                 "--set", "jobs.b.placement=scattered", "--set", "jobs.a.placement=scattered"]) == 0
    printed = capsys.readouterr().out
    assert "jobs             a on nodes 0, 2 (16 GPUs)" in printed
    assert "over 3 runs (each training job alone, then all together)" in printed
    assert main(["blame", str(tmp_path / "run")]) == 0
    assert "job       " in capsys.readouterr().out
    assert (tmp_path / "run" / "links.png").exists()


def test_a_tensor_parallel_job_beside_storage_traffic_is_exact_by_symmetry():
    raw = {"name": "tp-and-storage", "cluster": {"preset": "dgx-h100", "nodes": 4,
                                                 "leaf_ports": 16, "oversubscription": 2},
           "jobs": {"a": {"nodes": 2, "placement": "scattered", "model": {"preset": "gpt3-350m"},
                          "training": {"seq_len": 1024, "global_batch": 8, "micro_batch": 1},
                          "parallelism": {"tp": 8, "pp": 2}},
                    "io": {"kind": "background", "traffic": "storage", "rate": "20 GB/s",
                           "nodes": 2, "placement": "scattered"}}}
    fast = run(from_dict(raw))
    full = run(from_dict({**raw, "simulation": {"symmetry": "full"}}))
    assert fast.summary["simulated_ranks"] < 32
    assert by_name(fast.summary)["a"]["slowdown"] > 1.0  # the storage shares a leaf uplink
    for a, b in zip(fast.summary["jobs"], full.summary["jobs"], strict=True):
        key = "iteration_time_s" if a["kind"] == "training" else "delivered_gb_s"
        assert a[key] == pytest.approx(b[key], rel=1e-9)


def test_the_layout_search_refuses_several_jobs(tmp_path, capsys):
    path = tmp_path / "shared.yaml"
    path.write_text(yaml.safe_dump(shared()))
    assert main(["search", str(path), "--out", str(tmp_path / "search")]) == 2
    assert "jobs: the layout search takes one job" in capsys.readouterr().err


def test_each_jobs_critical_path_spans_its_own_iteration():
    summary = run(from_dict(shared("scattered"))).summary
    for job in summary["jobs"]:
        assert job["critical_path"]["length_s"] == pytest.approx(job["iteration_time_s"])


def test_a_plain_scenario_is_a_set_of_one_job_and_the_runner_never_branches_on_jobs():
    """Issue 42, item 2: the config layer gives a plain scenario its one training
    job on every node; a run's steps (setup, loops, result) treat every run as a
    set of jobs, with no condition on whether there are several."""
    import ast

    from simulator.config.scenario import load
    from tests.conftest import QUICKSTART, ROOT

    scenario = load(QUICKSTART)
    (job,) = scenario.jobs
    assert job.nodes == tuple(range(scenario.machine.nodes)) and job.background is None
    assert (job.model, job.training, job.parallel) == (scenario.model, scenario.training,
                                                       scenario.parallel)
    for name in ("simulate", "setup", "loops", "result"):
        tree = ast.parse((ROOT / "simulator" / "runner" / f"{name}.py").read_text())
        for node in ast.walk(tree):
            if isinstance(node, (ast.If, ast.IfExp)):
                test = ast.unparse(node.test)
                assert "placed" not in test and ".jobs" not in test, (name, test)
