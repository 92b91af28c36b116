"""Blame for a finished run: the inputs ``analysis.blame`` needs, from the run's
fabric, lowering and GPU speeds (``clustersim blame RUN`` rebuilds them from
the run directory's scenario, without simulating again).

Each logged call is lowered again on the fabric it ran on (the state of the
fabric at its start, where parts fail during the run) to know its links; its
time alone comes from lowering it on the healthy fabric (no faults) and
simulating it there alone (``collectives.tuner.isolated_time``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simulator.analysis.blame import MIN_EXCESS, LinkLoad, path_causes
from simulator.base.ir import Collective
from simulator.collectives.tuner import Collectives, Lowered, isolated_time
from simulator.network.fabric import Fabric

CALL_KEYS = ["group", "group_index", "collective", "bytes"]
ANALYSED = 16  # kinds of call on the critical path whose links' loads are worked out


@dataclass
class Context:
    """What a run ran on: its groups and GPUs, the fabric in each state (from
    time 0, then after each change) with its lowering, the healthy fabric's
    lowering, and each rank's compute pace (``work``; None: full speed)."""

    groups: dict
    placement: Sequence[str]
    states: list[tuple[float, Fabric, Callable]]  # (from time, fabric, lowering)
    healthy: Collectives
    work: Callable[[int, float, float], float] | None = None
    job_of: Sequence[str] | None = None  # each rank's job, where several share the fabric
    _alone: dict = field(default_factory=dict)

    def jobs_of(self, comms: pd.DataFrame) -> np.ndarray:
        """The job of each logged call (its group's first member's), a dimension at
        a time."""
        group, index = comms["group"].to_numpy(), comms["group_index"].to_numpy()
        out = np.empty(len(comms), dtype=object)
        for dim in pd.unique(group):
            rows = group == dim
            firsts = np.array([self.job_of[g[0]] for g in self.groups[str(dim)]], dtype=object)
            out[rows] = firsts[index[rows].astype(int)]
        return out

    def state_at(self, times: np.ndarray) -> np.ndarray:
        """The fabric's state (index into ``states``) at each of ``times``."""
        starts = [at for at, _, _ in self.states]
        return np.maximum(np.searchsorted(starts, times, side="right") - 1, 0)

    def capacities(self, links: Sequence[int], starts: np.ndarray,
                   ends: np.ndarray) -> np.ndarray:
        """Bytes each of ``links`` could carry over each interval (links x intervals),
        state by state."""
        begins = [at for at, _, _ in self.states] + [float("inf")]
        out = np.zeros((len(links), len(starts)))
        for k, (_, fabric, _) in enumerate(self.states):
            overlap = np.clip(np.minimum(ends, begins[k + 1]) - np.maximum(starts, begins[k]),
                              0.0, None)
            out += fabric.capacity[list(links)][:, None] * overlap[None, :]
        return out

    def lowered(self, call: tuple, state: int, healthy: bool = False) -> Lowered:
        """A call given as (group, group index, collective, bytes), lowered on the
        fabric in ``state`` (or on the healthy fabric)."""
        group, index, collective, size = call
        gpus = [self.placement[r] for r in self.groups[group][int(index)]]
        lower = self.healthy if healthy else self.states[state][2]
        return lower(Collective(collective), gpus, size)

    def alone_of(self, call: tuple, state: int) -> tuple[float, tuple[int, ...]]:
        """(time alone on the healthy fabric, links in ``state``) of a call."""
        key = (*call, state)
        if key not in self._alone:
            healthy = self.lowered(call, state, healthy=True)
            ideal = isolated_time(self.healthy.fabric, healthy)  # (latency and all)
            self._alone[key] = (ideal, links_of(self.lowered(call, state)))
        return self._alone[key]


def work_of(speed, clocks: dict | None):
    """A function (rank, start, end) -> full-speed seconds of compute its GPU did
    then (``analysis.blame``), or None when every GPU runs at full speed."""
    if speed is None and not clocks:
        return None
    clocks = clocks or {}

    def work(rank: int, start: float, end: float) -> float:
        clock = clocks.get(rank)
        done = end - start if clock is None else clock.work(start, end)
        return done / (1.0 if speed is None else float(speed[rank]))
    return work


