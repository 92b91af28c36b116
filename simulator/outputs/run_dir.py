"""A finished run's directory: what ``clustersim run`` writes, and reading it back.

    summary.json        the summary (see simulator.analysis.summary)
    scenario.yaml       the scenario as given (with --set applied)
    spans.parquet       every span: rank, node, stream, kind, name, start, end,
                        phase, micro-batch, layer, bytes, call (row of comms)
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
    trace.json          Chrome/Perfetto trace with flows and counters, for every rank
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

``clustersim gantt``, ``comms`` and ``compare`` read these back without
simulating again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import yaml

from simulator.analysis.traffic import binned, binned_peak
from simulator.engine.folded import Folded
from simulator.engine.records import SPAN_TEXT
from simulator.outputs import exports
from simulator.outputs.alongside import together
from simulator.outputs.selection import spread

CSV_ROWS = 100_000  # larger span tables and logs are written as Parquet only (unless asked)
TRACE_SPANS = 100_000  # larger runs' default trace keeps TRACE_RANKS ranks: a file
TRACE_RANKS = 8  # Perfetto opens (at least one rank per pipeline stage)
COUNTER_BINS = 2_000  # a layer-detail trace's link counters: averages over this many bins
BACKGROUND_ROWS = 200_000  # spans and log rows above which outputs use two processes (alongside)
OPTIONAL_FILES = ("spans.csv", "comms.csv", "classes.csv", "mate_calls.parquet")


class RunDirError(ValueError):
    """A directory that is not a readable run; the message names the path."""


@dataclass
class FinishedRun:
    """A run read back from its directory."""

    path: Path
    name: str
    summary: dict
    spans: pd.DataFrame
    comms: pd.DataFrame
    placement: list[str]  # the GPU of each rank
    nodes: list[int] = field(default_factory=list)  # the server of each rank
    folded: Folded | None = None  # spans hold one rank per class (see classes.csv)
    scenario: dict = field(default_factory=dict)  # scenario.yaml, as given

    def spans_of(self, ranks: list[int]) -> pd.DataFrame:
        """The spans of ``ranks``, expanded from their classes in a folded run."""
        if self.folded is None:
            return self.spans[self.spans["rank"].isin(ranks)]
        return self.folded.ranks(self.spans, ranks, self.nodes)

    def classes(self) -> list[list[int]] | None:
        """A folded run's ranks, class by class (None when every rank's spans are here)."""
        return None if self.folded is None else self.folded.classes()


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


def write(result, out: Path, fmt: str = "png", spans_csv: bool = False) -> None:
    """Write every output of ``result`` (a RunResult) into ``out`` (files an earlier
    run left there that this one does not write are removed: no stale CSV)."""
    out.mkdir(parents=True, exist_ok=True)
    for name in OPTIONAL_FILES:
        (out / name).unlink(missing_ok=True)

    def figures() -> None:
        result.gantt(str(out / f"gantt.{fmt}"))
        result.memory_plot(str(out / f"memory.{fmt}"))

    together(figures, _table_tasks(result, out, spans_csv),
             background=len(result.spans) + len(result.comms) > BACKGROUND_ROWS)


def _table_tasks(result, out: Path, spans_csv: bool) -> list:
    """Everything but the figures, one task per file: the summary first (what a
    failure later must not lose), then the longest (the trace, the span table)
    so that two processes finish together."""
    tasks = [lambda: exports.write_summary(result.summary, out / "summary.json"),
             lambda: _write_trace(result, out / "trace.json"),
             lambda: exports.write_table(result.spans, out / "spans.parquet"),
             lambda: exports.write_table(result.comms, out / "comms.parquet"),
             lambda: exports.write_table(result.streams(), out / "streams.csv"),
             lambda: exports.write_table(result.ranks(), out / "ranks.csv"),
             lambda: exports.write_table(result.critical_path(), out / "critical_path.csv"),
             lambda: (out / "scenario.yaml").write_text(yaml.safe_dump(
                 dict(result.scenario.source), sort_keys=False)),
             lambda: pd.DataFrame({"rank": range(len(result.placement)),
                                   "gpu": result.placement, "node": result.node_of_rank}
                                  ).to_csv(out / "placement.csv", index=False)]
    if spans_csv or len(result.spans) <= CSV_ROWS:
        tasks.append(lambda: exports.write_spans(result.spans, out / "spans.csv"))
    if spans_csv or len(result.comms) <= CSV_ROWS:
        tasks.append(lambda: exports.write_table(result.comms, out / "comms.csv"))
    if result.folded is not None:
        tasks.append(lambda: _write_folded(result.folded, out))
    return tasks


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


def _read_folded(path: Path) -> Folded | None:
    if not (path / "classes.csv").exists():
        return None
    classes = pd.read_csv(path / "classes.csv")
    represents: dict[int, list[int]] = {}
    for rank, rep in zip(classes["rank"], classes["representative"], strict=True):
        members = represents.setdefault(int(rep), [])
        if rank != rep:
            members.append(int(rank))
    calls = pd.read_parquet(path / "mate_calls.parquet")
    folded = Folded({r: tuple(m) for r, m in represents.items()}, {})
    plans: dict[int, dict[int, int]] = {}
    for rank, copied, own, plan in zip(calls["rank"].tolist(), calls["copied_call"].tolist(),
                                       calls["call"].tolist(), calls["plan"].tolist(),
                                       strict=True):
        if plan == -1:  # an explicit row: the mate's own call
            folded.mate_calls.setdefault(rank, {})[copied] = own
        elif plan == -2:  # a plan's offset for one mate
            plans.setdefault(-1 - copied, {})[rank] = own
        else:  # a representative's row that heads a block
            folded.mate_blocks.setdefault(rank, {})[copied] = plan
    used = [p for blocks in folded.mate_blocks.values() for p in blocks.values()]
    folded.plans = [plans.get(p, {}) for p in range(max([*plans, *used], default=-1) + 1)]
    return folded


def read(path: str | Path) -> FinishedRun:
    """Read a run directory back; a missing or unreadable file is a RunDirError
    naming it."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: not a run directory (write one with clustersim run)")
    try:
        summary = json.loads((path / "summary.json").read_text())
        table = path / "spans.parquet"
        spans = pd.read_parquet(table) if table.exists() else pd.read_csv(path / "spans.csv")
        parquet = path / "comms.parquet"
        comms = pd.read_parquet(parquet) if parquet.exists() else pd.read_csv(path / "comms.csv")
        scenario = yaml.safe_load((path / "scenario.yaml").read_text()) or {}
        where = path / "placement.csv"
        table = pd.read_csv(where) if where.exists() else None
        placement = (table["gpu"].astype(str).tolist() if table is not None else
                     [f"rank {r}" for r in range(int(spans["rank"].max()) + 1)])
        nodes = table["node"].astype(int).tolist() if table is not None else []
        folded = _read_folded(path)
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise RunDirError(f"{path}: cannot read the run ({error})") from None
    for column in SPAN_TEXT:
        spans[column] = spans[column].astype(str).astype("category")
    return FinishedRun(path, str(scenario.get("name", path.name)), summary, spans, comms,
                       placement, nodes, folded, scenario)
