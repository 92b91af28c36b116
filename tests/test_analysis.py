"""Timeline analysis: interval algebra, per-rank and per-stream tables, the
critical path, on hand-built traces with known answers and on real runs."""

import copy

import numpy as np
import pandas as pd
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.analysis import critical_path as cp
from simulator.analysis.critical_path import critical_path, shares
from simulator.analysis.summary import rank_breakdown
from simulator.analysis.timeline import (
    grouped_union_length,
    intersect,
    length,
    merge,
    rank_table,
    stream_table,
    subtract,
    union_length,
)
from tests.test_parallelism import tiny


def iv(*pairs):
    return (np.array([a for a, _ in pairs], dtype=float),
            np.array([b for _, b in pairs], dtype=float))


def as_pairs(intervals):
    return list(zip(intervals[0].tolist(), intervals[1].tolist(), strict=True))


def test_interval_algebra_on_known_sets():
    a, b = iv((0, 4), (6, 10)), iv((2, 7), (9, 12))
    assert as_pairs(merge(*iv((0, 2), (1, 3), (5, 6), (6, 7)))) == [(0, 3), (5, 7)]
    assert as_pairs(intersect(a, b)) == [(2, 4), (6, 7), (9, 10)]
    assert as_pairs(subtract(a, b)) == [(0, 2), (7, 9)]
    assert as_pairs(subtract(b, a)) == [(4, 6), (10, 12)]
    assert length(intersect(a, iv())) == 0.0 and as_pairs(subtract(a, iv())) == as_pairs(a)


interval_sets = st.lists(st.tuples(st.integers(0, 40), st.integers(1, 10)), max_size=8).map(
    lambda xs: iv(*[(s, s + d) for s, d in xs]))


@given(interval_sets, interval_sets)
@settings(max_examples=150, deadline=None)
def test_interval_algebra_identities(a, b):
    inter, only_a = intersect(a, b), subtract(a, b)
    assert length(inter) + length(only_a) == pytest.approx(length(a))
    both = (np.concatenate([a[0], b[0]]), np.concatenate([a[1], b[1]]))
    assert length(a) + length(b) - length(inter) == pytest.approx(union_length(*both))
    assert length(inter) <= min(length(a), length(b)) + 1e-12
    grouped = grouped_union_length(np.array([0] * len(a[0]) + [2] * len(b[0]), dtype=int),
                                   *both, 3)
    assert grouped.tolist() == pytest.approx([length(a), 0.0, length(b)])


def frame(rows):
    """Spans from (rank, stream, kind, start, end, call)."""
    out = pd.DataFrame(rows, columns=["rank", "stream", "kind", "start", "end", "call"])
    return out.assign(name=out["kind"], phase="forward", microbatch=0, layer=0, bytes=0.0,
                      node=0)


# Two ranks: rank 1 computes longer, rank 0 waits for it in the all-reduce (call 0),
# then both compute again; rank 0 also has a tp collective overlapping its compute.
TRACE = frame([
    (0, "compute", "compute", 0.0, 2.0, -1), (1, "compute", "compute", 0.0, 3.0, -1),
    (0, "tp", "comm", 1.0, 1.5, 1),
    (0, "dp", "wait", 2.0, 3.0, 0), (0, "dp", "comm", 3.0, 4.0, 0), (1, "dp", "comm", 3.0, 4.0, 0),
    (0, "compute", "compute", 4.0, 5.0, -1), (1, "compute", "compute", 4.0, 5.5, -1),
])


def test_rank_table_on_a_known_trace():
    table = rank_table(TRACE, 5.5).set_index("rank")
    assert table.loc[0].to_dict() == pytest.approx({
        "compute_s": 3.0, "comm_busy_s": 1.5, "overlapped_comm_s": 0.5, "exposed_comm_s": 1.0,
        "comm_wait_s": 1.0, "comm_wait_total_s": 1.0, "bubble_s": 0.0, "idle_s": 0.5})
    assert table.loc[1, "comm_wait_s"] == 0.0 and table.loc[1, "idle_s"] == 0.0
    assert table.loc[1, "exposed_comm_s"] == 1.0


