"""The engine on small data-parallel programs: semantics, memory, determinism."""

import dataclasses

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run as api_run
from simulator.base.ir import COMPUTE_STREAM, Collective, Op, OpKind, Phase, Program
from simulator.collectives.tuner import Collectives
from simulator.config.scenario import from_dict
from simulator.engine.call_log import CallLog
from simulator.engine.core import Engine, SimulationError
from simulator.engine.records import COLLECTIVE_COLUMNS
from simulator.network.fabric import Fabric
from simulator.outputs.exports import chrome_trace
from simulator.runner.simulate import run
from topologies import CLUSTERS, build_cluster
from workloads.memory import Recompute, activation_bytes_per_layer, head_activation_bytes


def test_same_scenario_same_trace(small):
    a, b = api_run(small), api_run(small)
    assert a.spans.to_csv() == b.spans.to_csv()
    assert chrome_trace(a.spans, a.placement) == chrome_trace(b.spans, b.placement)
    assert {k: v for k, v in a.summary.items() if k != "wall_s"} == {
        k: v for k, v in b.summary.items() if k != "wall_s"}


def test_batched_compute_planning_matches_one_event_per_kernel(small):
    scenario = from_dict(small)
    batched = run(scenario)
    single = run(scenario, batch_compute=False)
    pd.testing.assert_frame_equal(batched.spans, single.spans)
    assert single.summary["events"] > 5 * batched.summary["events"]


def test_lockstep_ring_runs_end_to_end_and_agrees_without_contention(small):
    small["cluster"]["compute_jitter"] = 0.0
    small["network"] = {"algorithm": "ring"}
    pipelined = api_run(small)
    small["network"]["step_model"] = "lockstep"
    lockstep = api_run(small)
    assert lockstep.summary["iteration_time_s"] == pytest.approx(
        pipelined.summary["iteration_time_s"], rel=1e-9)
    assert lockstep.summary["events"] > pipelined.summary["events"]


def test_no_two_spans_overlap_on_one_stream(small):
    spans = api_run(small).spans
    for _, rows in spans.groupby(["rank", "stream"]):
        rows = rows.sort_values("start")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-15).all()
        assert (rows["end"] >= rows["start"]).all()


def test_buckets_wait_for_their_gradients_and_optimizer_for_all_buckets(small):
    result = api_run(small)
    spans = result.spans[result.spans["rank"] == 0]
    # the gradient buckets' reductions (the step's own: its gradient norm's all-reduce)
    comm = spans[(spans["kind"] == "comm") & (spans["phase"] != "optimizer")]
    backward = spans[(spans["phase"] == "backward") & (spans["kind"] == "compute")]
    optimizer = spans[spans["phase"] == "optimizer"].sort_values("start")
    assert len(comm) == result.summary["buckets"] > 1
    assert comm["start"].min() < backward["end"].max(), "first bucket overlaps backward"
    assert optimizer["start"].iloc[0] >= comm["end"].max()


def test_no_overlap_means_more_exposed_communication(small):
    on = api_run(small).summary
    small["parallelism"]["overlap_grad_reduce"] = False
    off = api_run(small).summary
    assert off["exposed_comm_s"] > on["exposed_comm_s"]
    assert off["iteration_time_s"] > on["iteration_time_s"]


def test_symmetric_ranks_do_not_wait_and_jitter_makes_them_wait(small):
    small["cluster"]["compute_jitter"] = 0.0
    calm = api_run(small).spans
    assert not (calm["kind"] == "wait").any()
    small["cluster"]["compute_jitter"] = 0.1
    jittered = api_run(small)
    waits = jittered.spans[jittered.spans["kind"] == "wait"]
    assert len(waits) > 0
    # the rank that finishes last is the one that makes others wait, not one that waits much
    assert jittered.summary["comm_wait_s"] <= (waits["end"] - waits["start"]).max()


@settings(max_examples=6, deadline=None)
@given(st.sampled_from(["12.5 GB/s", "25 GB/s", "50 GB/s", "100 GB/s"]),
       st.sampled_from(["25 GB/s", "50 GB/s", "100 GB/s", "200 GB/s"]))
def test_more_nic_bandwidth_never_slows_the_iteration(slow, fast):
    from tests.conftest import SMALL

    def time_with(bw):
        scenario = {**SMALL, "cluster": {**SMALL["cluster"], "nic_bandwidth": bw,
                                         "compute_jitter": 0.0}}
        return api_run(scenario).summary["iteration_time_s"]

    lo, hi = sorted([slow, fast], key=lambda b: float(b.split()[0]))
    assert time_with(hi) <= time_with(lo) * (1 + 1e-12)


