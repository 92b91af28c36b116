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
    a large run's trace shows a few servers, its log has millions of calls)."""
    server, kind = fabric.link_classes()
    if servers is not None:
        kind = np.where(np.isin(server, list(servers)), kind, 0)
        comms = _touching(comms, groups, placement, fabric, set(servers))
    counted = np.flatnonzero(kind > 0)
    slot = server[counted] * 3 + kind[counted]  # one slot per (server, class)
    slots = int(slot.max()) + 1 if len(slot) else 0
    changes: dict[int, list[tuple[float, float]]] = {}
    cache: dict[tuple, tuple[np.ndarray, np.ndarray]] = {}
    for row in comms.itertuples(index=False):
        if row.end <= row.start:
            continue
        key = (row.group, row.group_index, row.collective, row.bytes)
        if key not in cache:
            members = groups[row.group][row.group_index]
            lowered = lower(Collective(row.collective), [placement[r] for r in members],
                            row.bytes)
            per_slot = np.bincount(slot, weights=wire_bytes(lowered, len(fabric.capacity))[
                counted], minlength=slots)
            used = np.flatnonzero(per_slot)
            cache[key] = (used, per_slot[used])
        used, volume = cache[key]
        for s, rate in zip(used.tolist(), (volume / (row.end - row.start) / 1e9).tolist(),
                           strict=True):
            changes.setdefault(s, []).extend(((row.start, rate), (row.end, -rate)))
    out = {}
    for s, pairs in sorted(changes.items()):
        times, deltas = np.array(pairs).T
        out[(s // 3, CLASSES[s % 3])] = step_counters(times, deltas)
    return out


def _touching(comms: pd.DataFrame, groups: dict[str, Sequence[Sequence[int]]],
              placement: Sequence[str], fabric: Fabric, servers: set[int]) -> pd.DataFrame:
    """The calls of groups with a member on one of ``servers``."""
    pairs = comms[["group", "group_index"]].drop_duplicates()
    near = {(str(g), int(i)) for g, i in zip(pairs["group"], pairs["group_index"], strict=True)
            if any(fabric.node_of(placement[r]) in servers for r in groups[g][i])}
    keys = pd.MultiIndex.from_arrays([comms["group"].astype(str), comms["group_index"]])
    return comms[keys.isin(list(near))] if near else comms.iloc[:0]
