"""DualPipe (``parallelism.moe_overlap: dualpipe``, ``workloads.dualpipe``): the
repository's schedule, its bubble against 1F1B's, the two directions' pipeline
transfers, two copies of the parameters and their mirror reduction, the same
work as the plain schedule, the exact symmetric run, and the errors."""

from collections import Counter

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.config.scenario import from_dict
from simulator.experiments.estimate import Estimator
from tests.test_moe_overlap import scenario as one_server
from tests.test_symmetry import assert_same_run
from workloads import dualpipe
from workloads.program import build_program, make_context
from workloads.schedules import Schedule, makespan
from workloads.stage_memory import stage_param_split


def scenario(pp: int = 2, micro_batches: int = 4, **parallelism) -> dict:
    """``tests.test_moe``'s tiny MoE on one server, ``pp`` stages of one layer,
    EP over the rest, ``micro_batches`` per pipeline."""
    raw = one_server(pp=pp, ep=8 // pp, moe_overlap="dualpipe", **parallelism)
    raw["model"]["layers"] = pp
    raw["training"]["global_batch"] = micro_batches * 8 // pp
    return raw


def _names(items) -> list[str]:
    return [" ".join(f"{'F' if s.forward else 'B'}{s.microbatch}" for s in item)
            for item in items]


def test_the_schedule_is_the_repositorys():
    """Rank 0 of 8 with 20 micro-batches (the README's figure): seven forwards of
    its own direction, then the other direction's alternating with them, then
    forward-and-backward pairs, then the drain. Rank 3 (a middle rank) runs its
    first pair apart."""
    rank0 = _names(dualpipe.schedule(8, 20, 0))
    assert rank0[:16] == ["F0", "F1", "F2", "F3", "F4", "F5", "F6", "F10", "B10", "F11",
                          "B11", "F12", "B12", "F13", "F7 B13", "F14 B0"]
    assert rank0[-5:] == ["B19", "B6", "B7", "B8", "B9"]
    middle = _names(dualpipe.schedule(8, 20, 3))
    assert middle[8:12] == ["F4", "B10", "F14 B0", "F5 B11"]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 12), (8, 16), (8, 20), (16, 32)])
