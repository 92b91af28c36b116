"""A run's result: the engine's spans and calls as tables, the summary, blame,
and the ``RunResult`` a user holds.

Everything here reads a finished run (the setup, the method that ran it, the
engine's result of the last pass and how the slow-down was solved) and runs
nothing: the tables are built a column at a time, the summary from the
analysis layer's pieces, in one place.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.analysis import blame, domains
from simulator.analysis.critical_path import critical_path
from simulator.analysis.summary import memory_timeline, moe_keys, summarize
from simulator.base.ir import Program
from simulator.collectives import expert_exchange
from simulator.compute import stragglers, throttle
from simulator.config.scenario import Scenario
from simulator.engine.call_log import CallLog, shared_categories
from simulator.engine.folded import Folded
from simulator.engine.records import (
    COLLECTIVE_COLUMNS,
    SPAN_COLUMNS,
    SPAN_DTYPES,
    SPAN_TEXT,
    SimulationError,
)
from simulator.runner import host_waits, jobs, symmetry
from simulator.runner.setup import Setup


@dataclass
class RunResult:
    """Everything one run produced; ``spans`` and ``comms`` are DataFrames."""

    scenario: Scenario
    summary: dict[str, Any]
    spans: pd.DataFrame
    comms: pd.DataFrame
    placement: list[str]
    node_of_rank: list[int]
    memory: dict[int, tuple[Any, Any]] = field(default_factory=dict)  # rank -> (times, bytes)
    extra: dict[str, Any] = field(default_factory=dict)
    _context: tuple | None = field(default=None, repr=False)  # (groups, fabric, lowering)
    folded: Folded | None = None  # set when ``spans`` hold one rank per class only

    def spans_of(self, ranks: list[int]) -> pd.DataFrame:
        """The spans of ``ranks``, expanded from their classes in a folded run."""
        if self.folded is None:
            return self.spans[self.spans["rank"].isin(ranks)]
        return self.folded.ranks(self.spans, ranks, self.node_of_rank)

    def traffic(self, servers: list[int] | None = None) -> dict:
        """Link traffic per server over time: (server, counter) -> (times, GB/s);
        with ``servers``, those servers' only."""
        from simulator.analysis.traffic import server_traffic

        if self._context is None:
            return {}
        groups, fabric, lowering = self._context
        return server_traffic(self.comms, groups, self.placement, fabric, lowering, servers)

    def gantt(self, path: str | None = None, **options: Any):
        """The Gantt chart of this run: written to ``path`` (png, pdf or svg) and
        returned as a matplotlib Figure (a notebook shows it); ``options`` as for
        ``simulator.outputs.gantt.figure`` (ranks, start, end, streams, group, breakdown)."""
        from simulator.outputs.gantt import figure
        from simulator.outputs.style import save

        spans, classes = self.spans, None
        options.setdefault("end", self.summary["iteration_time_s"])  # (background runs on)
        if self.folded is not None:
            if options.get("ranks"):
                spans = self.spans_of(options["ranks"])
            else:
                classes = self.folded.classes()
        fig = figure(spans, self.scenario.name, classes=classes, **options)
        if path is not None:
            save(fig, path)
        return fig

    def critical_path(self):
        """The chain of spans that sets the iteration time (a DataFrame; the run
        finds it once, for the summary)."""
        if "critical_path" not in self.extra:
            self.extra["critical_path"] = critical_path(self.spans)
        return self.extra["critical_path"]

    def ranks(self):
        """Per-rank time breakdown (compute, exposed communication, waiting,
        bubble, idle): one row per rank."""
        from simulator.analysis.timeline import rank_table

        table = rank_table(self.spans, self.summary["iteration_time_s"])
        return table if self.folded is None else self.folded.expand_rows(table)

    def streams(self):
        """Per (rank, stream): busy, overlapped, exposed and waiting time."""
        from simulator.analysis.timeline import stream_table

        table = stream_table(self.spans)
        return table if self.folded is None else self.folded.expand_rows(table)

    def memory_plot(self, path: str) -> None:
        """Write memory over time, one line per pipeline stage, to ``path``."""
        from simulator.outputs.memory_plot import plot_memory

        stages = self.extra.get("stage", {})
        lines = {f"stage {stages.get(r, 0)} (rank {r})": v for r, v in self.memory.items()}
        plot_memory(lines, path, self.scenario.gpu.memory_bytes, self.scenario.name)


EXPAND_SPANS = 1_000_000  # a folded run's spans are copied to every rank up to this many


SPAN_CHUNK = 200_000  # span tuples turned into columns at a time


