"""Batched transfers: several transfers that start together, one rate computation.

A gang (``simulator.engine.gangs``) sends its mates' messages in lockstep. As
separate transfers each start would recompute the shared rates; as one batch
the flows start together (one computation) and each part still ends when its
own flows do, firing its own event. Solo batches fire each part at its alone
finish time; batches in a component fire a part once all its flows have ended.
A batch can instead end as one (``transfer_group``): each part's end is written
down as it ends and a single event fires after the last, one SimPy event for
a gang's whole message group instead of one per message.

Contract: ``tests/test_network.py::test_a_batch_ends_each_part_as_separate_transfers_would``
(a hypothesis property under background traffic).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import numpy as np
import simpy

from simulator.network.flows import Network, _Shape, _Transfer, succeed_at
from simulator.network.maxmin import fluid_finish_times


class BatchNetwork(Network):
    """A Network that can also start a batch of transfers at once."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._keys: dict[tuple, tuple[str, int]] = {}

    def batch_key(self, key: tuple) -> tuple[str, int]:
        """A short key for a batch's shape key (its parts' keys: long tuples, hashed
        at every start and in every rate cache key otherwise)."""
        short = self._keys.get(key)
        if short is None:
            short = self._keys[key] = ("batch", len(self._keys))
        return short

    def transfer_batch(self, calls: Sequence[tuple[Sequence[Sequence[int]], Sequence[float]]],
                       key: Hashable | None = None, then: float = 0.0,
                       events: list[simpy.Event] | None = None) -> list[simpy.Event]:
        """Start several transfers (``(routes, sizes)`` each) at once; one event per
        transfer (``events``, or new ones), each firing ``then`` seconds after its
        own flows have ended: the same ends as starting them one by one now."""
        events = [self.env.event() for _ in calls] if events is None else events
        shape = self._batch_shape(calls, key)
        if shape is None:
            for event in events:
                succeed_at(self.env, event, then)
            return events
        t = _Transfer(None, shape, self.env.now, key, then)
        t.parts = dict(enumerate(events))
        self._start_parts(t)
        return events

    def transfer_group(self, calls: Sequence[tuple[Sequence[Sequence[int]], Sequence[float]]],
                       key: Hashable, ends: list[float], then: float = 0.0,
                       done: simpy.Event | None = None) -> simpy.Event:
        """Start several transfers at once, as ``transfer_batch``; ``ends[p]`` is set
        to the time part p ends (its flows' end plus ``then``, exactly as its own
        event would fire) and one event (``done``, or a new one) fires at the
        last part's end."""
        done = self.env.event() if done is None else done
        shape = self._batch_shape(calls, key)
        if shape is None:
            ends[:] = [self.env.now + then] * len(calls)
            succeed_at(self.env, done, then)
            return done
        t = _Transfer(done, shape, self.env.now, key, then)
        t.parts = dict.fromkeys(range(len(calls)))
        t.ends = ends
        self._start_parts(t)
        return done

    def _batch_shape(self, calls: Sequence[tuple[Sequence[Sequence[int]], Sequence[float]]],
                     key: Hashable | None) -> _Shape | None:
        """The flows of all parts as one shape, each part's flows known (cached)."""
        shape = self._shapes.get(key) if key is not None else None
        if shape is None:
            routes = [r for rs, _ in calls for r in rs]
            sizes = [x for _, xs in calls for x in xs]
            part_of = [p for p, (rs, _) in enumerate(calls) for _ in rs]
            shape = self._shape(routes, sizes, key, part_of, len(calls))
        return shape

    def _start_parts(self, t: _Transfer) -> None:
        """Fire the parts with no flows now; start the rest."""
        if self._dead is not None:  # on routes around the fabric's failed parts
            t = self._rerouted(t)
        for p in self._part_ends(t.shape)[1]:
            self._fire(t, p)
        self._start(t)

    def _solo_started(self, ident: int, t: _Transfer, duration: float) -> None:
        """Parts that end before the last: one timeout per distinct end (a part
        fired already is skipped when it comes)."""
        if not t.parts:
            return
        for end, parts in self._part_ends(t.shape)[0]:
            if end < duration:
                self.env.timeout(end).callbacks.append(
                    lambda _event, parts=parts: self._solo_parts(ident, t, parts))

    def _part_ends(self, shape: _Shape) -> tuple[list[tuple[float, tuple[int, ...]]],
                                                 tuple[int, ...]]:
        """A batch's parts grouped by the seconds each takes alone, in order of
        those, and its parts with no flows (cached on its shape: a gang's message
        group has a part per mate, and sends the same group every micro-batch)."""
        if shape.part_ends is None:
            ends = fluid_finish_times(shape.pair_flow, shape.pair_link, self.capacity,
                                      shape.size)
            longest = np.zeros(shape.parts)  # (a part with no flows: 0)
            np.maximum.at(longest, shape.part_of, ends)
            groups: dict[float, list[int]] = {}
            for p, end in enumerate(longest.tolist()):
                groups.setdefault(end, []).append(p)
            flows = np.bincount(shape.part_of, minlength=shape.parts)
            empty = tuple(np.flatnonzero(flows == 0).tolist())
            shape.part_ends = (sorted((end, tuple(ps)) for end, ps in groups.items()), empty)
        return shape.part_ends

    def _solo_parts(self, ident: int, t: _Transfer, parts: list[int]) -> None:
        if self._solos.get(ident) is t:  # still solo: these parts have ended
            for p in parts:
                self._fire(t, p)

    def _parts_finished(self, t: _Transfer, finished: np.ndarray) -> None:
        """Fire the parts none of whose flows is still running (counted per part
        at once: a gang's message group has a part per mate)."""
        running = np.bincount(t.shape.part_of[~finished], minlength=t.shape.parts)
        for p in [p for p, left in zip(t.parts, running[list(t.parts)].tolist(),
                                       strict=True) if not left]:
            self._fire(t, p)

    def _fire(self, t: _Transfer, part: int) -> None:
        """Part ``part`` of a batch has ended (if not fired yet): fire its event (a
        group's: note its end; fire the group's event after the last part)."""
        if part not in t.parts:
            return
        event = t.parts.pop(part)
        if t.ends is None:
            succeed_at(self.env, event, t.then)
            return
        t.ends[part] = self.env.now + t.then
        if not t.parts:
            succeed_at(self.env, t.done, t.then)

    def _complete(self, t: _Transfer) -> None:
        if t.parts is None:
            super()._complete(t)
            return
        if t.ends is not None and t.parts:  # a group: its remaining parts end now
            end = self.env.now + t.then
            if len(t.parts) == len(t.ends):
                t.ends[:] = [end] * len(t.ends)
            else:
                for p in t.parts:
                    t.ends[p] = end
            t.parts = {}
            succeed_at(self.env, t.done, t.then)
            return
        for p in list(t.parts):
            self._fire(t, p)
