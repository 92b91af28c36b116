"""Fluid network model: flows over links, sharing bandwidth max-min fairly.

A transfer is a set of flows, each a route (link ids) and a byte count. While
flows are active every link's capacity is split max-min fairly among the flows
crossing it (progressive filling, Bertsekas & Gallager, *Data Networks*,
Sec. 6.5.2). Rates are recomputed whenever a transfer starts or a flow ends,
so a transfer's time is exact for piecewise-constant sharing. Latency is not
added here: callers add the per-hop or per-step latency their protocol has.

Max-min fairness decomposes over transfers that share no link, so a transfer
that starts on links no other transfer is using runs *solo*: its end is its
isolated fluid time (cached per call shape), with no global recomputation.
If a later transfer touches its links, it joins a *component* of
link-sharing transfers with the bytes it has left at that moment (replayed
from its isolated dynamics); a component's rates are recomputed jointly when
one of its transfers starts or a flow in it ends, and components merge when a
transfer bridges them. The result is the same as always recomputing
everything (max-min over disjoint link sets is their union); most
intra-server collectives never leave solo.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence

import numpy as np
import simpy

from simulator.network.maxmin import finished_flows, fluid_progress, max_min_rates

RATE_CACHE = 200_000  # component mixes whose rates are kept


def succeed_at(env: simpy.Environment, event: simpy.Event, delay: float) -> None:
    """Trigger ``event`` ``delay`` seconds from now in one SimPy event, as a
    Timeout does (``succeed`` would trigger it now and need a second event)."""
    event._ok, event._value = True, None  # what Event.succeed sets (SimPy 4)
    env.schedule(event, delay=delay)


class _Shape:
    """The flows of a transfer as arrays, shared by every transfer of one call shape."""

    __slots__ = ("size", "pair_flow", "pair_link", "links", "parts", "part_of", "part_ends")

    def __init__(self, routes: Sequence[Sequence[int]], sizes: Sequence[float]) -> None:
        self.size = np.asarray(sizes, dtype=float)
        self.parts = 0  # batches (``batches``): how many parts
        self.part_of: np.ndarray | None = None  # batches: per flow, its part
        self.part_ends: tuple | None = None  # batches: parts grouped by their ends
        lengths = np.array([len(r) for r in routes], dtype=np.int64)
        self.pair_flow = np.repeat(np.arange(len(routes)), lengths)
        self.pair_link = np.fromiter((link for r in routes for link in r), dtype=np.int64,
                                     count=int(lengths.sum()))
        self.links = np.unique(self.pair_link)


class _Transfer:
    __slots__ = ("done", "size", "remaining", "rate", "pair_flow", "pair_link", "links",
                 "start", "key", "then", "shape", "parts", "ends")

    def __init__(self, done: simpy.Event, shape: _Shape, start: float,
                 key: Hashable | None, then: float) -> None:
        self.done, self.start, self.key, self.then = done, start, key, then
        self.shape = shape
        self.parts: dict[int, simpy.Event] | None = None  # a batch's parts not yet fired
        self.ends: list[float] | None = None  # a group's (batches): when each part ended
        self.size, self.pair_flow = shape.size, shape.pair_flow
        self.pair_link, self.links = shape.pair_link, shape.links
        self.remaining: np.ndarray | None = None  # bytes left, rates: once it shares links
        self.rate: np.ndarray | None = None  # (``_shared``; a solo run needs neither)


def _shared(t: _Transfer, remaining: np.ndarray) -> _Transfer:
    """``t`` about to share links: the bytes each flow has left, no rate yet."""
    t.remaining, t.rate = remaining, np.zeros(len(t.size))
    return t


class _Component:
    """Transfers that share links, with rates computed jointly."""

    __slots__ = ("transfers", "updated", "generation")

    def __init__(self, now: float) -> None:
        self.transfers: list[_Transfer] = []
        self.updated = now
        self.generation = 0


class Network:
    """Active transfers on a set of links, advanced by SimPy timeouts.

    Transfers that share a link form a component whose rates are recomputed
    together; components share no link, so each is recomputed only when one
    of its own transfers starts or a flow in it ends.
    """

    def __init__(self, env: simpy.Environment, capacity: np.ndarray) -> None:
        self.env = env
        self.capacity = capacity
        # per link: the solo transfer or the component using it, by id (-1: free);
        # the two share one numbering, so one look at a start tells whether it is alone
        self._holder = np.full(len(capacity), -1, dtype=np.int64)
        self._components: dict[int, _Component] = {}
        self._solos: dict[int, _Transfer] = {}
        self._next_id = 0
        self._durations: dict[Hashable, float] = {}
        self._shapes: dict[Hashable, _Shape] = {}
        self._rates: dict[tuple, list[np.ndarray]] = {}  # component mix -> rates
        self.recomputes = 0
        self._dead: np.ndarray | None = None  # links down now (``change``)
        self._reroute: Callable[[Sequence[int]], Sequence[int]] | None = None

    def change(self, capacity: np.ndarray,
               reroute: Callable[[Sequence[int]], Sequence[int]]) -> None:
        """The links' capacities change now (a part of the fabric degrades, fails or
        recovers). Every active transfer keeps the bytes it has moved; from now on
        all share the new capacities, and the flows of any transfer, active or
        started later, whose route crosses a link with no capacity left take
        ``reroute(route)`` instead (the fabric's route over the parts that
        survive), as an adaptive or self-healing fabric moves them at once."""
        active = [self._from_solo(t) for t in self._solos.values()]
        for component in self._components.values():
            self._advance(component)
            active += component.transfers
        self._solos.clear()
        self._components.clear()
        self._holder[:] = -1
        self.capacity = capacity
        dead = capacity <= 0
        self._dead, self._reroute = (dead if dead.any() else None), reroute
        self._durations.clear()
        self._rates.clear()
        for shape in self._shapes.values():
            shape.part_ends = None  # (batches: each part's alone time, at the old rates)
        active = [self._rerouted(t) for t in active]
        if active:
            self._reschedule(self._new_component(active))

    def _rerouted(self, t: _Transfer) -> _Transfer:
        """``t`` with its flows over a dead link on new routes (itself if none is)."""
        if self._dead is None or not self._dead[t.links].any():
            return t
        routes = [t.pair_link[t.pair_flow == f].tolist() for f in range(len(t.size))]
        routes = [list(self._reroute(r)) if self._dead[r].any() else r for r in routes]
        shape = _Shape(routes, t.size)
        shape.parts, shape.part_of = t.shape.parts, t.shape.part_of
        t.shape, t.key = shape, None  # (its own shape: nothing cached under its old key)
        t.pair_flow, t.pair_link, t.links = shape.pair_flow, shape.pair_link, shape.links
        return t

    def transfer(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
                 key: Hashable | None = None, then: float = 0.0,
                 done: simpy.Event | None = None) -> simpy.Event:
        """Start flows ``sizes[i]`` bytes along ``routes[i]``; the event (``done``, or a
        new one) fires ``then`` seconds after all have ended (a caller's latency,
        folded in to save events).

        ``key`` names the call's shape (same routes and sizes) so that its arrays
        and solo duration are computed once.
        """
        done = self.env.event() if done is None else done
        shape = self._shape(routes, sizes, key)
        if shape is None:
            succeed_at(self.env, done, then)
            return done
        t = _Transfer(done, shape, self.env.now, key, then)
        self._start(t if self._dead is None else self._rerouted(t))
        return done

    def _start(self, t: _Transfer) -> None:
        """Run ``t`` (on routes that avoid failed links) solo if its links are free,
        else in a component with their users."""
        holders = self._holder[t.links]
        if holders.max() < 0:  # every link free (the common case)
            self._start_solo(t)
            return
        users = sorted(set(holders[holders >= 0].tolist()))  # (few: faster than np.unique)
        solos = [i for i in users if i in self._solos]
        components = [i for i in users if i not in self._solos]
        merged = [_shared(t, t.size.copy())]
        merged += [self._from_solo(self._solos.pop(i)) for i in solos]
        for ident in components:
            component = self._components.pop(ident)
            self._advance(component)
            merged += component.transfers
        self._reschedule(self._new_component(merged))

    def isolated(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
                 key: Hashable | None = None) -> float:
        """Seconds these flows take alone on the fabric (cached per ``key``)."""
        shape = self._shape(routes, sizes, key)
        return 0.0 if shape is None else self._alone_duration(shape, key)

    def _shape(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
               key: Hashable | None, part_of: Sequence[int] | None = None,
               parts: int = 0) -> _Shape | None:
        """The flows as arrays (cached per ``key``); None when no flow carries bytes."""
        shape = self._shapes.get(key) if key is not None else None
        if shape is None:
            keep = [i for i, (r, s) in enumerate(zip(routes, sizes, strict=True)) if r and s > 0]
            if not keep:
                return None
            shape = _Shape([routes[i] for i in keep], [sizes[i] for i in keep])
            if part_of is not None:  # a batch (``batches``): each flow's part
                shape.parts = parts
                shape.part_of = np.asarray([part_of[i] for i in keep], dtype=np.int64)
            if key is not None:
                self._shapes[key] = shape
        return shape

    def _alone_duration(self, shape: _Shape | _Transfer, key: Hashable | None) -> float:
        """Seconds ``shape``'s flows take alone (cached per ``key``)."""
        duration = self._durations.get(key) if key is not None else None
        if duration is None:
            duration = fluid_progress(shape.pair_flow, shape.pair_link, self.capacity,
                                      shape.size)[0]
            if key is not None:
                self._durations[key] = duration
        return duration

    def _new_id(self) -> int:
        self._next_id += 1
        return self._next_id

    def _start_solo(self, t: _Transfer) -> None:
        duration = self._alone_duration(t, t.key)
        ident = self._new_id()
        self._solos[ident] = t
        self._holder[t.links] = ident
        self.env.timeout(duration).callbacks.append(lambda _event: self._solo_done(ident))
        self._solo_started(ident, t, duration)

    def _solo_started(self, ident: int, t: _Transfer, duration: float) -> None:
        """Hook: ``t`` runs solo and ends in ``duration`` seconds (batches use it)."""

    def _solo_done(self, ident: int) -> None:
        t = self._solos.pop(ident, None)
        if t is None:
            return  # it joined a component before its solo end
        self._holder[t.links] = -1
        self._complete(t)

    def _complete(self, t: _Transfer) -> None:
        """Flows all ended: fire the transfer's event after its ``then`` delay."""
        if t.then > 0:
            succeed_at(self.env, t.done, t.then)
        else:
            t.done.succeed()

    def _from_solo(self, t: _Transfer) -> _Transfer:
        """A solo transfer about to share links, with the bytes it has left now."""
        self._holder[t.links] = -1
        return _shared(t, fluid_progress(t.pair_flow, t.pair_link, self.capacity, t.size,
                                         until=self.env.now - t.start)[1])

    def _new_component(self, transfers: list[_Transfer]) -> int:
        ident = self._new_id()
        component = _Component(self.env.now)
        component.transfers = transfers
        self._components[ident] = component
        for t in transfers:
            self._holder[t.links] = ident
        return ident

    def _advance(self, component: _Component) -> None:
        elapsed = self.env.now - component.updated
        if elapsed > 0:
            for t in component.transfers:
                t.remaining -= t.rate * elapsed
        component.updated = self.env.now

    def _reschedule(self, ident: int) -> None:
        component = self._components[ident]
        live: list[_Transfer] = []
        for t in component.transfers:
            finished = finished_flows(t.remaining, t.size, t.rate, self.env.now)
            t.remaining[finished] = 0.0
            if t.parts:
                self._parts_finished(t, finished)
            if finished.all():
                self._holder[t.links] = -1
                self._complete(t)
            else:
                live.append(t)
        component.transfers = live
        if not live:
            del self._components[ident]
            return
        for t in live:  # links of finished transfers may be shared with live ones
            self._holder[t.links] = ident
        self._assign_rates(live)
        waits = [np.min(t.remaining[t.remaining > 0] / t.rate[t.remaining > 0]) for t in live]
        component.generation += 1
        generation = component.generation
        self.env.timeout(float(min(waits))).callbacks.append(
            lambda _event: self._wake(ident, generation))

    def _parts_finished(self, t: _Transfer, finished: np.ndarray) -> None:
        """Hook: some of a batch's flows have ended (batches fire their parts)."""

    def _assign_rates(self, live: list[_Transfer]) -> None:
        """Max-min rates for a component's live transfers. The rates depend only on
        which flows of which call shapes are active, so they are cached by that
        (pipelines repeat the same mix of messages micro-batch after micro-batch)."""
        key = None
        if all(t.key is not None for t in live):
            key = tuple((t.key, (t.remaining > 0).tobytes()) for t in live)
            cached = self._rates.get(key)
            if cached is not None:
                for t, rate in zip(live, cached, strict=True):
                    t.rate = rate
                return
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
        if key is not None:
            if len(self._rates) >= RATE_CACHE:
                self._rates.clear()
            self._rates[key] = [t.rate for t in live]

    def _wake(self, ident: int, generation: int) -> None:
        component = self._components.get(ident)
        if component is None or component.generation != generation:
            return  # merged into another component, or rescheduled since
        self._advance(component)
        self._reschedule(ident)
