"""Run one scenario: build fabric and program, simulate, summarise.

This is the composition layer: the only place (with the scenario loader and
the CLI) that joins ``topologies``, ``workloads`` and the engine.
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from simulator.analysis.summary import memory_timeline, summarize
from simulator.base.ir import Program
from simulator.collectives.tuner import Collectives
from simulator.compute.model import ComputeModel, jitter_factors
from simulator.config.scenario import Scenario
from simulator.engine.core import COLLECTIVE_COLUMNS, SPAN_COLUMNS, Engine
from simulator.network.fabric import Fabric
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

    def traffic(self) -> dict:
        """Link traffic per server over time: (server, counter) -> (times, GB/s)."""
        from simulator.analysis.traffic import server_traffic

        if self._context is None:
            return {}
        groups, fabric, lowering = self._context
        return server_traffic(self.comms, groups, self.placement, fabric, lowering)

    def gantt(self, path: str | None = None, **options: Any):
        """The Gantt chart of this run: written to ``path`` (png, pdf or svg) and
        returned as a matplotlib Figure (a notebook shows it); ``options`` as for
        ``simulator.outputs.gantt.figure`` (ranks, start, end, streams, group, breakdown)."""
        from simulator.outputs.gantt import figure, save

        fig = figure(self.spans, self.scenario.name, **options)
        if path is not None:
            save(fig, path)
        return fig

    def critical_path(self):
        """The chain of spans that sets the iteration time (a DataFrame)."""
        from simulator.analysis.critical_path import critical_path

        return critical_path(self.spans)

    def ranks(self):
        """Per-rank time breakdown (compute, exposed communication, waiting,
        bubble, idle): one row per rank."""
        from simulator.analysis.timeline import rank_table

        return rank_table(self.spans, self.summary["iteration_time_s"])

    def streams(self):
        """Per (rank, stream): busy, overlapped, exposed and waiting time."""
        from simulator.analysis.timeline import stream_table

        return stream_table(self.spans)

    def memory_plot(self, path: str) -> None:
        """Write memory over time, one line per pipeline stage, to ``path``."""
        from simulator.outputs.memory_plot import plot_memory

        stages = self.extra.get("stage", {})
        lines = {f"stage {stages.get(r, 0)} (rank {r})": v for r, v in self.memory.items()}
        plot_memory(lines, path, self.scenario.gpu.memory_bytes, self.scenario.name)


def compute_model(scenario: Scenario) -> ComputeModel:
    return ComputeModel.of(scenario.gpu, scenario.training.precision)


def _durations(program: Program, model: ComputeModel, seed: int, jitter: float):
    """A function rank -> compute duration of each of its ops (shared when no jitter)."""
    base: dict[int, Any] = {}

    def durations(rank: int):
        ops = program.ops[rank]
        if id(ops) not in base:
            base[id(ops)] = model.durations(ops)
        values = base[id(ops)]
        return values * jitter_factors(seed, rank, len(ops), jitter) if jitter else values
    return durations


def exclusive_dimensions(program: Program, fabric: Fabric, placement: list[str]) -> frozenset:
    """``{"tp"}`` when no other traffic can share tensor-parallel links: no other
    group has two members in one server, and traffic is not routed through other
    GPUs' NVLink (rail-optimized PXN)."""
    if fabric.graph.graph.get("rail_aligned"):
        return frozenset()
    for dim, groups in program.groups.items():
        if dim == "tp":
            continue
        for group in groups:
            servers = [fabric.node_of(placement[r]) for r in group]
            if len(set(servers)) < len(servers):
                return frozenset()
    return frozenset({"tp"})


def replicate(spans: pd.DataFrame, represents: dict[int, tuple[int, ...]],
              nodes: list[int], mate_calls: dict[int, dict[int, int]] | None = None
              ) -> pd.DataFrame:
    """Sorted representatives' spans, copied for each rank they represent, in rank
    order (so the result is sorted too, without sorting it again). ``mate_calls``
    maps a mate's copied ``call`` (the representative's log row) to its own."""
    by_rank = {}
    starts = np.searchsorted(spans["rank"].to_numpy(), list(represents), side="left")
    ends = np.searchsorted(spans["rank"].to_numpy(), list(represents), side="right")
    for rep, a, b in zip(represents, starts, ends, strict=True):
        for rank in (rep, *represents[rep]):
            by_rank[rank] = (rep, a, b)
    order = sorted(by_rank)
    blocks = [by_rank[rank][1:] for rank in order]
    lengths = [b - a for a, b in blocks]

    def copied(values: np.ndarray) -> np.ndarray:  # block copies: much faster than a take
        return np.concatenate([values[a:b] for a, b in blocks])

    columns = {}
    for name, column in spans.items():
        if name == "rank":
            columns[name] = np.repeat(np.asarray(order, dtype=column.dtype), lengths)
        elif name == "node":
            columns[name] = np.repeat(np.asarray(nodes)[order].astype(column.dtype), lengths)
        elif name == "call":
            columns[name] = _mates_own_calls(copied(column.to_numpy()), order, lengths,
                                             mate_calls or {})
        elif isinstance(column.dtype, pd.CategoricalDtype):
            columns[name] = pd.Categorical.from_codes(copied(column.cat.codes.to_numpy()),
                                                      dtype=column.dtype)
        else:
            columns[name] = copied(column.to_numpy())
    return pd.DataFrame(columns, copy=False)


