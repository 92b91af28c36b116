"""Run one scenario: build fabric and program, simulate, summarise.

This is the composition layer: the only place (with the scenario loader and
the CLI) that joins ``topologies``, ``workloads`` and the engine.
"""

from __future__ import annotations

import gc
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.analysis import blame, domains
from simulator.analysis.blame import TOP
from simulator.analysis.critical_path import critical_path
from simulator.analysis.summary import memory_timeline, moe_keys, summarize
from simulator.base import footprint
from simulator.base.ir import HOST_KERNELS, Program
from simulator.compute import stragglers, throttle
from simulator.compute.host import host_bound
from simulator.compute.model import ComputeModel
from simulator.config.scenario import Scenario
from simulator.engine.assemble import engine_class
from simulator.engine.call_log import CallLog, shared_categories
from simulator.engine.folded import Folded
from simulator.engine.folding import first_of_each_program
from simulator.engine.passes import expand
from simulator.engine.records import (
    COLLECTIVE_COLUMNS,
    SPAN_COLUMNS,
    SPAN_DTYPES,
    SPAN_TEXT,
    NotInLockstep,
    SimulationError,
)
from simulator.experiments import contention, jobs, symmetry
from workloads.program import build_program


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
        if self.scenario.jobs:  # background traffic runs on past the training jobs
            options.setdefault("end", self.summary["iteration_time_s"])
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


def compute_model(scenario: Scenario) -> ComputeModel:
    return ComputeModel.for_training(scenario.gpu, scenario.training,
                                     scenario.parallel.framework.value,
                                     scenario.machine.cluster.host_rates())


def _durations(program: Program, model: ComputeModel, per_launch: float = 0.0,
               speed=None):
    """A function rank -> compute duration of each of its ops without jitter
    (shared by the ranks of one program and speed), kernels slowed by the rank's
    GPU's ``speed`` factor (``compute.stragglers``; None: all 1), host-bound
    kernels stretched (``compute.host``: ``per_launch`` seconds of host time per
    kernel, which a slow GPU does not change)."""
    base: dict[tuple, Any] = {}
    stalls: dict[tuple, float] = {}

    def key(rank: int) -> tuple:
        return id(program.ops[rank]), 1.0 if speed is None else float(speed[rank])

    def durations(rank: int):
        k = key(rank)
        if k not in base:
            ops = program.ops[rank]
            steps = program.steps[rank] if program.steps else ()
            kernels = model.durations(ops)
            if k[1] != 1.0:  # a slow GPU's kernels; its copies and host work keep their pace
                kernels *= np.where([op.kernel in HOST_KERNELS for op in ops], 1.0, k[1])
            base[k] = host_bound(ops, steps, kernels, per_launch)
            stalls[k] = float(base[k].sum() - kernels.sum())
        return base[k]

    durations.host_stall = lambda rank: stalls.get(key(rank), 0.0)
    return durations


EXPAND_SPANS = 1_000_000  # a folded run's spans are copied to every rank up to this many


SPAN_CHUNK = 200_000  # span tuples turned into columns at a time


def span_table(result, nodes: list[int]) -> pd.DataFrame:
    """The engine's span tuples (and its replayed steps' spans) as a table: columns
    filled from the end of its list a chunk at a time, each chunk's tuples freed
    once copied (the tuples take three times the table's memory); text columns as
    categories (in text order)."""
    tuples = result.spans
    replayed = expand(result.span_runs) if result.span_runs else {}  # engine.passes
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