def span_table(result, nodes: list[int]) -> pd.DataFrame:
    """The engine's span tuples (and its replayed steps' spans) as a table: columns
    filled from the end of its list a chunk at a time, each chunk's tuples freed
    once copied (the tuples take three times the table's memory); text columns as
    categories (in text order)."""
    tuples = result.spans
    replayed = result.replayed() if result.replayed is not None else {}
    count = len(tuples)
    total = count + len(replayed.get("start", ()))
    columns = {name: np.empty(count if name in SPAN_TEXT else total, dtype)
               for name, dtype in zip(SPAN_COLUMNS, SPAN_DTYPES, strict=True)}
    for name, column in columns.items():
        if replayed and name not in SPAN_TEXT:
            column[count:] = replayed[name]
    while tuples:
        part = tuples[-SPAN_CHUNK:]
        at = len(tuples) - len(part)
        for column, values in zip(columns.values(), zip(*part, strict=True), strict=True):
            column[at:at + len(part)] = values
        del tuples[-SPAN_CHUNK:], part
    data: dict = columns
    for name in SPAN_TEXT:
        data[name] = _categories(pd.factorize(data[name]), replayed.get(name))
    order = np.lexsort((data["stream"].codes, data["end"], data["start"], data["rank"]))
    for name in SPAN_COLUMNS:  # sorted by rank, start, end, stream; a column at a time
        data[name] = data[name][order]
    data = {"rank": data["rank"], "node": np.asarray(nodes)[data["rank"]], **data}
    return pd.DataFrame(data, copy=False)


def _categories(*parts: tuple[np.ndarray, np.ndarray] | None) -> pd.Categorical:
    """One categorical column from parts given as (codes, their categories), its
    categories sorted (as ``pd.Categorical`` sorts text)."""
    parts = tuple(p for p in parts if p is not None)
    names, where = shared_categories(*(cats for _, cats in parts))
    codes = [w[c] for (c, _), w in zip(parts, where, strict=True)]
    return pd.Categorical.from_codes(np.concatenate(codes), categories=names.to_numpy())


def _stage_memory(program: Program, result, ranks) -> tuple[dict, dict]:
    """Memory timeline of the first simulated rank of each stage, and its stage."""
    firsts: dict[int, int] = {}
    for rank in ranks:
        firsts.setdefault(program.stage[rank] if program.stage else 0, rank)
    memory = {r: memory_timeline(program.static_memory[r], result.memory_events[r])
              for r in sorted(firsts.values())}
    return memory, {r: s for s, r in firsts.items()}


def _model_keys(notes: dict, spans: pd.DataFrame, rank: int) -> dict:
    """The summary keys of the model's program (micro-batches, parameters,
    buckets, hardware FLOPs) and its MoE keys, all together (none of a run of
    several training jobs: each job's summary has its own)."""
    return {**{k: v for k, v in notes.items() if not k.startswith("_")},
            **moe_keys(notes, spans, rank)}


def _comms(log: CallLog) -> pd.DataFrame:
    """The communication log: every collective call and message, with the
    parallelism dimension of its group and how long its first member waited."""
    comms = log.frame(COLLECTIVE_COLUMNS)
    groups = comms["group"].astype("category")  # few distinct groups: map those
    dimension = groups.map({g: str(g).split(".")[0] for g in groups.cat.categories})
    comms.insert(0, "dimension", dimension.astype("category"))
    comms["wait"] = comms["start"] - comms["first_arrival"]
    if comms["bytes"].dtype == object:  # a count past int64 (a vast model): as floats
        comms["bytes"] = comms["bytes"].astype(float)
    return comms


def assemble(setup: Setup, method: symmetry.Method, result, spans: pd.DataFrame,
             slowdown, alone: dict, wall: float) -> RunResult:
    """The RunResult of a finished run: ``result`` and ``spans`` are the engine's
    last pass and its span table, ``slowdown`` how the NCCL-beside-compute
    slow-down was solved (``contention.Contention``), ``alone`` each job's time
    alone, ``wall`` when the run started."""
    program, fabric = setup.program, setup.fabrics.fabric
    comms = _comms(result.collectives)
    trained = spans  # the training jobs' spans (background traffic's ranks come last)
    if setup.computing < program.ranks:
        trained = spans[spans["rank"].to_numpy() < setup.computing].reset_index(drop=True)
    path = slowdown.path if slowdown.path is not None and trained is spans else \
        critical_path(trained)
    summary = _summary(setup, result, spans, trained, comms, path, alone)
    spans = host_waits.attach(spans, program, setup.durations)  # (before copies)
    spans, folded = _expanded(setup, result, spans)
    if not math.isfinite(summary["iteration_time_s"]):  # never a result to keep
        raise SimulationError(f"the iteration time came out as {summary['iteration_time_s']}")
    summary.update(**_how(setup, method, result, slowdown, trained, summary["critical_rank"]),
                   wall_s=time.perf_counter() - wall)
    memory, stages = _stage_memory(program, result, result.ranks)
    return RunResult(setup.scenario, summary, spans, comms, list(setup.placement),
                     setup.nodes, memory, {"stage": stages, "stage_of": program.stage,
                                           "critical_path": path},
                     (program.groups, fabric, setup.fabrics.lowering), folded)


