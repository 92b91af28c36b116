"""Fluid network model: flows over links, sharing bandwidth max-min fairly.

A transfer is a set of flows, each a route (link ids) and a byte count. While
flows are active every link's capacity is split max-min fairly among the flows
crossing it (progressive filling, Bertsekas & Gallager, *Data Networks*,
Sec. 6.5.2). Rates are recomputed whenever a transfer starts or a flow ends,
so a transfer's time is exact for piecewise-constant sharing. Latency is not
added here: callers add the per-hop or per-step latency their protocol has.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import simpy


def max_min_rates(pair_flow: np.ndarray, pair_link: np.ndarray, capacity: np.ndarray,
                  flows: int) -> np.ndarray:
    """Max-min fair rate of each flow.

    ``pair_flow[i]`` crosses ``pair_link[i]``; every flow crosses at least one
    link. Each round finds the links whose equal share is smallest, gives that
    share to every unfrozen flow crossing them, and removes those flows.

    >>> max_min_rates(np.array([0, 1, 1]), np.array([0, 0, 1]), np.array([10.0, 3.0]), 2)
    array([7., 3.])
    """
    rates = np.zeros(flows)
    frozen = np.zeros(flows, dtype=bool)
    remaining = capacity.astype(float)
    active = np.ones(len(pair_flow), dtype=bool)
    links = len(capacity)
    while active.any():
        counts = np.bincount(pair_link[active], minlength=links)
        used = counts > 0
        share = np.full(links, np.inf)
        share[used] = np.maximum(remaining[used], 0.0) / counts[used]
        level = share.min()
        bottleneck = share <= level * (1.0 + 1e-12)
        newly = np.unique(pair_flow[active & bottleneck[pair_link]])
        rates[newly] = level
        frozen[newly] = True
        leaving = active & frozen[pair_flow]
        remaining -= level * np.bincount(pair_link[leaving], minlength=links)
        active &= ~leaving
    return rates


class _Transfer:
    __slots__ = ("done", "size", "remaining", "rate", "pair_flow", "pair_link")

    def __init__(self, done: simpy.Event, routes: Sequence[Sequence[int]],
                 sizes: Sequence[float]) -> None:
        self.done = done
        self.size = np.asarray(sizes, dtype=float)
        self.remaining = self.size.copy()
        self.rate = np.zeros(len(self.size))
        lengths = np.array([len(r) for r in routes], dtype=np.int64)
        self.pair_flow = np.repeat(np.arange(len(routes)), lengths)
        self.pair_link = np.fromiter((link for r in routes for link in r), dtype=np.int64,
                                     count=int(lengths.sum()))


class Network:
    """Active transfers on a set of links, advanced by SimPy timeouts."""

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        self.env = env
        self.capacity = capacity
        self._transfers: list[_Transfer] = []
        self._updated = 0.0
        self._generation = 0
        self.recomputes = 0

    def transfer(self, routes: Sequence[Sequence[int]], sizes: Sequence[float]) -> simpy.Event:
        """Start flows ``sizes[i]`` bytes along ``routes[i]``; the event fires when all end."""
        done = self.env.event()
        keep = [i for i, (r, s) in enumerate(zip(routes, sizes, strict=True)) if r and s > 0]
        if not keep:
            return done.succeed()
        self._advance()
        self._transfers.append(_Transfer(done, [routes[i] for i in keep],
                                         [sizes[i] for i in keep]))
        self._reschedule()
        return done

    def _advance(self) -> None:
        elapsed = self.env.now - self._updated
        if elapsed > 0:
            for t in self._transfers:
                t.remaining -= t.rate * elapsed
        self._updated = self.env.now

    def _reschedule(self) -> None:
        live: list[_Transfer] = []
        for t in self._transfers:
            finished = t.remaining <= np.maximum(t.size * 1e-9, t.rate * 1e-12)
            t.remaining[finished] = 0.0
            if finished.all():
                t.done.succeed()
            else:
                live.append(t)
        self._transfers = live
        if not live:
            return
        self._assign_rates(live)
        waits = [np.min(t.remaining[t.remaining > 0] / t.rate[t.remaining > 0]) for t in live]
        self._generation += 1
        generation = self._generation
        wake = self.env.timeout(float(min(waits)))
        wake.callbacks.append(lambda _event: self._wake(generation))

    def _assign_rates(self, live: list[_Transfer]) -> None:
        self.recomputes += 1
        flows, pair_flow, pair_link, offsets = 0, [], [], []
        for t in live:
            active = t.remaining[t.pair_flow] > 0
            pair_flow.append(t.pair_flow[active] + flows)
            pair_link.append(t.pair_link[active])
            offsets.append(flows)
            flows += len(t.size)
        rates = max_min_rates(np.concatenate(pair_flow), np.concatenate(pair_link),
                              self.capacity, flows)
        for t, start in zip(live, offsets, strict=True):
            t.rate = rates[start:start + len(t.size)]

    def _wake(self, generation: int) -> None:
        if generation != self._generation:
            return  # a newer schedule superseded this wake-up
        self._advance()
        self._reschedule()
