"""A finished run's directory: what ``clustersim run`` writes, and reading it back.

    summary.json        the summary (see simulator.analysis.summary)
    scenario.yaml       the scenario as given (with --set applied)
    spans.parquet       every span: rank, node, stream, kind, name, start, end,
                        phase, micro-batch, layer, bytes, call (row of comms),
                        host_wait_s (a kernel's wait for its launch, else 0)
    spans.csv           the same as CSV, when there are at most CSV_ROWS spans
                        (or with ``clustersim run --spans-csv``)
    placement.csv       rank, GPU and server of every rank
    comms.parquet/.csv  the communication log: every collective call and message (the
                        CSV too while it has at most CSV_ROWS rows, or with --spans-csv)
    ranks.csv           per-rank time breakdown (simulator.analysis.timeline.rank_table)
    streams.csv         per (rank, stream) busy/overlap/exposed/wait
    critical_path.csv   the chain of spans that sets the iteration time
    classes.csv         a folded run (more than EXPAND_SPANS spans in all): each rank
                        and the rank whose spans it has (spans.parquet holds those
                        only); mate_calls.parquet maps each rank's copied log rows
                        to its own (plan -1: one row, rank -> call; plan >= 0: the
                        representative's row heads a block of that plan; plan -2:
                        the plan -1 - copied_call moves rank's row by call rows);
                        ``gantt --ranks`` and ``trace --ranks`` expand any rank
    trace.json          (runs of at most ON_DEMAND_SPANS spans, every rank's, or with
                        ``clustersim run --trace``)
                        Chrome/Perfetto trace with flows and counters, for every rank
                        while the run has at most TRACE_SPANS spans, else for
                        TRACE_RANKS ranks spread over the pipeline stages, kernel
                        by kernel while those have at most TRACE_SPANS spans, else
                        one slice per layer pass (for fewer ranks, spread evenly,
                        if still more slices), link-traffic counters averaged
                        and memory counters at their peak over COUNTER_BINS bins
                        (``otherData.detail`` says which;
                        ``clustersim trace RUN_DIR --ranks ...`` writes any rank's
                        kernels and exact counters)
    gantt.FMT, memory.FMT  figures
    manifest.json       every file above with its size and SHA-256 (written last)

The directory is written into a hidden sibling and put in place at once when
complete (``out_dirs.staged``): a reader sees the previous run or this one,
never a mix, and an interrupted write leaves nothing behind. ``clustersim
gantt``, ``comms``, ``compare``, ``trace`` and ``blame`` read it back without
simulating again (``finished_run.read``, which checks every file it reads).
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import yaml

from simulator.analysis.traffic import binned, binned_peak
from simulator.engine.folded import Folded
from simulator.outputs import exports
from simulator.outputs.alongside import together
from simulator.outputs.finished_run import FinishedRun, read
from simulator.outputs.out_dirs import RunDirError, guarded, staged
from simulator.outputs.selection import spread

__all__ = ["FinishedRun", "RunDirError", "read", "trace_ranks", "write"]

CSV_ROWS = 100_000  # larger span tables and logs are written as Parquet only (unless asked)
TRACE_SPANS = 100_000  # larger runs' default trace keeps TRACE_RANKS ranks: a file
TRACE_RANKS = 8  # Perfetto opens (at least one rank per pipeline stage)
COUNTER_BINS = 2_000  # a layer-detail trace's link counters: averages over this many bins
BACKGROUND_ROWS = 200_000  # spans and log rows above which outputs use two processes (alongside)
ON_DEMAND_SPANS = 1_000_000  # a run of more spans (every rank's) writes no trace.json unless
# asked (``clustersim run --trace``); ``clustersim trace`` writes any ranks' from its spans


def represented_spans(result) -> int:
    """Spans of every rank of ``result``: its table's, or in a run that keeps one
    timeline per class, each class's times its ranks."""
    if result.folded is None:
        return len(result.spans)
    per_rank = result.spans["rank"].value_counts()
    return int(sum(per_rank.get(c[0], 0) * len(c) for c in result.folded.classes()))


def writes_trace(result, trace: bool | None = None) -> bool:
    """Whether ``trace.json`` is written: asked for (``trace``), or by default for a
    run of at most ON_DEMAND_SPANS spans."""
    return trace if trace is not None else represented_spans(result) <= ON_DEMAND_SPANS


