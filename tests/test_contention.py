"""Compute slowed by overlapped NCCL kernels (``simulator.compute.contention``) and
its fixed point over runs (``simulator.runner.contention``)."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.analysis.timeline import merge as busy
from simulator.compute.contention import COMM_KINDS, stretched
from simulator.config.scenario import ScenarioError, from_dict
from simulator.runner.contention import op_starts
from simulator.runner.simulate import run as run_scenario
from tests.test_parallelism import tiny


def test_busy_joins_overlapping_and_touching_intervals():
    begins, ends = busy(np.array([5.0, 0.0, 1.0, 3.0, 7.0]), np.array([6.0, 2.0, 3.0, 4.0, 7.0]))
    assert begins.tolist() == [0.0, 5.0] and ends.tolist() == [4.0, 6.0]  # [7, 7) is empty


def test_an_op_inside_nccl_takes_factor_times_its_work():
    durations = stretched(np.array([1.0]), np.array([2.0]), np.array([0.0]), np.array([10.0]),
                          1.25)
    assert durations[0] == pytest.approx(2.5)


def test_an_op_partly_overlapped_pays_only_for_the_overlap():
    """Work 2 from t=0, NCCL over [1, 5) at x2: 1 s of work alone, then the last second
    of work takes 2 s: ends at 3."""
    durations = stretched(np.array([0.0]), np.array([2.0]), np.array([1.0]), np.array([5.0]), 2.0)
    assert durations[0] == pytest.approx(3.0)


def test_an_op_that_reaches_past_the_interval_speeds_up_again():
    """NCCL over [0, 1) at x2: half a second of work by t=1, then 1.5 s alone: 2.5 s."""
    durations = stretched(np.array([0.0]), np.array([2.0]), np.array([0.0]), np.array([1.0]), 2.0)
    assert durations[0] == pytest.approx(2.5)


def test_ops_away_from_nccl_keep_their_work_exactly():
    work = np.array([0.1 + 0.2, 0.3, 0.0])
    out = stretched(np.array([0.0, 20.0, 6.0]), work, np.array([5.0]), np.array([7.0]), 1.5)
    assert out.tolist() == work.tolist()  # (bit for bit; the zero-work op stays zero)


@given(start=st.floats(0, 10), work=st.floats(1e-6, 5), factor=st.floats(1, 3),
       edges=st.lists(st.floats(0, 20), min_size=0, max_size=8))
def test_a_stretched_op_lies_between_alone_and_fully_slowed(start, work, factor, edges):
    edges = sorted(edges)[: len(edges) // 2 * 2]
    begins, ends = busy(np.array(edges[0::2]), np.array(edges[1::2]))
    out = stretched(np.array([start]), np.array([work]), begins, ends, factor)[0]
    # durations are differences of absolute times: rounding scales with the clock
    tol = 1e-9 * work + 1e-14 * (1 + start + (edges[-1] if edges else 0.0))
    assert work - tol <= out <= work * factor + tol


def test_merged_spans_give_each_op_its_start():
    """Two layer-level spans holding 3 and 2 ops that ran back to back."""
    starts = op_starts(np.array([0.0, 10.0]), np.array([6.0, 13.0]),
                       np.array([1.0, 2.0, 3.0, 1.0, 2.0]))
    assert starts.tolist() == [0.0, 1.0, 3.0, 10.0, 11.0]
    assert op_starts(np.array([0.0]), np.array([2.0]), np.array([1.0, 2.0])) is None


def _dp(**changes):
    scenario = tiny(dp=16, overlap_grad_reduce=True, bucket_size="4 MB")
    scenario["cluster"].update(changes)
    return scenario


def test_a_fixed_point_run_stretches_each_kernel_by_its_own_overlap():
    """At the fixed point, every compute span is as long as its kernel alone stretched
    by the NCCL spans of its rank in the same timeline."""
    slowed, alone = run(_dp(overlap_slowdown=1.5)), run(_dp(overlap_slowdown=1.0))
    assert "exact (a fixed point)" in slowed.summary["overlap_slowdown"]
    assert alone.summary["overlap_slowdown"] == "off (overlap_slowdown 1)"
    spans, base = slowed.spans, alone.spans
    for rank in (0, 5):
        mine = spans[spans["rank"] == rank]
        comm = mine[mine["kind"].isin(COMM_KINDS)]
        begins, ends = busy(comm["start"].to_numpy(), comm["end"].to_numpy())
        compute = mine[mine["kind"] == "compute"]
        work = base[(base["rank"] == rank) & (base["kind"] == "compute")]
        length = (compute["end"] - compute["start"]).to_numpy()
        expected = stretched(compute["start"].to_numpy(),
                             (work["end"] - work["start"]).to_numpy(), begins, ends, 1.5)
        assert length == pytest.approx(expected, rel=1e-9, abs=1e-15)
        assert (length > (work["end"] - work["start"]).to_numpy() * 1.01).any()
    added = slowed.summary["overlap_slowdown_s"]
    assert added > 0
    assert slowed.summary["compute_s"] == pytest.approx(alone.summary["compute_s"] + added)


def test_more_slow_down_never_makes_a_run_faster():
    times = [run(_dp(overlap_slowdown=f)).summary["iteration_time_s"]
             for f in (1.0, 1.1, 1.3, 2.0)]
    assert times == sorted(times) and times[0] < times[-1]


def test_layer_spans_and_symmetry_give_the_kernel_level_full_result():
    scenario = tiny(tp=2, pp=2, dp=4, overlap_grad_reduce=True)
    scenario["cluster"]["overlap_slowdown"] = 1.3
    kernel = run(scenario)
    layer = run({**scenario, "simulation": {"span_detail": "layer"}})
    full = run({**scenario, "simulation": {"symmetry": "full"}})
    for other in (layer, full):
        assert other.summary["iteration_time_s"] == pytest.approx(
            kernel.summary["iteration_time_s"], rel=1e-9)
        assert other.summary["overlap_slowdown_s"] == pytest.approx(
            kernel.summary["overlap_slowdown_s"], rel=1e-9)


def test_the_gpu_file_sets_the_default_and_the_scenario_overrides_it():
    from topologies import GPUS
    assert GPUS["h100-sxm-80gb"].overlap_slowdown == pytest.approx(1.189)
    assert from_dict(_dp(overlap_slowdown=1.0)).gpu.overlap_slowdown == 1.0
    with pytest.raises(ScenarioError, match=r"cluster.overlap_slowdown: 0.9 .*\[1, 4\]"):
        from_dict(_dp(overlap_slowdown=0.9))
    bad = {**_dp(), "simulation": {"contention_passes": 0}}
    with pytest.raises(ScenarioError, match="simulation.contention_passes"):
        from_dict(bad)


def run(raw: dict):
    return run_scenario(from_dict(raw))


def test_userbuffers_exchanges_take_no_sms_from_the_gemms_they_hide_under():
    """Transformer Engine's ring exchanges (copy engines) overlap the GEMM pieces
    but slow nothing."""
    scenario = tiny(tp=8, sequence_parallel=True, tp_comm_overlap=True)
    scenario["model"] = {"layers": 2, "hidden": 4096, "heads": 32, "vocab": 4096}
    scenario["training"].update(seq_len=2048, global_batch=2)
    scenario["cluster"].update(nodes=1, overlap_slowdown=2.0)
    result = run(scenario)
    names = set(result.spans["name"])
    assert "userbuffers_exchange" in names
    assert result.summary["overlap_slowdown_s"] == 0.0
