"""What a run writes and the commands that read it back: the Perfetto trace
(validated against the trace-event format), the communication log and
profile, link traffic, and every figure in every format."""

import copy
import json
import os
import time

import numpy as np
import pandas as pd
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st
from matplotlib.figure import Figure

from simulator import run
from simulator.analysis import comms
from simulator.analysis.traffic import server_traffic
from simulator.base.ir import Collective
from simulator.cli import main
from simulator.outputs import alongside, gantt, run_dir
from simulator.outputs.gantt import choose_rows, identical_ranks, rank_ranges
from tests.test_parallelism import tiny

MAGIC = {"png": b"\x89PNG\r\n\x1a\n", "pdf": b"%PDF", "svg": b"<?xml"}
METADATA = {"process_name", "thread_name", "thread_sort_index", "process_sort_index"}


def validate_trace_events(trace: dict) -> None:
    """Check a trace against the Chrome trace-event format (the JSON object form):
    required fields and types per phase, flow chains start/step/finish in time
    order and land inside a complete slice of their thread."""
    assert isinstance(trace["traceEvents"], list)
    slices: dict[tuple, list[tuple[float, float]]] = {}
    flows: dict[int, list[dict]] = {}
    for e in trace["traceEvents"]:
        assert e["ph"] in {"X", "M", "C", "s", "t", "f"}, e
        assert isinstance(e["pid"], int) and isinstance(e["name"], str)
        if e["ph"] == "M":
            assert e["name"] in METADATA and isinstance(e["args"], dict)
        elif e["ph"] == "X":
            assert isinstance(e["tid"], int) and isinstance(e["cat"], str)
            assert isinstance(e["ts"], (int, float)) and e["dur"] >= 0
            slices.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
        elif e["ph"] == "C":
            assert e["args"] and all(isinstance(v, (int, float)) for v in e["args"].values())
        else:
            assert isinstance(e["id"], int) and isinstance(e["tid"], int)
            flows.setdefault(e["id"], []).append(e)
    for chain in flows.values():
        assert [e["ph"] for e in chain][0] == "s" and chain[-1]["ph"] == "f"
        assert all(e["ph"] == "t" for e in chain[1:-1])
        for e in chain:
            assert any(a <= e["ts"] <= b for a, b in slices[(e["pid"], e["tid"])])
    json.dumps(trace)


@pytest.fixture(scope="module")
def pipeline_dir(tmp_path_factory):
    """A 1F1B run with TP and DP written by ``clustersim run``."""
    scenario = tiny(tp=2, pp=2, dp=4)
    out = tmp_path_factory.mktemp("pipeline")
    result = run(copy.deepcopy(scenario))
    run_dir.write(result, out)
    return out, result


def test_trace_validates_and_links_each_call(pipeline_dir):
    out, result = pipeline_dir
    trace = json.loads((out / "trace.json").read_text())
    validate_trace_events(trace)
    events = trace["traceEvents"]
    comm = [e for e in events if e["ph"] == "X" and e["cat"] == "comm"]
    assert all({"group", "collective", "algorithm", "bytes", "microbatch", "layer"}
               <= e["args"].keys() for e in comm)
    starts = {e["id"] for e in events if e["ph"] == "s"}
    spans = result.spans
    linked = spans[(spans["kind"] == "comm") & (spans["call"] >= 0)]
    multi = linked.groupby("call")["rank"].nunique()
    assert starts == set(multi[multi >= 2].index)
    counters = {e["name"] for e in events if e["ph"] == "C"}
    assert {"NVLink out (GB/s)", "network out (GB/s)"} <= counters
    assert any(name.startswith("memory rank 0") for name in counters)


def test_run_directory_reads_back(pipeline_dir):
    out, result = pipeline_dir
    finished = run_dir.read(out)
    assert finished.summary == json.loads((out / "summary.json").read_text())
    assert len(finished.spans) == len(result.spans)
    assert len(finished.comms) == len(result.comms)
    assert {"dimension", "wait", "group", "bytes", "start", "end"} <= set(finished.comms.columns)
    assert (finished.comms["wait"] >= 0).all()
    for name in ("ranks.csv", "streams.csv", "critical_path.csv", "comms.parquet"):
        assert (out / name).stat().st_size > 0
    parquet = pd.read_parquet(out / "comms.parquet")
    assert list(parquet.columns) == list(result.comms.columns)
    assert parquet["end"].tolist() == result.comms["end"].tolist()


