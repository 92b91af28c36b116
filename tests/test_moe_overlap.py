"""Expert-parallel all-to-all overlap (``parallelism.moe_overlap: 1f1b``,
``workloads.moe_overlap``): the combined schedule's pairs, the same ops only
reordered, each exchange under the other micro-batch's compute in Megatron-Core's
order, the hidden time in the summary, the exact symmetric run, and the errors
that name Megatron-Core's requirements."""

from collections import Counter

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.base.ir import COMPUTE_STREAM, EP_STREAM
from simulator.config.scenario import from_dict
from tests.test_moe import scenario as two_servers
from tests.test_symmetry import assert_same_run
from workloads.moe_overlap import WARMUP, pairs
from workloads.program import build_program
from workloads.schedules import interleaved

PIPELINE = {"pp": 2, "schedule": "interleaved", "virtual_stages": 2}


def scenario(**parallelism) -> dict:
    """``tests.test_moe``'s tiny MoE on one server: 4 micro-batches per pipeline
    without one, 8 with two stages."""
    raw = two_servers(**parallelism)
    raw["cluster"]["nodes"] = 1
    return raw


def _program(**parallelism):
    s = from_dict(scenario(**parallelism))
    return build_program(s.model, s.training, s.parallel, s.seed)


def _signature(op):
    return (op.kind, op.name, op.stream, op.phase, op.microbatch, op.layer, op.flops,
            op.bytes, op.collective, op.group, op.mem)


@pytest.mark.parametrize("parallelism", [{}, PIPELINE])
def test_the_combined_schedule_holds_the_same_ops_reordered(parallelism):
    """Every op of the plain program, once, in another order; each stage's program
    still ends with the same optimizer step and every dependency points backward."""
    plain, combined = _program(**parallelism), _program(moe_overlap="1f1b", **parallelism)
    for a, b in zip(plain.ops, combined.ops, strict=True):
        assert Counter(map(_signature, a)) == Counter(map(_signature, b))
        assert all(d < i for i, op in enumerate(b) for d in op.deps)
        assert a != b
    assert combined.model_flops == plain.model_flops


def test_pairs_take_the_steady_state_of_an_interleaved_schedule():
    """With one more warm-up forward (Megatron-Core's, with the overlap on), every
    steady-state forward meets the backward of another (micro-batch, chunk), on
    the last stage too (whose plain schedule meets a last chunk's forward with its
    own backward); each step once, the warm-up's forwards and the cool-down's
    backwards alone."""
    for stage, warmup in ((1, 3), (0, 5)):
        steps = interleaved(2, 4, 2, stage, WARMUP)
        paired = pairs(steps, warmup)
        assert [s for p in paired for s in p] == steps
        twos = [p for p in paired if len(p) == 2]
        assert len(twos) == len(steps) // 2 - warmup
        assert all(f.forward and not b.forward and
                   (f.microbatch, f.chunk) != (b.microbatch, b.chunk) for f, b in twos)
    plain = pairs(interleaved(2, 4, 2, 1), 2)  # without it a forward meets its own backward
    assert any(len(p) == 2 and (p[0].microbatch, p[0].chunk) == (p[1].microbatch, p[1].chunk)
               for p in plain)
    everything = interleaved(2, 2, 2, 1, 8)  # all forwards first: nothing to pair
    assert pairs(everything, 4) == [(s,) for s in everything]


@pytest.mark.parametrize(("pp", "micro_batches", "virtual"), [(2, 2, 2), (2, 4, 4), (4, 4, 2),
                                                              (4, 8, 2), (2, 6, 2)])