def test_stream_table_on_a_known_trace():
    table = stream_table(TRACE).set_index(["rank", "stream"])
    assert table.loc[(0, "tp")].to_dict() == pytest.approx(
        {"busy_s": 0.5, "overlapped_s": 0.5, "exposed_s": 0.0, "wait_s": 0.0})
    assert table.loc[(0, "dp")].to_dict() == pytest.approx(
        {"busy_s": 1.0, "overlapped_s": 0.0, "exposed_s": 1.0, "wait_s": 1.0})
    assert table.loc[(0, "compute")].to_dict() == pytest.approx(
        {"busy_s": 3.0, "overlapped_s": 0.5, "exposed_s": 0.0, "wait_s": 0.0})


def test_critical_path_follows_the_late_rank_through_the_wait():
    path = critical_path(TRACE)
    assert list(zip(path["rank"], path["kind"], path["start"], path["end"], strict=True)) == [
        (1, "compute", 0.0, 3.0), (1, "comm", 3.0, 4.0), (1, "compute", 4.0, 5.5)]
    assert shares(path)["length_s"] == 5.5


def test_critical_path_keeps_a_wait_whose_cause_is_not_simulated():
    folded = TRACE[(TRACE["rank"] == 0)].assign(end=lambda f: f["end"].where(
        f["start"] != 4.0, 6.0))  # rank 0 finishes last; rank 1 is not in the trace
    path = critical_path(folded.reset_index(drop=True))
    assert list(path["category"]) == ["compute", "waiting", "communication", "compute"]
    assert shares(path)["waiting_s"] == 1.0 and shares(path)["length_s"] == 6.0


def test_critical_path_marks_gaps_idle():
    gap = frame([(0, "compute", "compute", 0.0, 1.0, -1), (0, "compute", "compute", 2.0, 3.0, -1)])
    path = critical_path(gap)
    assert list(path["category"]) == ["compute", "idle", "compute"]
    assert shares(path)["idle_s"] == 1.0


@pytest.fixture(scope="module")
def runs():
    """Real runs of every kind of schedule, with jitter so ranks differ."""
    out = {}
    for name, parallelism in {"dp": dict(dp=16), "tp-pp": dict(tp=2, pp=2, dp=4),
                              "interleaved": dict(pp=2, dp=8, schedule="interleaved",
                                                  virtual_stages=2),
                              "zero3": dict(zero=3)}.items():
        scenario = tiny(**parallelism)
        scenario["cluster"]["compute_jitter"] = 0.05
        out[name] = run(copy.deepcopy(scenario))
    return out


@pytest.mark.parametrize("name", ["dp", "tp-pp", "interleaved", "zero3"])
def test_critical_path_length_is_the_iteration_time(runs, name):
    result = runs[name]
    path = result.critical_path()
    iteration = result.summary["iteration_time_s"]
    assert (path["end"] - path["start"]).sum() == pytest.approx(iteration, rel=1e-9)
    assert path["start"].iloc[0] == 0.0 and path["end"].iloc[-1] == pytest.approx(iteration)
    gaps = path["start"].to_numpy()[1:] - path["end"].to_numpy()[:-1]
    assert np.abs(gaps).max() <= 1e-9 * iteration, "contiguous, no overlaps"
    assert result.summary["critical_path"]["length_s"] == pytest.approx(iteration, rel=1e-9)


@pytest.mark.parametrize("name", ["dp", "tp-pp", "interleaved", "zero3"])
def test_the_predecessors_found_at_once_give_the_walks_path(runs, name, monkeypatch):
    """The array shortcut (``_Index._simple_previous``) changes no step of the walk."""
    spans = runs[name].spans
    fast = critical_path(spans)
    monkeypatch.setattr(cp._Index, "_simple_previous",
                        lambda self: np.full(len(self.start), cp.GENERAL, dtype=np.int64))
    pd.testing.assert_frame_equal(fast, critical_path(spans))