def test_comms_profile_adds_up(pipeline_dir):
    _, result = pipeline_dir
    table, bins = comms.profile(result.comms), comms.histogram(result.comms)
    assert table["calls"].sum() == len(result.comms) == bins["calls"].sum()
    assert table["bytes_total"].sum() == pytest.approx(result.comms["bytes"].sum())
    assert set(table["dimension"]) == {"tp", "pp", "dp", "embd"}
    pp = table[table["dimension"] == "pp"].iloc[0]
    assert pp["collective"] == "send_recv" and pp["bytes_min"] == 512 * 512 * 2


def test_link_traffic_integrates_to_the_wire_bytes():
    result = run(tiny(dp=16))  # ring all-reduces: every byte leaves through NICs and NVLink
    groups, fabric, lowering = result._context
    traffic = server_traffic(result.comms, groups, result.placement, fabric, lowering)
    total = 0.0
    for (_server, name), (times, rate) in traffic.items():
        assert rate[-1] == 0.0 and (rate >= -1e-9).all()
        if name.startswith("network"):
            total += float(np.sum(rate[:-1] * np.diff(times))) * 1e9
    expected = 0.0
    _, kind = fabric.link_classes()
    for row in result.comms.itertuples():
        members = [result.placement[r] for r in groups[row.group][row.group_index]]
        lowered = lowering(Collective(row.collective), members, row.bytes)
        for route, size in zip(lowered.routes, lowered.sizes, strict=True):
            expected += size * lowered.steps * sum(kind[link] == 2 for link in route)
    assert total == pytest.approx(expected, rel=1e-6)


def test_identical_ranks_share_a_row():
    scenario = tiny(tp=8, dp=2)
    scenario["simulation"] = {"tensor_parallel_gangs": True}
    result = run(scenario)
    groups = identical_ranks(result.spans)
    assert all(len(g) % 8 == 0 for g in groups) and sum(map(len, groups)) == 16
    rows, total = choose_rows(result.spans, group=True)
    assert total == len(groups) and rows[0].label.startswith("ranks 0-")
    rows, total = choose_rows(result.spans)  # 16 ranks or fewer: one row each by default
    assert total == 16 and rows[3].label == "rank 3"
    assert rank_ranges([0, 1, 2, 3, 8, 10, 11]) == "0-3,8,10-11"


@pytest.mark.parametrize("fmt", ["png", "pdf", "svg"])
def test_every_figure_in_every_format(pipeline_dir, tmp_path, fmt, capsys):
    out, result = pipeline_dir
    files = {
        "gantt": (["gantt", str(out), "--out", str(tmp_path / f"g.{fmt}"), "--ranks", "0-3",
                   "--from", "1 ms", "--streams"], tmp_path / f"g.{fmt}"),
        "comms": (["comms", str(out), "--plot", str(tmp_path / f"h.{fmt}")],
                  tmp_path / f"h.{fmt}"),
        "compare": (["compare", str(out), str(out), "--out", str(tmp_path / f"c.{fmt}")],
                    tmp_path / f"c.{fmt}"),
    }
    for args, path in files.values():
        assert main(args) == 0
        assert path.read_bytes()[:len(MAGIC[fmt])] == MAGIC[fmt]
    result.memory_plot(str(tmp_path / f"m.{fmt}"))
    assert (tmp_path / f"m.{fmt}").read_bytes()[:len(MAGIC[fmt])] == MAGIC[fmt]
    if fmt == "svg":  # text stays text: labels are <text>, not glyph paths
        assert "<text" in (tmp_path / "g.svg").read_text()


def test_python_api_needs_no_files(pipeline_dir):
    _, result = pipeline_dir
    assert isinstance(result.gantt(), Figure)
    assert isinstance(result.gantt(ranks=[0, 2], start=0.001, end=0.002, streams=True), Figure)
    assert isinstance(result.spans, pd.DataFrame) and isinstance(result.comms, pd.DataFrame)
    assert len(result.ranks()) == 16 and len(result.critical_path()) > 0


def test_comms_and_compare_print_tables(pipeline_dir, capsys):
    out, _ = pipeline_dir
    assert main(["comms", str(out)]) == 0
    text = capsys.readouterr().out
    assert "send_recv" in text and "size from" in text
    assert main(["compare", str(out), str(out), "--out", str(out / "cmp.png")]) == 0
    text = capsys.readouterr().out
    assert "iteration_time_s" in text and "1.000" in text