def _mates_own_calls(calls: np.ndarray, order: list[int], lengths: list[int],
                     mate_calls: dict[int, dict[int, int]]) -> np.ndarray:
    """Replace, in each mate's block of ``calls``, the representative's rows by the
    mate's own (its own group's call or message)."""
    position = 0
    for rank, length in zip(order, lengths, strict=True):
        remap = mate_calls.get(rank)
        if remap:
            block = calls[position:position + length]
            keys = np.fromiter(remap, dtype=np.int64, count=len(remap))
            values = np.fromiter(remap.values(), dtype=np.int64, count=len(remap))
            sort = np.argsort(keys)
            keys, values = keys[sort], values[sort]
            at = np.minimum(np.searchsorted(keys, block), len(keys) - 1)
            hit = keys[at] == block
            block[hit] = values[at[hit]]
        position += length
    return calls


def sharing(scenario: Scenario, program: Program) -> tuple[list[int] | None, dict | None]:
    """(simulated ranks, ranks each represents): all ranks, one per pipeline stage
    (folding), or one per tensor-parallel group (gangs)."""
    if scenario.fold_ranks:
        return list(program.representatives), None
    if scenario.gangs:
        represents = {g[0]: g[1:] for g in program.groups["tp"]}
        return sorted(represents), represents
    return None, None


TEXT_COLUMNS = ("stream", "kind", "name", "phase")  # few distinct values: categoricals


def _spans(result, nodes: list[int]) -> pd.DataFrame:
    spans = pd.DataFrame(result.spans, columns=list(SPAN_COLUMNS))
    for column in TEXT_COLUMNS:
        spans[column] = spans[column].astype("category")
    spans.insert(1, "node", np.asarray(nodes)[spans["rank"].to_numpy()])
    return spans.sort_values(["rank", "start", "end", "stream"], kind="stable",
                             ignore_index=True)


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
        return _run(scenario, batch_compute)


def _run(scenario: Scenario, batch_compute: bool) -> RunResult:
    wall = time.perf_counter()
    graph = scenario.machine.build_graph()
    fabric = Fabric(graph)
    program = build_program(scenario.model, scenario.training, scenario.parallel)
    placement = graph.graph["gpus"][: program.ranks]
    durations = _durations(program, compute_model(scenario), scenario.seed,
                           scenario.compute_jitter)
    lowering = Collectives(fabric, scenario.algorithm, scenario.protocol,
                           lockstep=scenario.step_model == "lockstep")
    simulated, represents = sharing(scenario, program)
    exclusive = exclusive_dimensions(program, fabric, placement) if represents else frozenset()
    result = Engine(program, placement, durations, fabric, lowering,
                    batch_compute=batch_compute, simulated=simulated, represents=represents,
                    layer_spans=scenario.layer_spans, exclusive=exclusive).run()
    nodes = [fabric.node_of(g) for g in placement]
    spans = _spans(result, nodes)
    gpu = scenario.gpu
    summary = summarize(spans, program, result.memory_events,
                        gpu.peak(scenario.training.precision), gpu.memory_bytes, simulated)
    if represents:  # mates ran in lockstep with their representative: same spans
        spans = replicate(spans, represents, nodes, result.mate_calls)
    ranks = simulated if simulated is not None else range(program.ranks)
    summary.update(simulated_ranks=len(ranks), **program.notes, events=result.events,
                   network_recomputes=result.network_recomputes,
                   wall_s=time.perf_counter() - wall)
    memory, stages = _stage_memory(program, result, ranks)
    return RunResult(scenario, summary, spans, _comms(result.collectives), list(placement),
                     nodes, memory, {"stage": stages}, (program.groups, fabric, lowering))


def _comms(rows: list[tuple]) -> pd.DataFrame:
    """The communication log: every collective call and message, with the
    parallelism dimension of its group and how long its first member waited."""
    comms = pd.DataFrame(rows, columns=list(COLLECTIVE_COLUMNS))
    groups = comms["group"].astype("category")  # few distinct groups: map those
    dimension = groups.map({g: str(g).split(".")[0] for g in groups.cat.categories})
    comms.insert(0, "dimension", dimension.astype("category"))
    comms["wait"] = comms["start"] - comms["first_arrival"]
    return comms