def _lowering(scenario, fabric: Fabric, epoch: int) -> Collectives:
    return Collectives(fabric, scenario.algorithm, scenario.protocol,
                       lockstep=scenario.step_model == "lockstep", epoch=epoch)


def states_of(scenario, fabric: Fabric) -> list[tuple[float, Fabric, Collectives]]:
    """The fabric in each state of the run (from 0, then after each change a
    fault brings: ``Machine.changes``), each with its own lowering, whose call
    keys carry the state's number."""
    states = [(0.0, fabric, _lowering(scenario, fabric, 0))]
    for k, (at, graph) in enumerate(scenario.machine.changes, start=1):
        later = fabric.after(graph)
        states.append((at, later, _lowering(scenario, later, k)))
    return states


def healthy_lowering(scenario, states: list) -> Collectives:
    """The lowering on the fabric without faults (the run's own when it has none)."""
    if scenario.machine.healthy is None:
        return states[0][2]
    return _lowering(scenario, Fabric(scenario.machine.healthy_graph()), -1)


def rebuild(scenario, groups: dict, placement: Sequence[str]) -> Context:
    """A finished run's context from its scenario (no simulation; GPU speeds are
    not needed for link loads)."""
    machine = scenario.machine
    fabric = Fabric(machine.build_graph(), [g for _, g in machine.changes])
    states = states_of(scenario, fabric)
    return Context(groups, placement, states, healthy_lowering(scenario, states))


def links_of(lowered: Lowered) -> tuple[int, ...]:
    """The links a lowered call's routes cross."""
    return tuple(sorted({link for route in lowered.routes for link in route}))


def link_load(comms: pd.DataFrame, context: Context, links: set[int] | None = None
              ) -> LinkLoad:
    """Every call's wire bytes on each link (``links`` only, if given) over its run."""
    comms = comms[comms["end"].to_numpy() > comms["start"].to_numpy()]
    frame = comms[CALL_KEYS].assign(state=context.state_at(comms["start"].to_numpy()))
    codes = frame.groupby([*CALL_KEYS, "state"], sort=False, observed=True).ngroup().to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange((codes.max() + 2) if len(codes) else 1))
    start, end = comms["start"].to_numpy(), comms["end"].to_numpy()
    per_link: dict[int, list[tuple[np.ndarray, float]]] = {}
    firsts = frame.iloc[order[bounds[:-1]]].itertuples(index=False, name=None)
    for k, (*call, state) in enumerate(firsts):
        lowered = context.lowered(tuple(call), int(state))
        rows = order[bounds[k]:bounds[k + 1]]
        volume: dict[int, float] = {}
        for route, size in zip(lowered.routes, lowered.sizes, strict=True):
            for link in route:
                if links is None or link in links:
                    volume[link] = volume.get(link, 0.0) + size * lowered.steps
        for link, size in volume.items():
            per_link.setdefault(link, []).append((rows, size))
    return LinkLoad({link: (np.concatenate([start[r] for r, _ in parts]),
                            np.concatenate([end[r] for r, _ in parts]),
                            np.concatenate([np.full(len(r), s) for r, s in parts]))
                     for link, parts in per_link.items()})