@pytest.mark.parametrize(("args", "message"), [
    (["gantt", "/nonexistent/run"], "error: /nonexistent/run: not a run directory"),
    (["gantt", "{out}", "--ranks", "0-99"], "error: --ranks: '0-99' is outside ranks 0-15"),
    (["gantt", "{out}", "--from", "soon"], "error: --from: 'soon' is not a time"),
    (["gantt", "{out}", "--from", "2 ms", "--to", "1 ms"], "error: --to: 1 ms must be later"),
    (["gantt", "{out}", "--out", "x.jpg"], "error: --out: x.jpg must end in one of"),
    (["comms", "{out}", "--plot", "x.gif"], "error: --plot: x.gif must end in one of"),
])
def test_bad_arguments_exit_2_with_one_line(pipeline_dir, capsys, args, message):
    out, _ = pipeline_dir
    code = main([a.format(out=out) for a in args])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(message) and err.count("\n") == 1


def test_merge_close_joins_only_gaps_at_most_the_threshold():
    from simulator.outputs.bars import merge_close

    start, end = merge_close(np.array([5.0, 0.0, 1.0, 3.0]), np.array([6.0, 1.0, 2.5, 4.0]), 0.5)
    assert start.tolist() == [0.0, 5.0] and end.tolist() == [4.0, 6.0]  # 3 - 2.5 <= 0.5
    empty = merge_close(np.array([]), np.array([]), 1.0)
    assert len(empty[0]) == 0 and len(empty[1]) == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 5)), min_size=1, max_size=40),
       st.floats(0, 2))
def test_merged_intervals_cover_the_originals_and_keep_their_gaps(pairs, gap):
    """Every original interval lies inside one merged interval; merged intervals are
    more than ``gap`` apart; the covered length grows by at most the gaps merged."""
    from simulator.analysis.timeline import union_length
    from simulator.outputs.bars import merge_close

    start = np.array([s for s, _ in pairs])
    end = start + np.array([d for _, d in pairs])
    ms, me = merge_close(start, end, gap)
    assert (ms[1:] > me[:-1] + gap).all()
    for s, e in zip(start, end, strict=True):
        assert ((ms <= s) & (me >= e)).any()
    assert union_length(ms, me) <= union_length(start, end) + gap * len(pairs) + 1e-9


def test_a_large_run_writes_parquet_spans_and_a_bounded_trace(tmp_path, monkeypatch):
    """Above the thresholds: no spans.csv or comms.csv (Parquet holds every span and
    call), a trace of a few ranks from every stage, one slice per layer pass when
    those ranks have too many spans (and fewer ranks, spread over the stages, when
    even those slices are too many); ``clustersim trace`` writes any ranks kernel
    by kernel on demand, and the Gantt and comms commands read the Parquet back."""
    monkeypatch.setattr(run_dir, "CSV_ROWS", 10)
    monkeypatch.setattr(run_dir, "TRACE_SPANS", 10)
    monkeypatch.setattr(run_dir, "TRACE_RANKS", 4)
    result = run(tiny(tp=2, pp=4, dp=2))
    out = tmp_path / "big"
    run_dir.write(result, out)
    assert not (out / "spans.csv").exists() and not (out / "comms.csv").exists()
    back = run_dir.read(out)
    assert len(back.spans) == len(result.spans) and back.placement == result.placement
    assert back.comms["end"].tolist() == result.comms["end"].tolist()
    trace = json.loads((out / "trace.json").read_text())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    traced = {e["args"]["rank"] for e in slices}
    stage_of = result.extra["stage_of"]
    chosen = run_dir.trace_ranks(16, stage_of)
    assert {stage_of[r] for r in chosen} == {0, 1, 2, 3}
    assert traced == {chosen[0], chosen[-1]}  # its slices too many: spread, ends kept
    memory = {e["name"] for e in trace["traceEvents"] if e["name"].startswith("memory")}
    assert memory <= {f"memory rank {r} (GiB)" for r in traced}
    assert trace["otherData"] == {"detail": "layer", "ranks": sorted(traced)}
    kernels = result.spans_of(sorted(traced))
    assert len(slices) < len(kernels)  # one slice per layer pass and stream
    layer = kernels[kernels["layer"] >= 0]
    passes = layer.groupby(["rank", "stream", "kind", "phase", "microbatch", "layer"],
                           observed=True).agg(start=("start", "min"), end=("end", "max"))
    merged = {(e["args"]["rank"], e["ts"], e["dur"]) for e in slices}
    for (rank, *_), row in passes.iterrows():
        assert (rank, round(row["start"] * 1e6, 6),
                round((row["end"] - row["start"]) * 1e6, 6)) in merged
    assert main(["trace", str(out), "--ranks", "5,9", "--out", str(tmp_path / "t.json")]) == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["args"]["rank"] for e in events if e["ph"] == "X"} == {5, 9}
    assert any(e["ph"] == "s" for e in events)  # their shared calls keep their arrows
    assert main(["gantt", str(out), "--ranks", "12-15", "--out", str(tmp_path / "g.png")]) == 0