def test_activation_memory_is_one_micro_batch_of_korthikanti(small):
    summary = api_run(small).summary
    s = from_dict(small)
    m, t = s.model, s.training
    expected = m.layers * activation_bytes_per_layer(
        t.seq_len, t.micro_batch, m.hidden, m.heads, recompute=Recompute.SELECTIVE)
    expected += head_activation_bytes(t.seq_len, t.micro_batch, m.vocab, 2)
    assert summary["memory_gib"]["activations"] * 2**30 == pytest.approx(expected)
    params = summary["parameters"]
    assert summary["memory_gib"]["optimizer_states"] * 2**30 == pytest.approx(12 * params)


def test_oom_is_reported_not_hidden(small):
    small["model"] = {"preset": "gpt3-13b"}
    small["cluster"]["gpu"] = "a100-sxm-40gb"
    summary = api_run(small).summary
    assert summary["oom"] is True
    assert summary["peak_memory_gib"] > summary["gpu_memory_gib"]


def _program(collective_ranks, sizes=None):
    op = Op(OpKind.COMPUTE, "k", COMPUTE_STREAM, Phase.FORWARD, flops=0.0, bytes=0.0)
    progs = []
    for r in range(2):
        ops = [op]
        if r in collective_ranks:
            ops.append(Op(OpKind.COLLECTIVE, "ar", "dp", Phase.BACKWARD, deps=(0,),
                          bytes=(sizes or {}).get(r, 1e6), collective=Collective.ALL_REDUCE,
                          group="dp"))
        progs.append(tuple(ops))
    return Program(tuple(progs), {"dp": ((0, 1),)}, ({}, {}), 0.0, 0)


def _engine(program):
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], 1))
    return Engine(program, fabric.graph.graph["gpus"][:2],
                  lambda rank: [1e-3] * len(program.ops[rank]), fabric, Collectives(fabric))


def test_deadlock_is_reported():
    with pytest.raises(SimulationError, match=r"deadlock: dp collective #0 .* ranks \[1\]"):
        _engine(_program({0})).run()


def test_mismatched_collective_is_reported():
    with pytest.raises(SimulationError, match="calls all_reduce of 2000000 B"):
        _engine(_program({0, 1}, {1: 2e6})).run()


def test_waiting_rank_records_a_wait_span():
    program = _program({0, 1})
    durations = {0: [1e-3, 0.0], 1: [3e-3, 0.0]}
    fabric = Fabric(build_cluster(CLUSTERS["dgx-a100"], 1))
    result = Engine(program, fabric.graph.graph["gpus"][:2], durations.__getitem__,
                    fabric, Collectives(fabric)).run()
    waits = [s for s in result.spans if s[2] == "wait"]
    assert len(waits) == 1 and waits[0][0] == 0
    assert waits[0][4:6] == pytest.approx((1e-3, 3e-3))


def test_compute_model_uses_the_gpu(small):
    a100 = api_run(small).summary
    small["cluster"]["gpu"] = "h100-sxm-80gb"
    h100 = api_run(small).summary
    assert h100["compute_s"] < a100["compute_s"]
    assert dataclasses.is_dataclass(from_dict(small).gpu)


@settings(max_examples=40, deadline=None)
@given(entries=st.lists(st.tuples(st.sampled_from(["row", "alone", "group"]),
                                  st.floats(0.0, 10.0), st.integers(0, 5)), max_size=12))
def test_a_call_log_of_rows_and_blocks_is_the_table_of_every_row(entries):
    """Blocks (a gang's exclusive calls: rows ending at fixed durations after one
    start; a message group: rows with their own ends and one call number) give
    the table, row numbers and dtypes that appending each row would (text as
    categories either way)."""
    alone = [("tp", i, "all_reduce", "all_reduce", 8, 1e6, "ring", "simple", 2)
             for i in range(3)]
    durations = [1.0, 2.0, 1.5]
    group = [("pp.f0", pair, "send_recv", "send", 2, 4e6, "direct", "simple", 1)
             for pair in (4, 5)]
    log, rows = CallLog(), []
    for n, (kind, t, seq) in enumerate(entries):
        assert len(log) == len(rows)
        if kind == "row":
            row = ("dp", n, n, "all_gather", "gather", 4, 2e6, "tree", "ll", 1, t, t, t + 0.25)
            log.append(row)
            rows.append(row)
        elif kind == "alone":
            log.block(alone, -1, t, durations=durations)
            rows += [(*h[:2], -1, *h[2:], t, t, t + d)
                     for h, d in zip(alone, durations, strict=True)]
        else:
            ends = [t + 0.5, t + 0.75 + seq]
            log.block(group, seq, t, ends=ends)
            rows += [(*h[:2], seq, *h[2:], t, t, e) for h, e in zip(group, ends, strict=True)]
    expected = pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))
    for text in ("group", "collective", "name", "algorithm", "protocol"):  # categories
        expected[text] = expected[text].astype("category")
    if rows:
        pd.testing.assert_frame_equal(log.frame(COLLECTIVE_COLUMNS), expected)