@pytest.mark.parametrize("name", ["dp", "tp-pp", "interleaved", "zero3"])
def test_rank_table_agrees_with_the_summary_breakdown(runs, name):
    result = runs[name]
    iteration = result.summary["iteration_time_s"]
    table = result.ranks().set_index("rank")
    for rank in (0, 5, 15):
        expected = rank_breakdown(result.spans, rank, iteration)
        assert table.loc[rank].to_dict() == pytest.approx(expected, abs=1e-9 * iteration)
    parts = table[["compute_s", "exposed_comm_s", "comm_wait_s", "bubble_s", "idle_s"]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(iteration, rel=1e-9)


@pytest.mark.parametrize("name", ["dp", "tp-pp", "interleaved", "zero3"])
def test_overlap_never_exceeds_either_busy_time(runs, name):
    result = runs[name]
    eps = 1e-9 * result.summary["iteration_time_s"]
    ranks = result.ranks()
    assert (ranks["overlapped_comm_s"] <= ranks["compute_s"] + eps).all()
    assert (ranks["overlapped_comm_s"] <= ranks["comm_busy_s"] + eps).all()
    streams = result.streams()
    assert (streams["overlapped_s"] <= streams["busy_s"] + eps).all()
    assert (streams["exposed_s"] >= -eps).all()
    compute = streams[streams["stream"] == "compute"].set_index("rank")["busy_s"]
    comm = streams[streams["stream"] != "compute"]
    assert (comm["overlapped_s"].to_numpy()
            <= compute.loc[comm["rank"]].to_numpy() + eps).all()


@given(st.lists(st.tuples(st.integers(0, 2), st.sampled_from(["compute", "tp", "dp"]),
                          st.integers(0, 30), st.integers(1, 8)), min_size=1, max_size=25))
@settings(max_examples=100, deadline=None)
def test_overlap_bounds_on_random_traces(rows):
    spans = frame([(r, s, "compute" if s == "compute" else "comm", float(a), float(a + d), -1)
                   for r, s, a, d in rows])
    iteration = float(spans["end"].max())
    ranks = rank_table(spans, iteration)
    assert (ranks["overlapped_comm_s"] <= np.minimum(ranks["compute_s"],
                                                     ranks["comm_busy_s"]) + 1e-9).all()
    parts = ranks[["compute_s", "exposed_comm_s", "comm_wait_s", "bubble_s", "idle_s"]]
    assert parts.sum(axis=1).to_numpy() == pytest.approx(iteration)
    streams = stream_table(spans)
    assert (streams["overlapped_s"] <= streams["busy_s"] + 1e-9).all()
    path = critical_path(spans)
    assert (path["end"] - path["start"]).sum() == pytest.approx(iteration)


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(st.tuples(st.floats(0.0, 10.0), st.floats(-5.0, 5.0)), min_size=2,
                      max_size=60), bins=st.integers(1, 20))
@example(steps=[(0.0, 0.0), (0.0, 1.0), (1.0, 1.0)], bins=1)  # the end at an unchanged value
def test_binned_counters_keep_the_bytes_and_the_peaks(steps, bins):
    """Averaged bins keep each step function's area (bytes moved); peak bins keep
    its maximum and never show a value it does not reach."""
    from simulator.analysis.traffic import binned, binned_peak

    steps.sort()
    times = np.array([t for t, _ in steps])
    values = np.array([v for _, v in steps])
    area = float(np.sum(values[:-1] * np.diff(times)))
    t, v = binned(times, values, bins)
    assert float(np.sum(v[:-1] * np.diff(t))) == pytest.approx(area, abs=1e-6)
    t, v = binned_peak(times, values, bins)
    assert t[0] == times[0] and v[-1] == values[-1]
    assert v.max() == values.max() and v.min() >= values.min()