def test_every_rank_runs_each_of_its_steps_once(p, m):
    """Each rank: both directions' forwards and backwards, once each, a forward
    before its backward; each (direction, stage) pair runs every micro-batch of its
    half once across the ranks."""
    seen = Counter()
    for rank in range(p):
        steps = [s for item in dualpipe.schedule(p, m, rank) for s in item]
        assert len(steps) == 2 * m
        for s in steps:
            assert s.microbatch in range(s.chunk * m // 2, (s.chunk + 1) * m // 2)
            seen[(s.forward, s.microbatch, dualpipe.virtual(p, rank, s.chunk))] += 1
        order = {(s.forward, s.microbatch): n for n, s in enumerate(steps)}
        assert all(order[(True, mb)] < order[(False, mb)] for _, mb in order)
    assert set(seen.values()) == {1} and len(seen) == 2 * m * p


@pytest.mark.parametrize("p", [4, 6, 8, 16])
def test_the_bubble_is_within_the_repositorys_and_below_1f1bs(p):
    """On equal stages without communication (F = 1, B = 2): the makespan is the
    work plus at most (p/2 - 1)(F&B + B) with F&B = F + B, far below 1F1B's
    (p - 1)(F + B) on the same stages, and the same for any m from 2p on."""
    m, f, b = 4 * p, 1.0, 2.0
    bubble = dualpipe.makespan(p, m, f, b) - m * (f + b)
    assert 0 < bubble <= (p // 2 - 1) * (f + b + b)
    assert bubble < makespan(Schedule.ONE_F_ONE_B, p, m, 1, f, b) - m * (f + b)
    assert dualpipe.bubble(p, f + b) == pytest.approx(bubble)
    assert dualpipe.makespan(2, 8, f, b) == 8 * (f + b)


def test_the_directions_cross_the_pipeline_both_ways_and_mirrors_pair_up():
    s = from_dict(scenario(pp=4, micro_batches=8))
    program = build_program(s.model, s.training, s.parallel, s.seed)
    groups = program.groups
    first = [pair for pair in groups["pp.f0"]]  # direction 0: rank of stage 0 -> stage 1
    back = [pair for pair in groups["pp.f4"]]  # direction 1: stage 3's rank -> stage 2's
    stage = program.stage
    assert all((stage[a], stage[b]) == (0, 1) for a, b in first)
    assert all((stage[a], stage[b]) == (3, 2) for a, b in back)
    assert "pp.f3" not in groups and "embd" not in groups  # no link between directions
    assert sorted((stage[a], stage[b]) for a, b in groups["mirror"])[:2] == [(0, 3), (0, 3)]


def test_each_rank_holds_two_stages_and_the_same_work_in_all():
    """Two copies of the parameters (stage r's and stage p - 1 - r's); every rank the
    same number of steps; the whole job the same FLOPs as without DualPipe."""
    raw = scenario(pp=4, micro_batches=8)
    dual = from_dict(raw)
    plain = from_dict({**raw, "parallelism": {**raw["parallelism"], "moe_overlap": "none"}})
    ctx, base = (make_context(s.model, s.training, s.parallel) for s in (dual, plain))
    for r in range(4):
        expected = [a + b for a, b in zip(stage_param_split(base, r),
                                           stage_param_split(base, 3 - r), strict=True)]
        assert list(stage_param_split(ctx, r)) == expected
    programs = [build_program(s.model, s.training, s.parallel, s.seed) for s in (dual, plain)]
    flops = [sum(op.flops for ops in p.ops for op in ops) for p in programs]
    assert flops[0] == pytest.approx(flops[1], rel=1e-12)
    mirrors = [op for op in programs[0].ops[0] if op.name == "mirror_all_reduce"]
    assert len(mirrors) == 1 and mirrors[0].group == "mirror"


def test_dualpipe_runs_and_hides_exchanges():
    """A four-stage run: faster than plain 1F1B (less bubble), exchanges under
    compute, more parameter memory, the mirror all-reduce in the communication log;
    the estimate within 15 % of the simulation."""
    raw = scenario(pp=4, micro_batches=8)
    dual = run(raw)
    plain = run({**raw, "parallelism": {**raw["parallelism"], "moe_overlap": "none"}})
    s, p = dual.summary, plain.summary
    assert s["iteration_time_s"] < p["iteration_time_s"]
    assert s["moe_a2a_hidden_s"] > 0 == p["moe_a2a_hidden_s"]
    assert s["moe_a2a_s"] == pytest.approx(p["moe_a2a_s"], rel=1e-9)
    assert s["memory_gib"]["parameters"] > p["memory_gib"]["parameters"]
    assert "mirror" in set(dual.comms["dimension"])
    scen = from_dict(raw)
    assert Estimator(scen).estimate(scen).seconds == pytest.approx(s["iteration_time_s"],
                                                                   rel=0.15)


@pytest.mark.parametrize("pp", [2, 4])
def test_dualpipe_by_symmetry_equals_a_full_simulation(pp):
    raw = scenario(pp=pp, micro_batches=2 * pp)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))


@pytest.mark.parametrize(("change", "named"), [
    ({"micro_batches": 2}, "at least 2 x pp = 4"),
    ({"pp": 1, "micro_batches": 4}, "an even parallelism.pp"),
    ({"schedule": "gpipe"}, "parallelism.schedule: 1f1b"),
    ({"moe_token_dispatcher_type": "allgather"}, "alltoall or flex"),
    ({"zero": 3}, "ZeRO-3"),
])
def test_what_dualpipe_needs_is_named(change, named):
    with pytest.raises(ScenarioError, match="moe_overlap: 'dualpipe' needs") as error:
        run(scenario(**change))
    assert named in str(error.value)