def _summary(setup: Setup, result, spans: pd.DataFrame, trained: pd.DataFrame,
             comms: pd.DataFrame, path: pd.DataFrame, alone: dict) -> dict:
    """The summary's figures of the timeline (``analysis.summary``), each job's
    (several jobs) and blame's causes."""
    scenario, program, placed, gpu = setup.scenario, setup.program, setup.placed, setup.scenario.gpu
    ranks = result.ranks
    peak, lowp = scenario.training.peaks(gpu)[0], jobs.shared_lowp(placed, gpu)
    summary = summarize(trained, jobs.summary_program(program, placed),
                        result.memory_events, peak, gpu.memory_bytes,
                        [r for r in ranks if r < setup.computing], path,
                        scenario.machine.cluster.host_memory, lowp)
    if jobs.listed(scenario):
        summary["jobs"] = jobs.summaries(spans, comms, program, placed, result.memory_events,
                                         ranks, gpu, alone)
    context = blame.Context(program.groups, setup.placement, setup.fabrics,
                            blame.work_of(setup.speed, setup.clocks),
                            jobs.job_of_rank(placed))
    summary["blame"] = [c.row() for c in blame.causes(trained, comms, path, context)[:blame.TOP]]
    return summary


def _expanded(setup: Setup, result, spans: pd.DataFrame) -> tuple[pd.DataFrame, Folded | None]:
    """Every rank's spans where a run by symmetry simulated fewer (up to
    ``EXPAND_SPANS`` in all); beyond, one timeline per class and the expansion
    kept for any rank asked for."""
    if result.expand is None:
        return spans, None
    if len(spans) * setup.program.ranks <= EXPAND_SPANS * len(result.ranks):
        return result.expand(spans, nodes=setup.nodes), None
    return spans, result.expand


def _host_share(stall: float, kernels: float) -> str:
    """The share of the critical rank's kernel time spent waiting for launches."""
    if stall <= 0 or kernels <= 0:
        return ""
    return f"; host-bound: {100 * stall / kernels:.1f} % of the critical rank's kernel time"


def _token_exchange(ops) -> dict:
    """The summary's ``token_exchange`` where the rank's program exchanges tokens
    (what times them: ``collectives.expert_exchange.describe``), else nothing."""
    line = expert_exchange.describe({op.collective for op in ops if op.collective})
    return {"token_exchange": line} if line else {}


def _how(setup: Setup, method: symmetry.Method, result, slowdown, trained: pd.DataFrame,
         critical: int) -> dict:
    """The summary's keys on how the run was made: what was simulated, the compute
    model, the slow-down, the model's notes, the GPUs' speeds, the fabric, events."""
    program, placed, fabric = setup.program, setup.placed, setup.fabrics.fabric
    ranks, durations = result.ranks, setup.durations
    note, exact = symmetry.describe(method, len(ranks), program.ranks, result.inexact)
    kernels = float(durations(critical).sum())  # (computed for every simulated program)
    stall = durations.host_stall(critical)
    faults = fabric.graph.graph.get("faults")
    return dict(simulated_ranks=len(ranks), simulation=note, simulation_exact=exact,
                compute_model=jobs.compute_model(
                    placed, setup.model, program.ops[critical],
                    setup.scenario.machine.cluster.host_dispatch) + _host_share(stall, kernels),
                **_token_exchange(program.ops[critical]),
                host_stall_s=stall,
                overlap_slowdown=slowdown.note(),
                overlap_slowdown_s=(slowdown.added_s or {}).get(critical, 0.0),
                **_model_keys(jobs.lead_notes(placed),
                              trained, critical),
                **stragglers.summary(setup.speed), **throttle.summary(setup.throttled),
                **({"faults": faults} if faults else {}),
                **domains.summary_keys(program.groups,
                                       [fabric.node_of(g) for g in setup.placement],
                                       fabric.graph.graph),
                events=slowdown.events, network_recomputes=result.network_recomputes,
                calls_alone=result.calls_alone, steps_replayed=result.steps_replayed,
                pipeline_steps=sum(len(program.steps[r]) for r in ranks
                                   if r < len(program.steps)))
