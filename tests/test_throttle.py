"""Thermal throttling (``cluster.throttle``): a GPU's slow-down factor changes at
given times; each kernel's end integrates the speed over the time it runs."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.compute.throttle import Clock, combined, parse
from simulator.config.scenario import from_dict
from simulator.runner import simulate as runner
from tests.test_stragglers import compute_time, scenario
from tests.test_symmetry import assert_same_run


def cuda_graphs(**cluster) -> dict:
    """Kernels without a host launch floor, so a GPU's speed alone sets them (per-layer
    graphs leave the head's launches and the optimizer's sync: no host at all)."""
    raw = scenario(**cluster)
    raw["training"]["kernel_launch"] = "0 us"
    return raw


def test_a_clock_integrates_the_speed_over_a_kernel():
    clock = Clock(((0.010, 2.0), (0.030, 1.0)))  # half speed from 10 ms to 30 ms
    assert clock(0.0, 0.005) == pytest.approx(0.005)
    assert clock(0.008, 0.004) == pytest.approx(0.010 + 0.002 * 2)
    assert clock(0.020, 0.010) == pytest.approx(0.030 + 0.005)  # 5 ms of work by 30 ms
    assert clock(0.005, 0.030) == pytest.approx(0.005 + 0.005 + 0.020 + 0.015)
    assert clock(0.040, 0.001) == pytest.approx(0.041)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.floats(1, 4)), min_size=1, max_size=5),
       st.floats(0, 2), st.floats(0, 1))
def test_a_clock_never_runs_faster_than_full_speed_nor_slower_than_the_worst(steps, start,
                                                                           work):
    schedule = tuple(sorted(dict(steps).items()))
    end = Clock(schedule)(start, work)
    worst = max(f for _, f in schedule)
    assert start + work - 1e-12 <= end <= start + work * worst + 1e-9
    assert Clock(schedule)(start, work + 0.1) > end  # more work always ends later


def test_a_constant_throttle_from_zero_equals_a_slow_gpu():
    throttled = run(cuda_graphs(throttle={"gpu 5": {"0 s": 1.5}}))
    slow = run(cuda_graphs(slow={"gpu 5": 1.5}))
    assert throttled.summary["iteration_time_s"] == pytest.approx(
        slow.summary["iteration_time_s"], rel=1e-9)
    assert throttled.summary["throttled"] == [(5, [[0.0, 1.5]])]


def test_throttling_part_way_slows_only_the_kernels_after_it():
    base = run(cuda_graphs())
    end = base.summary["iteration_time_s"]
    half = run(cuda_graphs(throttle={"gpu 5": {f"{end / 2 * 1e3} ms": 2.0}}))
    whole = run(cuda_graphs(throttle={"gpu 5": {"0 s": 2.0}}))
    times = [r.summary["iteration_time_s"] for r in (base, half, whole)]
    assert times[0] < times[1] < times[2]
    spans = half.spans_of([5])
    early = spans[(spans["kind"] == "compute") & (spans["end"] <= end / 2)]
    same = base.spans_of([5])
    same = same[(same["kind"] == "compute") & (same["end"] <= end / 2)]
    assert len(early) == len(same)  # the timeline before the change is untouched
    assert compute_time(half, 5) > compute_time(base, 5)
    assert compute_time(half, 4) == pytest.approx(compute_time(base, 4), rel=1e-9)


def test_recovering_gives_back_the_speed():
    base = run(cuda_graphs()).summary["iteration_time_s"]
    brief = run(cuda_graphs(throttle={"node 1": {"1 ms": 1.5, "2 ms": 1.0}}))
    longer = run(cuda_graphs(throttle={"node 1": {"1 ms": 1.5, "6 ms": 1.0}}))
    assert base < brief.summary["iteration_time_s"] < longer.summary["iteration_time_s"]


@pytest.mark.parametrize("cluster", [{"throttle": {"node 1": {"2 ms": 1.3}}},
                                     {"throttle": {"gpu 3": {"1 ms": 1.4, "3 ms": 1.0}},
                                      "slow": {"gpu 3": 1.1}}])
def test_symmetry_stays_exact_with_throttled_gpus(cluster):
    raw = scenario(**cluster)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert fast.summary["simulated_ranks"] < 16
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))
    reference = runner.run(from_dict({**raw, "simulation": {"symmetry": "full"}}),
                           batch_compute=False)  # one event per kernel
    assert_same_run(fast, reference)


def test_schedules_of_a_node_and_its_gpu_multiply():
    assert combined([((0.0, 2.0),), ((1.0, 1.5),)]) == ((0.0, 2.0), (1.0, 3.0))


@pytest.mark.parametrize(("throttle", "match"), [
    ({"rack 1": {"1 ms": 1.2}}, r'cluster.throttle.rack 1.*allowed keys are "node N"'),
    ({"gpu 1": 1.2}, r"cluster.throttle.gpu 1.*must map times to slow-down factors"),
    ({"gpu 1": {"soon": 1.2}}, r"cluster.throttle.gpu 1: the time 'soon'"),
    ({"gpu 1": {"1 ms": 0.9}}, r"cluster.throttle.gpu 1.1 ms.*slow-down factor from 1 to 100"),
    ({"gpu 99": {"1 ms": 1.2}}, r"cluster.throttle.gpu 99.*not in the cluster: it has 16"),
    ({"node 1": {"-1 ms": 1.2}}, r"cluster.throttle.node 1.-1 ms.*from the iteration's start"),
])
def test_bad_throttles_name_the_field(throttle, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(scenario(throttle=throttle))


def test_layer_spans_refuse_a_throttled_gpu():
    raw = {**scenario(throttle={"gpu 1": {"1 ms": 1.2}}), "simulation": {"span_detail": "layer"}}
    with pytest.raises(ScenarioError, match="simulation.span_detail.*cluster.throttle"):
        from_dict(raw)


def test_parse_sorts_the_steps_by_time():
    assert parse("t", {"gpu 0": {"5 ms": 1.0, "1 ms": 2.0}}) == (
        ("gpu", 0, ((0.001, 2.0), (0.005, 1.0))),)
