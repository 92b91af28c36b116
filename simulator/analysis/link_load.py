"""Link loads of a finished run: what each call put on each link over its run,
and what the run ran on to know it (``Context``).

Each logged call is lowered again on the fabric it ran on (the state of the
fabric at its start, where parts fail during the run: ``FabricStates``) to
know its links; its time alone comes from lowering it on the healthy fabric
(no faults) and simulating it there alone (``collectives.tuner.isolated_time``).
Blame (``analysis.blame``) charges the critical path's excess with them;
``clustersim blame --utilisation`` draws each link's share of what it could
carry (``utilisation``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from simulator.analysis.traffic import step_counters
from simulator.base.ir import Collective
from simulator.collectives.states import FabricStates
from simulator.collectives.tuner import Collectives, Lowered, isolated_time
from simulator.network.fabric import Fabric

CALL_KEYS = ["group", "group_index", "collective", "bytes"]


@dataclass
class Context:
    """What a run ran on: its groups and GPUs, the fabric in each state (from
    time 0, then after each change) with its lowering and the healthy fabric's
    (``fabrics``), and each rank's compute pace (``work``; None: full speed)."""

    groups: dict
    placement: Sequence[str]
    fabrics: FabricStates
    work: Callable[[int, float, float], float] | None = None
    job_of: Sequence[str] | None = None  # each rank's job, where several share the fabric
    _alone: dict = field(default_factory=dict)

    @property
    def states(self) -> list[tuple[float, Fabric, Collectives]]:
        """(from time, fabric, lowering) per state."""
        return self.fabrics.states

    @property
    def healthy(self) -> Collectives:
        return self.fabrics.healthy

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


class LinkLoad:
    """Bytes per second on each link over time, every call's bytes spread evenly
    over its run (as ``analysis.traffic``): ``bytes(link, start, end)``."""

    def __init__(self, rows: Mapping[int, tuple[np.ndarray, np.ndarray, np.ndarray]]):
        """``rows``: per link, (starts, ends, bytes) of the calls crossing it."""
        self._area: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for link, (start, end, size) in rows.items():
            keep = end > start
            rate = size[keep] / (end[keep] - start[keep])
            times, values = step_counters(np.concatenate([start[keep], end[keep]]),
                                          np.concatenate([rate, -rate]))
            area = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(times))])
            self._area[link] = (times, area)

    @property
    def links(self) -> list[int]:
        return sorted(self._area)

    def bytes(self, link: int, start: float, end: float) -> float:
        times, area = self._area.get(link, (None, None))
        if times is None or len(times) < 2:
            return 0.0
        a, b = np.interp([start, end], times, area)
        return float(b - a)

    def matrix(self, links: Sequence[int], edges: np.ndarray) -> np.ndarray:
        """Bytes per second of each of ``links`` averaged over each bin of ``edges``."""
        out = np.zeros((len(links), len(edges) - 1))
        for i, link in enumerate(links):
            times, area = self._area.get(link, (None, None))
            if times is not None and len(times) >= 2:
                out[i] = np.diff(np.interp(edges, times, area)) / np.diff(edges)
        return out


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