def test_the_combined_schedule_never_deadlocks(pp, micro_batches, virtual):
    """As many micro-batches as stages (Megatron-Core then runs every forward
    first), and more: every run ends, no slower than without the overlap."""
    raw = scenario(pp=pp, schedule="interleaved", virtual_stages=virtual, ep=8 // pp)
    raw["model"]["layers"] = pp * virtual
    raw["training"]["global_batch"] = micro_batches * 8 // pp
    plain = run(raw).summary["iteration_time_s"]
    raw["parallelism"]["moe_overlap"] = "1f1b"
    assert run(raw).summary["iteration_time_s"] <= plain * (1 + 1e-9)


def _spans(result, rank=0):
    spans = result.spans
    return spans[spans["rank"] == rank]


def test_each_exchange_runs_under_the_other_micro_batchs_compute():
    """Megatron-Core's order within a pair of layers: the forward's dispatch runs
    while the backward's experts compute, the backward's dispatch while the
    forward's experts compute; the summary says how much exchange time was under
    compute, and the combined schedule is faster than the plain one."""
    plain = run(scenario(moe_overlap="none"))
    combined = run(scenario(moe_overlap="1f1b"))
    spans = _spans(combined)
    compute = spans[spans["stream"] == COMPUTE_STREAM]
    exchanges = spans[(spans["stream"] == EP_STREAM) & (spans["kind"] == "comm")]
    under = 0
    for x in exchanges.itertuples():
        other = compute[(compute["start"] < x.end) & (compute["end"] > x.start) &
                        (compute["microbatch"] != x.microbatch)]
        if x.phase == "forward" and x.name == "dispatch":
            under += other["name"].str.startswith("experts_").any() and \
                (other["phase"] == "backward").all()
    assert under > 0
    s = combined.summary
    assert 0 < s["moe_a2a_hidden_s"] <= s["moe_a2a_s"]
    assert plain.summary["moe_a2a_hidden_s"] == pytest.approx(0.0, abs=1e-12)
    assert s["moe_a2a_s"] == pytest.approx(plain.summary["moe_a2a_s"], rel=1e-9)
    assert s["iteration_time_s"] < plain.summary["iteration_time_s"]


@pytest.mark.parametrize("parallelism", [{}, PIPELINE])
def test_the_combined_schedule_by_symmetry_equals_a_full_simulation(parallelism):
    raw = scenario(moe_overlap="1f1b", **parallelism)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))


def test_the_pipeline_moves_what_it_moved_without_the_overlap():
    """Interleaved, two stages: the same pipeline transfers and all-to-alls (count
    and bytes) as the plain schedule, now with exchange time under compute."""
    plain = run(scenario(**PIPELINE)).comms
    result = run(scenario(moe_overlap="1f1b", **PIPELINE))
    for comms in (plain, result.comms):
        assert {"pp", "ep"} <= set(comms["dimension"])
    totals = [c.groupby(["dimension", "collective"])["bytes"].agg(["count", "sum"])
              for c in (plain, result.comms)]
    assert totals[0].equals(totals[1])
    assert result.summary["moe_a2a_hidden_s"] > 0


@pytest.mark.parametrize(("change", "named"), [
    ({"pp": 2}, "parallelism.schedule: interleaved"),
    ({"schedule": "gpipe"}, "1f1b or interleaved"),
    ({"moe_token_dispatcher_type": "allgather"}, "alltoall or flex"),
    ({"ep": 1}, "parallelism.ep > 1"),
    ({"zero": 3}, "ZeRO-3"),
])
def test_what_the_combined_schedule_needs_is_named(change, named):
    with pytest.raises(ScenarioError, match="parallelism.moe_overlap") as error:
        run(scenario(moe_overlap="1f1b", **change))
    assert named in str(error.value)


def test_full_recompute_and_unknown_modes_are_refused():
    raw = scenario(moe_overlap="1f1b")
    raw["training"]["recompute"] = "full"
    with pytest.raises(ScenarioError, match="recompute other than full"):
        run(raw)
    with pytest.raises(ScenarioError, match="moe_overlap"):
        run(scenario(moe_overlap="dualpipev"))


def test_delayed_weight_gradients_split_the_expert_gemms():
    """``delay_wgrad_compute``: each routed-expert GEMM's backward becomes its input
    gradient where it was and its weight gradient after the layer's dispatch
    backward, half the FLOPs each (the stage's total unchanged), its gradient
    recorded at the weight gradient; it needs the combined schedule."""
    plain = _program(moe_overlap="1f1b", **PIPELINE)
    split = _program(moe_overlap="1f1b", delay_wgrad_compute=True, **PIPELINE)
    for a, b in zip(plain.ops, split.ops, strict=True):
        assert sum(op.flops for op in a) == pytest.approx(sum(op.flops for op in b), rel=1e-12)
    ops = split.ops[0]
    backward = [op for op in ops if op.phase.value == "backward" and op.layer == 0
                and op.microbatch == 0]
    names = [op.name for op in backward]
    dispatch = names.index("dispatch")
    assert names.index("experts_fc1_dgrad") < dispatch < names.index("experts_fc1_wgrad")
    assert names.index("experts_fc2_wgrad") > dispatch
    whole = next(op for op in plain.ops[0] if op.name == "experts_fc1" and op.layer == 0
                 and op.phase.value == "backward" and op.microbatch == 0)
    half = next(op for op in backward if op.name == "experts_fc1_wgrad")
    assert half.flops == pytest.approx(whole.flops / 2, rel=1e-12)
    with pytest.raises(ScenarioError, match="delay_wgrad_compute"):
        run(scenario(delay_wgrad_compute=True))
