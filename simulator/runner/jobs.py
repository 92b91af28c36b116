"""A run's set of jobs on one fabric (``Scenario.jobs``: the ``jobs`` section's,
or a plain scenario's one training job): their programs merged into one run,
where each runs, each job's summary, and the slow-down of each against
running alone. A set of one job is the plain run, with nothing merged.

Every training job is also run alone, on the same nodes of the same cluster
(faults, slow GPUs and all), and its time there is the reference its
slow-down is measured against: what sharing the fabric cost it. Background
traffic without a ``duration`` runs as long as the training jobs: first for
twice the longest alone time, and again for twice as long while a training
job outlasts it (so no job ever runs past the traffic it shares the fabric
with).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from simulator.analysis.critical_path import critical_path
from simulator.analysis.summary import moe_keys, summarize
from simulator.base import footprint
from simulator.base.ir import BG_STREAM, Program
from simulator.compute.host_costs import HostPlan
from simulator.compute.model import ComputeModel
from workloads.background import PACING, background_program, messages
from workloads.jobs import Placed, leading, merge, rank_order
from workloads.program import build_program

BACKGROUND_REACH = 2.0  # background traffic lasts this many times the longest alone run
MAX_LONGER = 4  # runs again with longer background traffic at most this many times


def programs(scenario, background_s: float) -> tuple[Program, list[Placed]]:
    """The merged program of ``scenario.jobs`` and each job's block of ranks;
    background traffic without a duration lasts ``background_s``."""
    per_node = scenario.gpus // max(1, scenario.machine.nodes)
    placed, first = [], 0
    for job in rank_order(scenario.jobs):
        if job.workload is not None:  # a program read from Chakra traces
            program = job.workload.trace.program
        elif job.background is None:
            program = build_program(job.model, job.training, job.parallel, scenario.seed)
        else:
            lasting = job.background.duration or background_s
            footprint.check_ops(2 * messages(job.background, lasting), f"jobs.{job.name}.message",
                                f"{messages(job.background, lasting):,} messages per GPU over "
                                f"{lasting * 1e3:.3g} ms", "give a larger message or a shorter "
                                "duration")
            program = background_program(job.background, per_node, len(job.nodes), lasting)
        placed.append(Placed(job, first, program))
        first += program.ranks
    return merge([p.program for p in placed]), placed


def placement(placed: Sequence[Placed], gpus: Sequence[str],
              tray_of: Callable[[str], int]) -> list[str]:
    """Each merged rank's GPU: a job's ranks fill its nodes in order (each node's
    GPUs as ``gpus`` lists them; ``tray_of``: a GPU's node as ``cluster.nodes``
    counts them)."""
    by_node: dict[int, list[str]] = {}
    for gpu in gpus:
        by_node.setdefault(tray_of(gpu), []).append(gpu)
    return [g for p in placed for node in p.job.nodes for g in by_node.get(node, ())]


def listed(scenario) -> bool:
    """Whether the summary lists each job (a ``jobs`` section), as well as the run."""
    return bool(scenario.job_section)


def durations(placed: Sequence[Placed], program: Program, scenario, speed,
              make: Callable) -> Callable:
    """A function rank -> its ops' durations: a training job's timed by the kernel
    table for its precision (``make``: the runner's ``_durations``), background
    pacing ops by their period."""
    per_job = []
    for p in placed:
        if p.job.workload is not None and p.job.workload.recorded:
            per_job.append(_recorded(p.job.workload.trace.durations, p.first))
        elif p.job.background is None:
            model = ComputeModel.for_training(scenario.gpu, p.job.training,
                                              p.job.parallel.framework.value,
                                              scenario.machine.cluster.host_rates())
            per_job.append(make(program, model, HostPlan.of(
                p.job.training, p.job.parallel.framework.value,
                scenario.machine.cluster.host_dispatch),
                                 speed))
        else:
            per_job.append(_pacing(program, p.job.background.period))
    firsts = np.array([p.first for p in placed])

    def of(rank: int) -> Callable:
        return per_job[int(np.searchsorted(firsts, rank, side="right")) - 1]

    def run(rank: int) -> np.ndarray:
        return of(rank)(rank)
    run.host_stall = lambda rank: of(rank).host_stall(rank)
    run.host_waits = lambda rank: of(rank).host_waits(rank)
    return run


def _recorded(durations: Sequence[np.ndarray], first: int) -> Callable:
    """Each rank's compute durations as its trace recorded them (no host stall:
    the trace's times are the GPU's own)."""
    def of(rank: int) -> np.ndarray:
        return durations[rank - first]
    of.host_stall = lambda rank: 0.0
    of.host_waits = lambda rank: None
    return of


def _pacing(program: Program, period: float) -> Callable:
    cache: dict[int, np.ndarray] = {}

    def durations(rank: int) -> np.ndarray:
        ops = program.ops[rank]
        if id(ops) not in cache:
            cache[id(ops)] = np.array([period if op.name == PACING else 0.0 for op in ops])
        return cache[id(ops)]
    durations.host_stall = lambda rank: 0.0
    durations.host_waits = lambda rank: None
    return durations


def lengths(placed: Sequence[Placed]) -> Callable[[pd.DataFrame], np.ndarray]:
    """Each training job's iteration time in a run's spans (what the overlap
    slow-down's passes must settle: background traffic runs on past them)."""
    firsts = [p.first for p in placed if p.job.background is None]
    bounds = [*firsts[1:], training_ranks(placed)]

    def of(spans: pd.DataFrame) -> np.ndarray:
        ranks, ends = spans["rank"].to_numpy(), spans["end"].to_numpy()
        return np.array([ends[(ranks >= a) & (ranks < b)].max(initial=0.0)
                         for a, b in zip(firsts, bounds, strict=True)])
    return of


def lead_notes(placed: Sequence[Placed]) -> dict:
    """The notes the run's summary speaks for: its only training job's (beside
    background traffic), none when several train (each job's summary has its own)."""
    training = [p for p in placed if p.job.background is None]
    return dict(training[0].program.notes) if len(training) == 1 else {}


def compute_model(placed: Sequence[Placed], model: ComputeModel, ops,
                  dispatch: float = 1.0) -> str:
    """The summary's ``compute_model``: what times the kernels of ``ops`` (the
    critical rank's program), or the traces' recorded durations where every
    training job replays them (then no compute model times a kernel);
    ``dispatch``: the cluster's ``host_dispatch``."""
    if all(p.job.workload is not None and p.job.workload.recorded
           for p in placed if p.job.background is None):
        return "recorded durations of the traces (workload.durations: recorded)"
    lead = next(p for p in placed if p.job.background is None)
    return (f"{model.describe(ops)}; "
            + HostPlan.of(lead.job.training, lead.job.parallel.framework.value,
                          dispatch).describe(ops))


def training_ranks(placed: Sequence[Placed]) -> int:
    """How many leading ranks of the merged program train (the rest is background)."""
    return sum(p.program.ranks for p in placed if p.job.background is None)


def summary_program(program: Program, placed: Sequence[Placed]) -> Program:
    return leading(program, training_ranks(placed))


def job_of_rank(placed: Sequence[Placed]) -> list[str] | None:
    """Each rank's job (blame charges other jobs' traffic); None for a set of one."""
    return [p.job.name for p in placed for _ in p.ranks] if len(placed) > 1 else None


def summaries(spans: pd.DataFrame, comms: pd.DataFrame, program: Program,
              placed: Sequence[Placed], memory_events, simulated: Sequence[int], gpu,
              alone: dict[str, float]) -> list[dict]:
    """One summary per job: a training job's iteration time, throughput, MFU, last
    rank, peak memory and critical path (``analysis.summary`` on its ranks alone)
    with its time alone and slow-down; background traffic's offered and delivered
    rates."""
    out = []
    ranks = spans["rank"].to_numpy()
    for p in placed:
        mine = spans[(ranks >= p.first) & (ranks < p.first + p.program.ranks)]
        head = {"name": p.job.name, "kind": p.job.kind, "nodes": list(p.job.nodes),
                "gpus": p.program.ranks, "first_rank": p.first}
        if p.job.background is not None:
            out.append({**head, **_background(comms, p, program.groups)})
            continue
        own = mine.assign(rank=mine["rank"].to_numpy() - p.first).reset_index(drop=True)
        events = [memory_events[r] for r in p.ranks]
        peak, lowp = p.job.training.peaks(gpu)
        s = summarize(own, p.program, events, peak, gpu.memory_bytes,
                      [r - p.first for r in simulated if r in p.ranks], critical_path(own),
                      lowp=lowp)
        time = s["iteration_time_s"]
        notes = {k: v for k, v in p.program.notes.items() if not k.startswith("_")}
        notes.update(moe_keys(p.program.notes, own, s["critical_rank"]))
        out.append({**head, "iteration_time_s": time, "alone_s": alone.get(p.job.name, time),
                    "slowdown": time / alone.get(p.job.name, time),
                    "tokens_per_s": s["tokens_per_s"], "mfu": s["mfu"],
                    "critical_rank": s["critical_rank"] + p.first,
                    "peak_memory_gib": s["peak_memory_gib"], "oom": s["oom"],
                    "critical_path": s["critical_path"],
                    **{k: s[k] for k in LOWP_KEYS if k in s}, **notes})
    return out


LOWP_KEYS = ("precision", "mfu_lowp", "lowp_overhead_s")  # a low-precision job's own


def shared_lowp(placed: Sequence[Placed], gpu) -> tuple[str, float] | None:
    """The training jobs' low precision and its dense peak where they all have the
    same one (the run's summary then gives it); else None: a figure mixing one
    job's FLOPs with another's peak means nothing (each job's entry has its own)."""
    found = {p.job.training.peaks(gpu)[1] for p in placed if p.job.background is None}
    return found.pop() if len(found) == 1 else None


def _background(comms: pd.DataFrame, p: Placed, groups) -> dict:
    """A background job's offered and delivered bytes per second per stream (each
    GPU of an all-to-all, each storage client), and its messages' mean time."""
    spec = p.job.background
    rows = comms[comms["dimension"] == BG_STREAM]  # (its groups are bg, bg.0, bg.1, ...)
    rows = rows[[groups[str(dim)][int(k)][0] in p.ranks for dim, k in zip(
        rows["group"], rows["group_index"], strict=True)]]  # this job's calls
    if rows.empty:
        return {"traffic": spec.traffic, "offered_gb_s": spec.rate / 1e9, "delivered_gb_s": 0.0,
                "messages": 0, "message_time_s": 0.0, "until_s": 0.0}
    span = float(rows["end"].max())  # the traffic starts at 0 (its first period)
    streams = 1 if spec.traffic == "all_to_all" else len(rows.drop_duplicates(
        ["group", "group_index"]))
    delivered = float(rows["bytes"].sum()) / streams / span if span > 0 else 0.0
    return {"traffic": spec.traffic, "offered_gb_s": spec.rate / 1e9,
            "delivered_gb_s": delivered / 1e9, "messages": int(len(rows)),
            "message_time_s": float((rows["end"] - rows["start"]).mean()),
            "until_s": float(rows["end"].max())}


def run_all(scenario, simulate: Callable) -> object:
    """Run ``scenario``'s jobs together (``simulate(scenario, background_s)`` ->
    a RunResult), each training job alone first; the result's summary gains
    ``jobs``, with each job's slow-down."""
    alone: dict[str, float] = {}
    spent = {"events": 0, "wall_s": 0.0, "runs": 0}  # of the runs before the last

    def count(summary: dict) -> None:
        spent["events"] += summary["events"]
        spent["wall_s"] += summary["wall_s"]
        spent["runs"] += 1
    if len(scenario.jobs) > 1:
        for job in (j for j in scenario.jobs if j.background is None):
            summary = simulate(replace(scenario, job_section=(job,)), 0.0).summary
            alone[job.name] = summary["iteration_time_s"]
            count(summary)
    reach = BACKGROUND_REACH * max(alone.values(), default=0.0)
    for _ in range(MAX_LONGER + 1):
        result = simulate(scenario, reach, alone)
        ends = [j["until_s"] for j in result.summary.get("jobs", ()) if j["kind"] == "background"
                and scenario_job(scenario, j["name"]).background.duration is None]
        if not ends or min(ends) >= result.summary["iteration_time_s"]:
            break
        count(result.summary)
        reach *= 2
    summary = result.summary
    summary.update(events=summary["events"] + spent["events"],
                   wall_s=summary["wall_s"] + spent["wall_s"])
    if listed(scenario):
        summary["job_runs"] = spent["runs"] + 1
    return result


def scenario_job(scenario, name: str):
    return next(j for j in scenario.jobs if j.name == name)