def trace_ranks(ranks: int, stage_of: tuple[int, ...] = ()) -> list[int]:
    """Every rank up to TRACE_RANKS; else the first ranks of every pipeline stage,
    TRACE_RANKS in all (at least one per stage).

    >>> trace_ranks(4)
    [0, 1, 2, 3]
    >>> trace_ranks(64, tuple(r // 16 for r in range(64)))
    [0, 1, 16, 17, 32, 33, 48, 49]
    """
    if ranks <= TRACE_RANKS:
        return list(range(ranks))
    stage_of = stage_of or (0,) * ranks
    stages = sorted(set(stage_of))
    per = max(1, TRACE_RANKS // len(stages))
    chosen: dict[int, list[int]] = {s: [] for s in stages}
    for rank, stage in enumerate(stage_of):
        if len(chosen[stage]) < per:
            chosen[stage].append(rank)
    return sorted(r for members in chosen.values() for r in members)


def write(result, out: Path, fmt: str = "png", spans_csv: bool = False,
          trace: bool | None = None) -> None:
    """Write every output of ``result`` (a RunResult) as the run directory ``out``
    (which it replaces whole, once complete: no stale file of an earlier run
    stays); ``trace``: write trace.json (None: ``writes_trace``'s default). An
    OS error while writing is an OutputError naming the file."""
    with staged(Path(out), result.scenario.name) as folder:
        def figures() -> None:
            for name, draw in ((f"gantt.{fmt}", result.gantt),
                               (f"memory.{fmt}", result.memory_plot)):
                guarded(folder / name, lambda draw=draw, name=name: draw(str(folder / name)))

        together(figures, _table_tasks(result, folder, spans_csv,
                                       writes_trace(result, trace)),
                 background=len(result.spans) + len(result.comms) > BACKGROUND_ROWS)


def _table_tasks(result, out: Path, spans_csv: bool, trace: bool = True) -> list:
    """Everything but the figures, one task per file, the longest (the trace, the
    span table) first so that two processes finish together; each an
    OutputError naming its file if the system refuses the write."""
    files = [("summary.json", lambda p: exports.write_summary(result.summary, p)),
             *([("trace.json", lambda p: _write_trace(result, p))] if trace else []),
             ("spans.parquet", lambda p: exports.write_table(result.spans, p)),
             ("comms.parquet", lambda p: exports.write_table(result.comms, p)),
             ("streams.csv", lambda p: exports.write_table(result.streams(), p)),
             ("ranks.csv", lambda p: exports.write_table(result.ranks(), p)),
             ("critical_path.csv", lambda p: exports.write_table(result.critical_path(), p)),
             ("scenario.yaml", lambda p: p.write_text(yaml.safe_dump(
                 dict(result.scenario.source), sort_keys=False, allow_unicode=True))),
             ("placement.csv", lambda p: pd.DataFrame(
                 {"rank": range(len(result.placement)), "gpu": result.placement,
                  "node": result.node_of_rank}).to_csv(p, index=False))]
    if spans_csv or len(result.spans) <= CSV_ROWS:
        files.append(("spans.csv", lambda p: exports.write_spans(result.spans, p)))
    if spans_csv or len(result.comms) <= CSV_ROWS:
        files.append(("comms.csv", lambda p: exports.write_table(result.comms, p)))
    if result.folded is not None:
        files.append(("classes.csv", lambda p: _write_folded(result.folded, out)))
    return [lambda name=name, write=write: guarded(out / name, lambda: write(out / name))
            for name, write in files]


def _write_trace(result, path: Path) -> None:
    """The default trace: every rank of a small run; else TRACE_RANKS ranks, and
    one slice per layer pass when even those have more than TRACE_SPANS spans;
    if those slices are still more than TRACE_SPANS (a deep pipeline: a rank per
    stage), fewer ranks spread evenly over them."""
    spans, servers, detail = result.spans, None, "kernel"
    memory = result.memory
    if len(spans) > TRACE_SPANS or result.folded is not None:
        chosen = trace_ranks(len(result.placement), tuple(result.extra.get("stage_of", ())))
        spans = result.spans_of(chosen)
        if len(spans) > TRACE_SPANS:
            spans, detail = exports.layer_detail(spans), "layer"
            chosen = spread(chosen, max(2, len(chosen) * TRACE_SPANS // len(spans)))
            spans = spans[spans["rank"].isin(chosen)]
        servers = sorted({result.node_of_rank[r] for r in chosen})
        memory = {r: m for r, m in memory.items() if r in chosen}
    counters = exports.memory_counters(memory, result.node_of_rank)
    traffic = result.traffic(servers)
    if detail == "layer":  # a counter sample per kernel would outnumber the slices
        traffic = {key: binned(*steps, COUNTER_BINS) for key, steps in traffic.items()}
        counters = {key: binned_peak(*steps, COUNTER_BINS) for key, steps in counters.items()}
    counters.update(traffic)
    exports.write_chrome_trace(spans, result.placement, path, result.comms, counters, detail)


def _write_folded(folded: Folded, out: Path) -> None:
    of = folded.representative()
    pd.DataFrame({"rank": sorted(of), "representative": [of[r] for r in sorted(of)]}).to_csv(
        out / "classes.csv", index=False)
    rows = [(mate, rep_row, own, -1) for mate, calls in sorted(folded.mate_calls.items())
            for rep_row, own in calls.items()]
    rows += [(rep, rep_row, -1, plan) for rep, blocks in sorted(folded.mate_blocks.items())
             for rep_row, plan in blocks.items()]
    rows += [(mate, -1 - plan, offset, -2) for plan, offsets in enumerate(folded.plans)
             for mate, offset in offsets.items()]
    exports.write_table(pd.DataFrame(rows, columns=["rank", "copied_call", "call", "plan"]),
                        out / "mate_calls.parquet")