def test_trace_ranks_takes_every_stage():
    from simulator.outputs.run_dir import trace_ranks

    assert trace_ranks(8) == list(range(8))
    stages = tuple(r % 4 for r in range(64))  # strided stages (pp not last in the order)
    chosen = trace_ranks(64, stages)
    assert len(chosen) == 8 and sorted({stages[r] for r in chosen}) == [0, 1, 2, 3]
    assert len(trace_ranks(640, tuple(r // 20 for r in range(640)))) == 32  # one per stage


def test_a_folded_run_keeps_one_timeline_per_class_and_expands_any_rank(tmp_path,
                                                                        monkeypatch):
    """Above EXPAND_SPANS the run keeps each class's representative's spans; the
    per-rank and per-stream tables, any rank's spans (with its own log rows) and
    the directory's gantt/trace --ranks equal the fully expanded run's."""
    from simulator.runner import result as runner

    scenario = tiny(tp=2, pp=2, dp=4, zero=1)
    whole = run(copy.deepcopy(scenario))
    monkeypatch.setattr(runner, "EXPAND_SPANS", 10)
    folded = run(copy.deepcopy(scenario))
    assert folded.folded is not None and folded.spans["rank"].nunique() == 2
    pd.testing.assert_frame_equal(folded.ranks(), whole.ranks())
    pd.testing.assert_frame_equal(folded.streams(), whole.streams())
    some = [3, 6, 13]
    expected = whole.spans[whole.spans["rank"].isin(some)].reset_index(drop=True)
    pd.testing.assert_frame_equal(folded.spans_of(some), expected, check_categorical=False)
    every = list(range(16))  # every rank names its own calls (block plans and explicit)
    pd.testing.assert_frame_equal(folded.spans_of(every), whole.spans, check_categorical=False)
    out = tmp_path / "folded"
    run_dir.write(folded, out)
    assert (out / "classes.csv").exists()
    back = run_dir.read(out)
    pd.testing.assert_frame_equal(back.spans_of(some).reset_index(drop=True), expected,
                                  check_categorical=False, check_dtype=False)
    pd.testing.assert_frame_equal(back.spans_of(every).reset_index(drop=True), whole.spans,
                                  check_categorical=False, check_dtype=False)
    assert main(["trace", str(out), "--ranks", "13", "--out", str(tmp_path / "t.json")]) == 0
    events = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert {e["args"]["rank"] for e in events if e["ph"] == "X"} == {13}
    assert main(["gantt", str(out), "--ranks", "12-15", "--out", str(tmp_path / "g.png")]) == 0
    assert main(["gantt", str(out), "--out", str(tmp_path / "all.png")]) == 0
    rows, total = choose_rows(back.spans, classes=back.classes())
    assert total == 2 and sorted(r for row in rows for r in row.ranks) == list(range(16))
    whole_dir = tmp_path / "whole"
    run_dir.write(whole, whole_dir)
    drawn = []
    real = gantt.compare_figure
    monkeypatch.setattr(gantt, "compare_figure", lambda a, b, *rest, **kw: (
        drawn.append((sorted(a["rank"].unique()), kw["classes"])), real(a, b, *rest, **kw))[1])
    for ranks, expected_ranks in (("13", [13]), (None, [0, 8])):
        flags = ["--ranks", ranks] if ranks else []
        assert main(["compare", str(out), str(whole_dir), *flags,
                     "--out", str(tmp_path / "c.png")]) == 0
        assert drawn[-1][0] == expected_ranks  # a mate expanded; else a row per class
    assert drawn[-1][1][0] == back.classes() and drawn[-1][1][1] is None


def test_a_folded_run_maps_every_mate_to_its_own_calls_through_block_plans(monkeypatch):
    """Exclusive tensor-parallel calls (each gang holds whole TP groups) and message
    groups are logged as blocks of rows: every rank's expanded spans still name its
    own calls, as in the expanded run."""
    from simulator.runner import result as runner

    scenario = tiny(tp=8, pp=2, dp=2)
    scenario["cluster"]["nodes"] = 4
    whole = run(copy.deepcopy(scenario))
    monkeypatch.setattr(runner, "EXPAND_SPANS", 10)
    folded = run(copy.deepcopy(scenario))
    blocks = {row for rows in folded.folded.mate_blocks.values() for row in rows}
    assert {"tp", "pp"} <= {str(g).split(".")[0] for g in folded.comms["group"][list(blocks)]}
    every = list(range(32))
    pd.testing.assert_frame_equal(folded.spans_of(every), whole.spans, check_categorical=False)


def test_a_large_run_draws_its_figures_alongside_and_writes_the_same_files(tmp_path,
                                                                             monkeypatch):
    """Above BACKGROUND_ROWS the figures are drawn in a forked child while the
    tables are written: every file is byte-for-byte what one process writes, and
    a failure in the child is an error here that says what failed."""
    result = run(tiny(tp=2, pp=4, dp=2))
    run_dir.write(result, tmp_path / "alone")
    monkeypatch.setattr(run_dir, "BACKGROUND_ROWS", 0)
    run_dir.write(result, tmp_path / "alongside")
    names = sorted(p.name for p in (tmp_path / "alone").iterdir())
    assert names == sorted(p.name for p in (tmp_path / "alongside").iterdir())
    assert "gantt.png" in names and "memory.png" in names
    for name in names:
        assert (tmp_path / "alone" / name).read_bytes() == \
            (tmp_path / "alongside" / name).read_bytes(), name
    monkeypatch.setattr(type(result), "memory_plot", lambda self, path: 1 / 0)
    with pytest.raises(alongside.BackgroundError, match="ZeroDivisionError"):
        run_dir.write(result, tmp_path / "alone")
    # the run that was there stays, whole; the failed write left nothing beside it
    assert run_dir.read(tmp_path / "alone").summary == result.summary
    assert sorted(p.name for p in tmp_path.iterdir()) == ["alone", "alongside"]


@pytest.mark.skipif(not hasattr(os, "fork") or (os.cpu_count() or 1) < 2,
                    reason="needs fork and two cores")
def test_both_processes_take_tasks_and_each_task_runs_once(tmp_path):
    log = tmp_path / "log"

    def task(n: int):
        def write() -> None:
            with open(log, "a") as f:
                f.write(f"{n} {os.getpid()}\n")
            time.sleep(0.05)
        return write

    alongside.together(lambda: None, [task(n) for n in range(8)], background=True)
    done = [line.split() for line in log.read_text().splitlines()]
    assert sorted(int(n) for n, _ in done) == list(range(8))
    assert len({pid for _, pid in done}) == 2


def test_a_deep_pipelines_memory_plot_keeps_its_axes(tmp_path):
    """Forty stages share a colour scale instead of a legend entry each, which
    squeezed the axes to nothing (matplotlib warned, and the plot was empty)."""
    import warnings

    from simulator.outputs.memory_plot import plot_memory

    times = np.array([0.0, 1.0, 2.0])
    lines = {f"stage {s} (rank {8 * s})": (times, np.array([1.0, 2.0 + s / 40, 1.0]) * 2**30)
             for s in range(40)}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        path = plot_memory(lines, tmp_path / "memory.png", 80 * 2**30, "deep")
    assert path.stat().st_size > 10_000


def test_a_run_past_a_million_spans_writes_its_trace_on_demand(tmp_path, monkeypatch, capsys):
    """Past ON_DEMAND_SPANS spans (every rank's) the default outputs leave out
    trace.json (``clustersim trace`` writes any ranks' from the span table, and
    ``--trace`` asks for it); large tables go to Parquet a chunk at a time."""
    from simulator.cli import main
    from simulator.outputs import exports
    monkeypatch.setattr(run_dir, "ON_DEMAND_SPANS", 10)
    monkeypatch.setattr(exports, "PARQUET_CHUNK", 100)
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(tiny(tp=2, pp=2, dp=4)))
    assert main(["run", str(scenario), "--out", str(tmp_path / "big")]) == 0
    out = capsys.readouterr().out
    assert not (tmp_path / "big" / "trace.json").exists()
    assert "no trace.json for a run this large: clustersim trace" in out
    back = run_dir.read(tmp_path / "big")
    assert len(back.spans) > 100  # read back whole from several row groups
    assert main(["run", str(scenario), "--out", str(tmp_path / "asked"), "--trace"]) == 0
    assert (tmp_path / "asked" / "trace.json").exists()
    spans = pd.read_parquet(tmp_path / "big" / "spans.parquet")
    again = pd.read_parquet(tmp_path / "asked" / "spans.parquet")
    pd.testing.assert_frame_equal(spans, again)
