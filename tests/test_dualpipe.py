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
from workloads.schedules import INPUT, WEIGHT, Schedule, makespan
from workloads.stage_memory import stage_param_split


def scenario(pp: int = 2, micro_batches: int = 4, **parallelism) -> dict:
    """``tests.test_moe``'s tiny MoE on one server, ``pp`` stages of one layer,
    EP over the rest, ``micro_batches`` per pipeline."""
    raw = one_server(pp=pp, ep=8 // pp, moe_overlap="dualpipe", **parallelism)
    raw["model"]["layers"] = pp
    raw["training"]["global_batch"] = micro_batches * 8 // pp
    return raw


def _names(items) -> list[str]:
    """F, B (``*``: input gradients only) and W steps with their micro-batches."""
    def name(s):
        kind = "F" if s.forward else "W" if s.part == WEIGHT else "B"
        return f"{kind}{s.microbatch}{'*' if s.part == INPUT else ''}"
    return [" ".join(map(name, item)) for item in items]


def test_the_schedule_is_the_repositorys():
    """Rank 0 of 8 with 20 micro-batches (the README's figure): seven forwards of
    its own direction, then the other direction's, each after a zero-bubble
    backward and its W, then forward-and-backward pairs, then the drain's
    zero-bubble backwards, each with its W. Rank 3 (a middle rank) runs its first
    pair apart and its W steps last, first in first out."""
    rank0 = _names(dualpipe.schedule(8, 20, 0))
    assert rank0[:19] == ["F0", "F1", "F2", "F3", "F4", "F5", "F6", "F10", "B10*", "W10",
                          "F11", "B11*", "W11", "F12", "B12*", "W12", "F13", "F7 B13",
                          "F14 B0"]
    assert rank0[-9:] == ["B19", "B6*", "W6", "B7*", "W7", "B8*", "W8", "B9*", "W9"]
    middle = _names(dualpipe.schedule(8, 20, 3))
    assert middle[8:12] == ["F4", "B10", "F14 B0", "F5 B11"]
    assert middle[-8:] == ["B18*", "B8*", "B19*", "B9*", "W18", "W8", "W19", "W9"]


@pytest.mark.parametrize(("p", "m"), [(2, 4), (4, 8), (4, 12), (8, 16), (8, 20), (16, 32)])
def test_every_rank_runs_each_of_its_steps_once(p, m):
    """Each rank: both directions' forwards and backwards, once each, a forward
    before its backward; each (direction, stage) pair runs every micro-batch of its
    half once across the ranks."""
    seen = Counter()
    for rank in range(p):
        steps = [s for item in dualpipe.schedule(p, m, rank) for s in item]
        weights = [s for s in steps if s.part == WEIGHT]
        split = [s for s in steps if s.part == INPUT]
        assert [(s.microbatch, s.chunk) for s in weights] == [
            (s.microbatch, s.chunk) for s in split]  # first in, first out
        steps = [s for s in steps if s.part != WEIGHT]
        assert len(steps) == 2 * m
        for s in steps:
            assert s.microbatch in range(s.chunk * m // 2, (s.chunk + 1) * m // 2)
            seen[(s.forward, s.microbatch, dualpipe.virtual(p, rank, s.chunk))] += 1
        order = {(s.forward, s.microbatch): n for n, s in enumerate(steps)}
        assert all(order[(True, mb)] < order[(False, mb)] for _, mb in order)
    assert set(seen.values()) == {1} and len(seen) == 2 * m * p


@pytest.mark.parametrize("p", [4, 6, 8, 16])
@pytest.mark.parametrize(("f", "b", "w"), [(1.0, 2.0, 1.0), (2.0, 3.0, 1.0)])
def test_the_bubble_is_the_repositorys_and_below_1f1bs(p, f, b, w):
    """On equal stages without communication (a combined step F&B = F + B): the
    makespan is the work plus the repository's (p/2 - 1)(F&B + B - 3W) exactly,
    for any m from 2p on; without the weight split (W = 0) at most (p/2 - 1)(F&B
    + B); both far below 1F1B's (p - 1)(F + B); none at p = 2."""
    for m in (2 * p, 4 * p + 2):
        bubble = dualpipe.makespan(p, m, f, b, w) - m * (f + b)
        assert bubble == pytest.approx((p // 2 - 1) * (f + b + b - 3 * w))
    assert 0 < dualpipe.makespan(p, m, f, b) - m * (f + b) <= (p // 2 - 1) * (f + 2 * b)
    assert bubble < makespan(Schedule.ONE_F_ONE_B, p, m, 1, f, b) - m * (f + b)
    assert dualpipe.makespan(2, 8, f, b, w) == 8 * (f + b)
    assert dualpipe.bubble(p, 3.0) == pytest.approx((p // 2 - 1) * 2.0)


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


def test_zero_bubble_backwards_leave_their_weight_gradients_to_w_steps():
    """Each weight GEMM of a split backward runs as two halves, its input gradient
    in the backward and its weight gradient in the W step after it; the chunk's
    gradient reduction waits for the last W."""
    s = from_dict(scenario(pp=4, micro_batches=8))
    ops = build_program(s.model, s.training, s.parallel, s.seed).ops[0]
    names = Counter(op.name for op in ops)
    assert names["qkv_dgrad"] == names["qkv_wgrad"] > 0
    assert names["experts_fc1_dgrad"] == names["experts_fc1_wgrad"] > 0
    last_weight = max(i for i, op in enumerate(ops) if op.name.endswith("_wgrad"))
    reduces = [i for i, op in enumerate(ops) if op.name.startswith("all_reduce[")]
    assert reduces and max(reduces) > last_weight


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


@pytest.mark.parametrize("p", [2, 4, 8, 16])
def test_at_most_p_plus_one_chunks_of_activations_are_held(p):
    """The repository's memory table: a rank holds the activations of at most
    PP + 1 chunk passes (a forward's until its backward; in a combined step the
    forward's counted before the backward frees its own), against 1F1B's PP."""
    for rank in range(p):
        live = peak = 0
        for item in dualpipe.schedule(p, 4 * p, rank):
            live += sum(s.forward for s in item)
            peak = max(peak, live)
            live -= sum(not s.forward and s.part != WEIGHT for s in item)
        assert live == 0 and peak == p + 1


def test_delayed_weight_gradients_are_held_whole():
    """With ``delay_wgrad_compute`` the experts' weight gradients are already apart:
    the W step takes them whole (no half of a half), and the FLOPs are the plain
    schedule's."""
    raw = scenario(pp=4, micro_batches=8, delay_wgrad_compute=True)
    s = from_dict(raw)
    ops = build_program(s.model, s.training, s.parallel, s.seed).ops
    names = Counter(op.name for rank in ops for op in rank)
    assert names["experts_fc1_wgrad"] > 0
    assert not any(name.count("grad") > 1 for name in names)
    plain = from_dict({**raw, "parallelism": {**raw["parallelism"], "moe_overlap": "none",
                                              "delay_wgrad_compute": False}})
    flops = [sum(op.flops for rank in p.ops for op in rank) for p in (
        build_program(s.model, s.training, s.parallel, s.seed),
        build_program(plain.model, plain.training, plain.parallel, plain.seed))]
    assert flops[0] == pytest.approx(flops[1], rel=1e-12)