def causes(spans: pd.DataFrame, comms: pd.DataFrame, path: pd.DataFrame,
           context: Context, analysed: int = ANALYSED) -> list:
    """The ranked causes of the critical path's excess (``analysis.blame``): link
    loads are worked out for the ``analysed`` kinds of call (same group, size and
    fabric state) that lost the most time on the path; the rest is charged to
    "other calls"."""
    on_path = path[(path["category"] == "communication") & (path["span"] >= 0)]
    calls = spans["call"].to_numpy()[on_path["span"].to_numpy(int)] if len(on_path) else []
    calls = np.asarray(calls, dtype=np.int64)
    distinct = np.unique(calls[calls >= 0])
    rows = comms.iloc[distinct]
    kind_of = {int(c): (call, int(st)) for c, call, st in zip(
        distinct.tolist(), rows[CALL_KEYS].itertuples(index=False, name=None),
        context.state_at(rows["start"].to_numpy()).tolist(), strict=True)}
    lost: dict[tuple, float] = {}
    for call, start, end in zip(calls.tolist(), on_path["start"].tolist(),
                                on_path["end"].tolist(), strict=True):
        if call >= 0:
            kind = kind_of[call]
            excess = end - start - context.alone_of(*kind)[0]
            if excess > MIN_EXCESS * (end - start):  # (what path_causes charges)
                lost[kind] = lost.get(kind, 0.0) + excess
    top = set(sorted(lost, key=lambda k: -lost[k])[:analysed])
    wanted = {link for kind in top for link in context.alone_of(*kind)[1]}
    load = link_load(comms, context, wanted) if wanted else LinkLoad({})
    other_jobs = _other_jobs(comms, context, wanted) if context.job_of and wanted else None
    fabric, healthy = context.states[0][1], context.healthy.fabric

    def alone(call: int) -> tuple[float, tuple[int, ...]]:
        ideal, links = context.alone_of(*kind_of[call])
        return ideal, links if kind_of[call] in top else ()

    def healthy_capacity(link: int) -> float:
        index = healthy.index.get(fabric.ends(link))
        return float(healthy.capacity[index]) if index is not None else 1.0

    def state_of(link: int) -> str:
        worst = min(float(f.capacity[link]) / healthy_capacity(link)
                    for _, f, _ in context.states)
        return ("" if worst >= 1.0 - 1e-9 else "down" if worst <= 0 else
                f"at {worst:.0%} of its bandwidth")

    def carried(links: Sequence[int], start: float, end: float) -> np.ndarray:
        return context.capacities(links, np.array([start]), np.array([end]))[:, 0]

    return path_causes(path, spans, context.work, alone, load, carried,
                       lambda link: " -> ".join(fabric.ends(link)), state_of, other_jobs)


def _other_jobs(comms: pd.DataFrame, context: Context, links: set[int]) -> Callable:
    """``other_jobs(link, rank, start, end)`` for ``analysis.blame.path_causes``:
    each job besides ``rank``'s that moved bytes over ``link`` then, with its
    share of the link's bytes."""
    owner = context.jobs_of(comms)
    loads = {job: link_load(comms[owner == job], context, links) for job in np.unique(owner)}

    def other_jobs(link: int, rank: int, start: float, end: float) -> dict[str, float]:
        moved = {job: load.bytes(link, start, end) for job, load in loads.items()}
        total = sum(moved.values())
        return {job: b / total for job, b in moved.items()
                if job != context.job_of[rank] and b > 0} if total > 0 else {}
    return other_jobs


def utilisation(comms: pd.DataFrame, context: Context, end: float, bins: int = 200,
                top: int = 24) -> tuple[np.ndarray, list[str]]:
    """The ``top`` links by their busiest bin (then their mean): each one's share of
    what it could carry in each of ``bins`` equal bins from 0 to ``end`` (rows,
    busiest first; a failed link that still had bytes to move counts as full)."""
    load = link_load(comms, context)
    links = [link for link in load.links if load.bytes(link, 0.0, end) > 0]
    if not links or end <= 0:
        return np.zeros((0, bins)), []
    edges = np.linspace(0.0, end, bins + 1)
    moved = load.matrix(links, edges) * np.diff(edges)
    carried = context.capacities(links, edges[:-1], edges[1:])
    use = np.divide(moved, carried, out=np.where(moved > 0, 1.0, 0.0), where=carried > 0)
    order = np.lexsort((-use.mean(axis=1), -use.max(axis=1)))[:top]
    fabric = context.states[0][1]
    return use[order], [" -> ".join(fabric.ends(links[i])) for i in order]
