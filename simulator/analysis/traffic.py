"""Link traffic over time, per server: NVLink out of its GPUs and its NICs'
links into the network, as bandwidth counters for the Perfetto trace.

Each logged collective call or message is lowered again (the lowering is
cached, so this is cheap) and its wire bytes on each link are spread evenly
over the call's run [start, end]: the average rate over the call, not the
instantaneous fluid rate (which changes as flows share links).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from simulator.base.ir import Collective
from simulator.collectives.tuner import Lowered
from simulator.network.fabric import Fabric

CLASSES = {1: "NVLink out (GB/s)", 2: "network out (GB/s)"}


def wire_bytes(lowered: Lowered, links: int) -> np.ndarray:
    """Bytes each link carries for one call (all its steps)."""
    out = np.zeros(links)
    for route, size in zip(lowered.routes, lowered.sizes, strict=True):
        out[list(route)] += size * lowered.steps
    return out


def step_counters(times: np.ndarray, deltas: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A step function from rate changes: (distinct times, value from each on).

    >>> step_counters(np.array([0.0, 2.0, 1.0, 3.0]), np.array([5.0, -5.0, 1.0, -1.0]))
    (array([0., 1., 2., 3.]), array([5., 6., 1., 0.]))
    """
    order = np.argsort(times, kind="stable")
    t, d = times[order], deltas[order]
    distinct, first = np.unique(t, return_index=True)
    totals = np.cumsum(d)
    last = np.append(first[1:] - 1, len(t) - 1)
    values = totals[last]
    values[np.abs(values) < 1e-9 * max(1.0, float(np.abs(d).max()))] = 0.0
    return distinct, values


