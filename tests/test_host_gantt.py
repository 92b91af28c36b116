"""A kernel that waits for its launch is host-bound in the outputs: spans'
``host_wait_s`` (``runner.host_waits``), the Gantt's lightened leading part
(``outputs.launch_waits``) and the trace's ``host_wait_us``."""

import copy

import numpy as np
import pandas as pd
import pytest
from matplotlib.figure import Figure
from matplotlib.patches import PathPatch

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.compute.host import host_bound, host_bound_waits, race, race_waits
from simulator.outputs import launch_waits
from simulator.outputs.exports import chrome_trace, layer_detail
from simulator.outputs.gantt import figure
from tests.test_parallelism import reference

TINY = {"name": "launch-bound", "cluster": {"preset": "dgx-h100", "nodes": 1},
        "model": {"preset": "gpt3-350m", "layers": 2},
        "training": {"seq_len": 1024, "global_batch": 2, "micro_batch": 1,
                     "kernel_launch": "200 us"},
        "parallelism": {"tp": 8, "sequence_parallel": True}}


def scenario(**training):
    out = copy.deepcopy(TINY)
    out["training"].update(training)
    return out


@pytest.fixture(scope="module")
def bound():
    return run(scenario())


def kernel(phase=Phase.FORWARD):
    return Op(OpKind.COMPUTE, "k", "compute", phase, kernel=KernelClass.ELEMENTWISE)


def test_the_wait_is_the_leading_part_of_the_effective_duration():
    durations = np.array([1.0, 1.0, 10.0, 1.0])
    effective, waits = race_waits(durations, np.ones(4, int), 2.0)
    assert waits.tolist() == [2.0, 1.0, 1.0, 0.0]  # the host ahead after the long one: 0
    assert effective.tolist() == race(durations, np.ones(4, int), 2.0).tolist()
    assert effective == pytest.approx(durations + waits)
    _, ahead = race_waits(np.full(5, 100e-6), np.ones(5, int), 10e-6)
    assert ahead[0] == pytest.approx(10e-6) and (ahead[1:] == 0.0).all()  # exactly 0


def test_waits_are_carried_per_step_kind_as_the_durations_are():
    ops = [kernel(), kernel(), kernel(Phase.BACKWARD), kernel(), kernel(), kernel(Phase.BACKWARD),
           kernel(Phase.OPTIMIZER)]
    durations = np.array([1e-6, 50e-6, 1e-6, 1e-6, 50e-6, 1e-6, 1e-6])
    out, waits = host_bound_waits(ops, [(0, 3, "a"), (3, 6, "a")], durations, 10e-6)
    assert out.tolist() == host_bound(ops, [(0, 3, "a"), (3, 6, "a")], durations,
                                      10e-6).tolist()
    assert waits[:3].tolist() == waits[3:6].tolist() and waits[6] == 0.0
    assert out == pytest.approx(durations + waits)
    assert host_bound_waits(ops, [(0, 3, "a")], durations, 0.0)[1] is None


def test_spans_waits_sum_to_the_critical_ranks_host_stall(bound):
    spans, summary = bound.spans, bound.summary
    critical = spans[spans["rank"] == summary["critical_rank"]]
    assert summary["host_stall_s"] > 0.01
    assert critical["host_wait_s"].sum() == pytest.approx(summary["host_stall_s"], rel=1e-9)
    waited = spans[spans["host_wait_s"] > 0]
    assert len(waited) > 0 and set(waited["kind"].astype(str)) == {"compute"}
    assert (waited["host_wait_s"] <= waited["end"] - waited["start"] + 1e-15).all()
    for _, frame in spans.groupby("rank"):  # every rank's (one program), not only the critical
        assert frame["host_wait_s"].sum() == pytest.approx(summary["host_stall_s"], rel=1e-6)


def test_no_launch_cost_no_waits():
    spans = run(scenario(kernel_launch="0 s")).spans
    assert "host_wait_s" in spans.columns and (spans["host_wait_s"] == 0.0).all()
    legend = [t.get_text() for lg in figure(spans).legends for t in lg.get_texts()]
    assert launch_waits.LABEL not in legend


