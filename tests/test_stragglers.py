"""Stragglers: slow GPUs and nodes (``cluster.slow``) and a seeded per-GPU speed
spread (``cluster.gpu_speed_spread``) slow exactly their kernels; symmetry keeps
working around them; a scenario without them runs as before."""

import numpy as np
import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.compute.stragglers import factors
from simulator.config.scenario import from_dict
from tests.test_symmetry import assert_same_run


def scenario(**cluster) -> dict:
    return {"name": "stragglers", "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": 2, **cluster},
            "model": {"preset": "gpt3-125m"},
            "training": {"seq_len": 1024, "global_batch": 32, "micro_batch": 1},
            "parallelism": {"tp": 2, "dp": 8}}


def compute_time(result, rank: int) -> float:
    spans = result.spans_of([rank])
    compute = spans[spans["kind"] == "compute"]
    return float((compute["end"] - compute["start"]).sum())


def test_no_slow_parts_runs_as_before():
    assert_same_run(run(scenario(slow={}, gpu_speed_spread=0.0)), run(scenario()))


def test_a_slow_gpu_takes_longer_for_each_kernel_and_holds_its_groups_back():
    """GPU 5 at x1.5: its compute takes 1.5 times its tensor-parallel partner's
    (no host launch cost, which a slow GPU would not change), and the iteration is
    slower than without it."""
    def one(**cluster):
        raw = scenario(**cluster)
        raw["training"]["kernel_launch"] = "0 us"
        return run(raw)
    slow, fast = one(slow={"gpu 5": 1.5}), one()
    assert compute_time(slow, 5) == pytest.approx(1.5 * compute_time(slow, 4), rel=0.02)
    assert compute_time(slow, 4) == pytest.approx(compute_time(fast, 4), rel=1e-9)
    assert slow.summary["iteration_time_s"] > 1.2 * fast.summary["iteration_time_s"]
    assert slow.summary["stragglers"] == [(5, 1.5)]
    assert slow.summary["slowest_gpu_factor"] == 1.5


@pytest.mark.parametrize("cluster", [{"slow": {"node 1": 1.3}},
                                     {"slow": {"gpu 3": 1.2, "node 1": 1.1}}])
def test_symmetry_keeps_working_around_the_slow_parts(cluster):
    raw = scenario(**cluster)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert fast.summary["simulated_ranks"] < 16
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))


def test_a_slower_gpu_never_makes_the_iteration_faster():
    times = [run(scenario(slow={"gpu 2": f})).summary["iteration_time_s"]
             for f in (1.0, 1.05, 1.2, 1.6)]
    assert times == sorted(times) and times[-1] > times[0]


def test_the_speed_spread_is_seeded_per_gpu():
    """GPU r draws the same speed in a 16- and a 64-GPU cluster; a log-normal of
    median 1: some GPUs faster than the table, some slower."""
    small = factors((), 0.05, 7, [r // 8 for r in range(16)])
    large = factors((), 0.05, 7, [r // 8 for r in range(64)])
    assert np.array_equal(small, large[:16])
    assert (large < 1).any() and (large > 1).any()
    assert factors((), 0.05, 8, [0] * 16).tolist() != small.tolist()
    result = run(scenario(gpu_speed_spread=0.05))
    assert result.summary["simulated_ranks"] == 16  # every GPU its own speed
    assert "speed of its own" in result.summary["simulation"]


@pytest.mark.parametrize(("cluster", "match"), [
    ({"slow": {"rack 3": 1.2}}, r'cluster.slow.rack 3.*allowed keys are "node N" and "gpu N"'),
    ({"slow": {"gpu 3": 0.5}}, r"cluster.slow.gpu 3.*slow-down factor from 1 to 100"),
    ({"slow": {"node 2": 1.2}}, r"cluster.slow.node 2.*it has 2 nodes \(0 to 1\)"),
    ({"slow": [1.2]}, r"cluster.slow.*must be a mapping"),
    ({"gpu_speed_spread": -0.1}, r"cluster.gpu_speed_spread"),
])
def test_bad_slow_parts_name_the_field(cluster, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(scenario(**cluster))


def test_rank_folding_refuses_stragglers():
    raw = {**scenario(slow={"gpu 1": 1.2}), "simulation": {"fold_ranks": True}}
    with pytest.raises(ScenarioError, match="no cluster.slow, throttle or gpu_speed_spread"):
        from_dict(raw)