@contextmanager
def _collector_paused():
    """Pause Python's cyclic garbage collector (restoring its state after).

    A large run holds millions of span tuples; every full collection would scan
    them all to find nothing (spans hold no cycles), which cost a fifth of a
    1024-GPU run. Reference counting still frees everything as usual; cycles
    made meanwhile (SimPy's processes) are collected once the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def run(scenario: Scenario, *, batch_compute: bool = True) -> RunResult:
    """Simulate one training iteration of ``scenario``.

    ``batch_compute=False`` makes the engine spend one event per kernel; the
    trace is the same (a test checks it), only slower.
    """
    with _collector_paused():
        if scenario.jobs:
            return jobs.run_all(scenario, lambda s, reach, alone=None: _run(
                s, batch_compute, reach, alone or {}))
        return _run(scenario, batch_compute)


def _simulated_ranks(method: symmetry.Method, program: Program) -> list[int] | None:
    """The ranks ``method`` runs (None: every rank): a class representative each,
    or with rank folding the first rank of each program."""
    if "folding" in method.plugins:
        return first_of_each_program(program)
    represents = method.options.get("represents")
    return list(represents) if represents else None


def _run(scenario: Scenario, batch_compute: bool, background_s: float = 0.0,
         alone: dict | None = None) -> RunResult:
    wall = time.perf_counter()
    placed: list = []  # each job's ranks, with jobs
    if scenario.jobs:
        program, placed = jobs.programs(scenario, background_s)
    else:
        program = build_program(scenario.model, scenario.training, scenario.parallel,
                                scenario.seed)
    footprint.check_fabric(scenario.gpus, "cluster.nodes", scenario.machine.nodes)
    if symmetry.why_full(scenario, program, batch_compute):  # every rank will run
        footprint.check_run(program, None)
    fabrics = scenario.fabric_states()  # the fabric in each state, with its lowering
    fabric, lowering, changes, gpus = (fabrics.fabric, fabrics.lowering, fabrics.changes,
                                       fabrics.gpus)
    placement = (jobs.placement(placed, gpus, scenario.machine.nodes) if placed
                 else gpus[: program.ranks])
    model = compute_model(scenario)
    nodes = [fabric.tray_of(g) for g in placement]  # as cluster.nodes counts servers
    machine = scenario.machine
    computing = jobs.training_ranks(placed) if placed else program.ranks  # (not background)
    index = {g: k for k, g in enumerate(gpus)} if placed else {}
    gpu_of = [index[g] for g in placement] if placed else None
    speed = stragglers.factors(machine.slow, machine.gpu_speed_spread, scenario.seed,
                               nodes[:computing], gpu_of and gpu_of[:computing])
    if speed is not None:
        speed = np.concatenate([speed, np.ones(program.ranks - computing)])
    throttled = throttle.schedules(machine.throttle, nodes[:computing],
                                   gpu_of and gpu_of[:computing])
    clocks = {r: throttle.Clock(s) for r, s in throttled.items()} or None
    durations = (jobs.durations(placed, program, scenario, speed, _durations) if placed else
                 _durations(program, model, scenario.training.host_launch, speed))
    pace = symmetry.pace_of(speed, throttled, program.ranks)
    method = symmetry.choose(scenario, program, placement, fabric, batch_compute, pace,
                             clocked=clocks is not None, fabric_changes=bool(changes))
    if not method.full_because:  # (every rank's ops were checked above)
        footprint.check_run(program, _simulated_ranks(method, program))
    elif pace is not None:  # every rank for its GPUs' speeds: not checked above
        footprint.check_run(program, None)
    jittered: dict = {}  # the method's durations (a class's slowest member's: per method)

    def work(rank: int):
        if jittered.get("method") is not method:
            jittered.update(method=method, durations=method.durations(
                program, durations, scenario.seed, scenario.compute_jitter))
        return jittered["durations"](rank)

    def one_run(durations_now):
        nonlocal method
        while True:
            try:
                return engine_class(*method.plugins)(program, placement, durations_now,
                                                     fabric, lowering, clocks=clocks,
                                                     changes=changes, **method.options).run()
            except NotInLockstep as diverged:  # a class's ranks diverged: split, run again
                gc.collect()  # the stopped run's processes (cycles) while the collector is off
                method = symmetry.refine(scenario, method, diverged, batch_compute,
                                         program.groups)

    result, spans, slowdown = contention.solve(
        one_run, lambda r: span_table(r, nodes), program, work,
        scenario.gpu.overlap_slowdown, scenario.contention_passes,
        jobs.lengths(placed) if placed else None)
    gpu = scenario.gpu
    ranks = result.ranks
    comms = _comms(result.collectives)
    trained = spans  # the training jobs' spans (background traffic's ranks come last)
    if placed:
        trained = spans[spans["rank"].to_numpy() < computing].reset_index(drop=True)
    path = (slowdown.path if slowdown.path is not None and not placed
            else critical_path(trained))
    peak, lowp = scenario.training.peaks(gpu)
    summary = summarize(trained, jobs.summary_program(program, placed) if placed else program,
                        result.memory_events, peak, gpu.memory_bytes,
                        [r for r in ranks if r < computing], path,
                        scenario.machine.cluster.host_memory, lowp)
    if placed:
        summary["jobs"] = jobs.summaries(spans, comms, program, placed, result.memory_events,
                                         ranks, gpu, alone or {})
    context = blame.Context(program.groups, placement, fabrics, blame.work_of(speed, clocks),
                            jobs.job_of_rank(placed) if len(placed) > 1 else None)
    summary["blame"] = [c.row() for c in blame.causes(trained, comms, path, context)[:TOP]]
    folded = None
    if result.expand is not None:
        if len(spans) * program.ranks <= EXPAND_SPANS * len(ranks):
            spans = result.expand(spans, nodes=nodes)
        else:  # keep one timeline per class; any rank's is expanded when asked for
            folded = result.expand
    if not math.isfinite(summary["iteration_time_s"]):  # never a result to keep
        raise SimulationError(f"the iteration time came out as {summary['iteration_time_s']}")
    note, exact = symmetry.describe(method, len(ranks), program.ranks, result.inexact)
    durations(summary["critical_rank"])  # (computed for every simulated program)
    summary.update(simulated_ranks=len(ranks), simulation=note, simulation_exact=exact,
                   compute_model=model.describe(program.ops[summary["critical_rank"]]),
                   host_stall_s=durations.host_stall(summary["critical_rank"]),
                   overlap_slowdown=slowdown.note(),
                   overlap_slowdown_s=(slowdown.added_s or {}).get(summary["critical_rank"], 0.0),
                   **_model_keys(jobs.lead_notes(placed) if placed else program.notes,
                                 trained, summary["critical_rank"]),
                   **stragglers.summary(speed), **throttle.summary(throttled),
                   **({"faults": fabric.graph.graph["faults"]} if fabric.graph.graph.get("faults")
                      else {}),
                   **domains.summary_keys(program.groups, [fabric.node_of(g) for g in placement],
                                          fabric.graph.graph),
                   events=slowdown.events,
                   network_recomputes=result.network_recomputes,
                   calls_alone=result.calls_alone, steps_replayed=result.steps_replayed,
                   pipeline_steps=sum(len(program.steps[r]) for r in ranks
                                      if r < len(program.steps)),
                   wall_s=time.perf_counter() - wall)
    memory, stages = _stage_memory(program, result, ranks)
    return RunResult(scenario, summary, spans, comms, list(placement),
                     nodes, memory, {"stage": stages, "stage_of": program.stage,
                                     "critical_path": path},
                     (program.groups, fabric, lowering), folded)


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