def test_layer_detail_keeps_each_ranks_total():
    result = run({**scenario(), "simulation": {"span_detail": "layer"}})
    spans = result.spans
    assert spans["name"].astype(str).str.startswith("layer").any()
    critical = spans[spans["rank"] == result.summary["critical_rank"]]
    assert critical["host_wait_s"].sum() == pytest.approx(result.summary["host_stall_s"],
                                                          rel=1e-9)
    assert (spans["host_wait_s"] <= spans["end"] - spans["start"] + 1e-12).all()


def test_replayed_steps_carry_the_reference_engines_waits():
    steps = scenario(global_batch=8)  # one rank simulated, its steps replayed, copied to 8
    fast, slow = run(steps), run(reference(steps))
    assert fast.summary["steps_replayed"] > 0 and fast.folded is None
    keys = ["rank", "start", "end", "stream"]
    a = fast.spans.sort_values(keys, kind="stable")["host_wait_s"].to_numpy()
    b = slow.spans.sort_values(keys, kind="stable")["host_wait_s"].to_numpy()
    assert b.sum() > 0 and a == pytest.approx(b, rel=1e-9, abs=1e-15)


def test_the_gantt_draws_the_waits_with_their_legend_entry(bound):
    fig = figure(bound.spans, "launch-bound")
    assert isinstance(fig, Figure)
    legend = [t.get_text() for lg in fig.legends for t in lg.get_texts()]
    assert launch_waits.LABEL in legend
    window = figure(bound.spans, start=1e-4, end=5e-4, ranks=[0], breakdown=False)
    assert launch_waits.LABEL in [t.get_text() for lg in window.legends for t in lg.get_texts()]
    fig.canvas.draw()  # renders without error


def test_a_window_clips_the_wait_to_its_part_inside():
    frame = pd.DataFrame({"start": [0.0, 10.0], "end": [5.0, 12.0], "host_wait_s": [3.0, 1.0]})
    clipped = frame.assign(start=frame["start"].clip(lower=2.0), end=frame["end"].clip(upper=11.5))
    out = launch_waits.clip(frame, clipped)
    assert out["host_wait_s"].tolist() == [1.0, 1.0]  # [2, 3) of [0, 3); [10, 11) whole
    late = frame.assign(start=frame["start"].clip(lower=4.0))
    assert launch_waits.clip(frame, late)["host_wait_s"].tolist()[0] == 0.0


def test_waits_below_a_pixel_merge_into_few_bars():
    n = 20_000  # 1 us kernels, each waiting 0.5 us for its launch: 30 ms of them
    start = np.arange(n) * 1.5e-6
    spans = pd.DataFrame({"rank": 0, "node": 0, "stream": "compute", "kind": "compute",
                          "name": "k", "start": start, "end": start + 1.5e-6,
                          "phase": "forward", "microbatch": 0, "layer": 0, "bytes": 0.0,
                          "call": -1, "host_wait_s": 0.5e-6})
    fig = figure(spans, breakdown=False)
    ax = fig.axes[0]
    vertices = sum(len(p.get_path().vertices) for p in ax.patches if isinstance(p, PathPatch))
    assert vertices < 100  # the compute bar and the waits' one merged bar, not 20,000 each


def test_the_trace_names_each_kernels_wait(bound):
    spans = bound.spans[bound.spans["rank"] == 0]
    events = [e for e in chrome_trace(spans, bound.placement)["traceEvents"] if e["ph"] == "X"]
    waited = [e for e in events if "host_wait_us" in e["args"]]
    assert len(waited) == int((spans["host_wait_s"] > 0).sum()) > 0
    assert sum(e["args"]["host_wait_us"] for e in waited) == pytest.approx(
        spans["host_wait_s"].sum() * 1e6, rel=1e-6)
    assert all(e["args"]["host_wait_us"] <= e["dur"] + 1e-6 for e in waited)
    merged = layer_detail(spans)
    assert merged["host_wait_s"].sum() == pytest.approx(spans["host_wait_s"].sum())