def server_traffic(comms: pd.DataFrame, groups: dict[str, Sequence[Sequence[int]]],
                   placement: Sequence[str], fabric: Fabric,
                   lower: Callable[..., Lowered],
                   servers: Sequence[int] | None = None) -> dict[tuple[int, str], tuple]:
    """(server, counter name) -> (times, GB/s) for every call in ``comms``; with
    ``servers``, only those servers' counters (from the calls with a member there:
    a large run's trace shows a few servers, its log has millions of calls).

    Vectorized over the log: each distinct call (group, members, collective,
    size) is lowered once, and its rows' rates go to its links' counters as
    arrays, so the cost is per distinct call, not per row."""
    server, kind = fabric.link_classes()
    if servers is not None:
        kind = np.where(np.isin(server, list(servers)), kind, 0)
        comms = _touching(comms, groups, placement, fabric, set(servers))
    comms = comms[comms["end"].to_numpy() > comms["start"].to_numpy()]
    counted = np.flatnonzero(kind > 0)
    slot = server[counted] * 3 + kind[counted]  # one slot per (server, class)
    slots = int(slot.max()) + 1 if len(slot) else 0
    keys = ["group", "group_index", "collective", "bytes"]
    codes = comms.groupby(keys, sort=False, observed=True).ngroup().to_numpy()
    start, end = comms["start"].to_numpy(), comms["end"].to_numpy()
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange((codes.max() + 2) if len(codes) else 1))
    parts: dict[int, list[tuple[np.ndarray, float]]] = {}
    first = comms.iloc[order[bounds[:-1]]][keys].itertuples(index=False, name=None)
    for k, (group, index, collective, size) in enumerate(first):
        members = groups[group][index]
        lowered = lower(Collective(collective), [placement[r] for r in members], size)
        per_slot = np.bincount(slot, weights=wire_bytes(lowered, len(fabric.capacity))[
            counted], minlength=slots)
        rows = order[bounds[k]:bounds[k + 1]]
        for s in np.flatnonzero(per_slot).tolist():
            parts.setdefault(s, []).append((rows, float(per_slot[s])))
    out = {}
    for s, pieces in sorted(parts.items()):
        rows = np.concatenate([r for r, _ in pieces])
        volume = np.concatenate([np.full(len(r), v) for r, v in pieces])
        rate = volume / (end[rows] - start[rows]) / 1e9
        out[(s // 3, CLASSES[s % 3])] = step_counters(
            np.concatenate([start[rows], end[rows]]), np.concatenate([rate, -rate]))
    return out


def binned(times: np.ndarray, values: np.ndarray, bins: int) -> tuple[np.ndarray, np.ndarray]:
    """A step function (value ``values[i]`` from ``times[i]`` on) as its averages
    over ``bins`` equal bins from the first time to the last: the same bytes
    moved in each bin, at the resolution a zoomed-out trace shows. Functions
    with fewer changes than ``bins`` come back as they are; a bin with the
    previous bin's average adds no sample (but the last time is always kept).

    >>> binned(np.array([0.0, 1.0, 3.0, 4.0]), np.array([2.0, 0.0, 4.0, 0.0]), 2)
    (array([0., 2., 4.]), array([1., 2., 0.]))
    >>> binned(np.array([0.0, 1.0, 2.0, 3.0, 4.0]), np.array([1.0, 1.0, 1.0, 1.0, 0.0]), 2)
    (array([0., 4.]), array([1., 0.]))
    """
    times, values = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if len(times) <= bins + 1 or times[-1] <= times[0]:
        return times, values
    area = np.concatenate([[0.0], np.cumsum(values[:-1] * np.diff(times))])
    edges = np.linspace(times[0], times[-1], bins + 1)
    average = np.append(np.diff(np.interp(edges, times, area)) / np.diff(edges), values[-1])
    return _changes(edges, average)


def binned_peak(times: np.ndarray, values: np.ndarray, bins: int
                ) -> tuple[np.ndarray, np.ndarray]:
    """A step function as its maximum over each of ``bins`` equal bins from the
    first time to the last (a memory timeline at a zoomed-out trace's resolution:
    every peak keeps its height, only its width grows to a bin). Functions with
    fewer changes than ``bins`` come back as they are; a bin with the previous
    bin's value adds no sample.

    >>> t, v = binned_peak(np.array([0.0, 0.5, 0.6, 2.0, 4.0]),
    ...                    np.array([1.0, 5.0, 1.0, 2.0, 0.0]), 2)
    >>> t.tolist(), v.tolist()
    ([0.0, 2.0, 4.0], [5.0, 2.0, 0.0])
    """
    times, values = np.asarray(times, dtype=float), np.asarray(values, dtype=float)
    if len(times) <= bins + 1 or times[-1] <= times[0]:
        return times, values
    edges = np.linspace(times[0], times[-1], bins + 1)
    which = np.clip(np.searchsorted(edges, times, side="right") - 1, 0, bins - 1)
    peak = np.full(bins, -np.inf)
    np.maximum.at(peak, which, values)
    entering = values[np.searchsorted(times, edges[:-1], side="right") - 1]
    peak = np.append(np.maximum(peak, entering), values[-1])
    return _changes(edges, peak)


def _changes(edges: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The samples where the value changes, and the last (where the function ends,
    even at an unchanged value: without it the last bin's area is lost).

    >>> _changes(np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0]))
    (array([0., 2.]), array([1., 1.]))
    """
    changed = np.r_[True, values[1:] != values[:-1]]
    changed[-1] = True
    return edges[changed], values[changed]


def _touching(comms: pd.DataFrame, groups: dict[str, Sequence[Sequence[int]]],
              placement: Sequence[str], fabric: Fabric, servers: set[int]) -> pd.DataFrame:
    """The calls of groups with a member on one of ``servers``."""
    pairs = comms[["group", "group_index"]].drop_duplicates()
    near = {(str(g), int(i)) for g, i in zip(pairs["group"], pairs["group_index"], strict=True)
            if any(fabric.node_of(placement[r]) in servers for r in groups[g][i])}
    if not near:
        return comms.iloc[:0]
    codes, names = pd.factorize(comms["group"])  # a few distinct groups: no text per row
    code_of = {str(name): c for c, name in enumerate(names)}
    index = comms["group_index"].to_numpy(np.int64)
    width = int(index.max()) + 1
    wanted = [code_of[g] * width + i for g, i in near if g in code_of]
    return comms[np.isin(codes.astype(np.int64) * width + index, wanted)]
