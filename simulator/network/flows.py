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

from collections.abc import Hashable, Sequence

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
    if len(pair_flow) <= SMALL:
        return _max_min_small(pair_flow.tolist(), pair_link.tolist(), capacity, flows)
    used_links, pair_link = np.unique(pair_link, return_inverse=True)  # only links in use
    rates = np.zeros(flows)
    frozen = np.zeros(flows, dtype=bool)
    remaining = capacity[used_links].astype(float)
    active = np.ones(len(pair_flow), dtype=bool)
    links = len(used_links)
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


RATE_CACHE = 200_000  # component mixes whose rates are kept
SMALL = 80  # below this many (flow, link) pairs plain Python beats numpy's call overhead


def _max_min_small(pair_flow: list[int], pair_link: list[int], capacity: np.ndarray,
                   flows: int) -> np.ndarray:
    """``max_min_rates`` for a few flows, the same progressive filling in plain Python."""
    users: dict[int, list[int]] = {}
    links_of: dict[int, list[int]] = {}
    for f, link in zip(pair_flow, pair_link, strict=True):
        users.setdefault(link, []).append(f)
        links_of.setdefault(f, []).append(link)
    remaining = {link: float(capacity[link]) for link in users}
    count = {link: len(fs) for link, fs in users.items()}
    rates = np.zeros(flows)
    open_flows = set(links_of)
    while open_flows:
        level = min(max(remaining[link], 0.0) / count[link] for link in count if count[link])
        bottleneck = [link for link in count
                      if count[link] and max(remaining[link], 0.0) / count[link]
                      <= level * (1.0 + 1e-12)]
        newly = sorted({f for link in bottleneck for f in users[link] if f in open_flows})
        for f in newly:
            rates[f] = level
            open_flows.discard(f)
            for link in links_of[f]:
                remaining[link] -= level
                count[link] -= 1
    return rates


def _finished(remaining: np.ndarray, size: np.ndarray, rate: np.ndarray) -> np.ndarray:
    return remaining <= np.maximum(size * 1e-9, rate * 1e-12)


def fluid_progress(pair_flow: np.ndarray, pair_link: np.ndarray, capacity: np.ndarray,
                   size: np.ndarray, until: float = np.inf) -> tuple[float, np.ndarray]:
    """Run flows alone on the links until they all end or ``until`` seconds pass.

    Returns (elapsed seconds, bytes each flow has left).
    """
    if len(size) == 1:  # one flow alone runs at its route's narrowest link
        rate = float(capacity[pair_link].min())
        total = float(size[0]) / rate
        if total <= until:
            return total, np.zeros(1)
        return until, np.array([max(0.0, float(size[0]) - rate * until)])
    remaining, elapsed = size.astype(float).copy(), 0.0
    while (remaining > 0).any():
        active = remaining[pair_flow] > 0
        rates = max_min_rates(pair_flow[active], pair_link[active], capacity, len(size))
        live = remaining > 0
        step = float(np.min(remaining[live] / rates[live]))
        if elapsed + step >= until:
            remaining[live] -= rates[live] * (until - elapsed)
            return until, np.maximum(remaining, 0.0)
        remaining[live] -= rates[live] * step
        elapsed += step
        remaining[_finished(remaining, size, rates)] = 0.0
    return elapsed, remaining


def fluid_finish_times(pair_flow: np.ndarray, pair_link: np.ndarray, capacity: np.ndarray,
                       size: np.ndarray) -> np.ndarray:
    """Seconds until each flow ends when the flows run alone on the links.

    >>> fluid_finish_times(np.array([0, 1]), np.array([0, 0]), np.array([2.0]),
    ...                    np.array([2.0, 6.0])).tolist()
    [2.0, 4.0]
    """
    remaining, elapsed = size.astype(float).copy(), 0.0
    ends = np.zeros(len(size))
    while (remaining > 0).any():
        active = remaining[pair_flow] > 0
        rates = max_min_rates(pair_flow[active], pair_link[active], capacity, len(size))
        live = remaining > 0
        step = float(np.min(remaining[live] / rates[live]))
        remaining[live] -= rates[live] * step
        elapsed += step
        ended = live & _finished(remaining, size, rates)
        remaining[ended] = 0.0
        ends[ended] = elapsed
    return ends


def succeed_at(env: simpy.Environment, event: simpy.Event, delay: float) -> None:
    """Trigger ``event`` ``delay`` seconds from now in one SimPy event, as a
    Timeout does (``succeed`` would trigger it now and need a second event)."""
    event._ok, event._value = True, None  # what Event.succeed sets (SimPy 4)
    env.schedule(event, delay=delay)


class _Shape:
    """The flows of a transfer as arrays, shared by every transfer of one call shape."""

    __slots__ = ("size", "pair_flow", "pair_link", "links", "part_flows", "part_ends")

    def __init__(self, routes: Sequence[Sequence[int]], sizes: Sequence[float],
                 part_of: Sequence[int] | None = None, parts: int = 0) -> None:
        self.size = np.asarray(sizes, dtype=float)
        # per part of a batched transfer: its flows; and its alone durations (lazily)
        self.part_flows = None if part_of is None else [
            np.flatnonzero(np.asarray(part_of) == p) for p in range(parts)]
        self.part_ends: list[float] | None = None
        lengths = np.array([len(r) for r in routes], dtype=np.int64)
        self.pair_flow = np.repeat(np.arange(len(routes)), lengths)
        self.pair_link = np.fromiter((link for r in routes for link in r), dtype=np.int64,
                                     count=int(lengths.sum()))
        self.links = np.unique(self.pair_link)


class _Transfer:
    __slots__ = ("done", "size", "remaining", "rate", "pair_flow", "pair_link", "links",
                 "start", "key", "then", "shape", "parts")

    def __init__(self, done: simpy.Event, shape: _Shape, start: float,
                 key: Hashable | None, then: float,
                 parts: list[simpy.Event] | None = None) -> None:
        self.done, self.start, self.key, self.then = done, start, key, then
        self.shape = shape
        # a batch's parts not yet fired: part index -> its event
        self.parts = None if parts is None else dict(enumerate(parts))
        self.size, self.pair_flow = shape.size, shape.pair_flow
        self.pair_link, self.links = shape.pair_link, shape.links
        self.remaining = self.size.copy()
        self.rate = np.zeros(len(self.size))


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
        self._component_of = np.full(len(capacity), -1, dtype=np.int64)  # per link
        self._components: dict[int, _Component] = {}
        self._owner = np.full(len(capacity), -1, dtype=np.int64)  # solo transfer per link
        self._solos: dict[int, _Transfer] = {}
        self._next_id = 0
        self._durations: dict[Hashable, float] = {}
        self._shapes: dict[Hashable, _Shape] = {}
        self._rates: dict[tuple, list[np.ndarray]] = {}  # component mix -> rates
        self.recomputes = 0

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
        self._start(_Transfer(done, shape, self.env.now, key, then))
        return done

    def transfer_batch(self, calls: Sequence[tuple[Sequence[Sequence[int]], Sequence[float]]],
                       key: Hashable | None = None, then: float = 0.0,
                       events: list[simpy.Event] | None = None) -> list[simpy.Event]:
        """Start several transfers (``(routes, sizes)`` each) at once; one event per
        transfer (``events``, or new ones), each firing ``then`` seconds after its
        own flows have ended.

        The same rates and ends as starting them one by one at this instant, with
        one rate computation instead of one per transfer (a gang's messages).
        """
        events = [self.env.event() for _ in calls] if events is None else events
        shape = self._shapes.get(key) if key is not None else None
        if shape is None:
            routes = [r for rs, _ in calls for r in rs]
            sizes = [x for _, xs in calls for x in xs]
            part_of = [p for p, (rs, _) in enumerate(calls) for _ in rs]
            shape = self._shape(routes, sizes, key, part_of, len(calls))
        if shape is None:
            for event in events:
                succeed_at(self.env, event, then)
            return events
        t = _Transfer(None, shape, self.env.now, key, then, events)
        for p, flows in enumerate(shape.part_flows):
            if len(flows) == 0:
                self._fire(t, p)
        self._start(t)
        return events

    def _start(self, t: _Transfer) -> None:
        """Run ``t`` solo if its links are free, else in a component with their users."""
        owners = self._owner[t.links]
        solos = np.unique(owners[owners >= 0])
        touched = self._component_of[t.links]
        components = np.unique(touched[touched >= 0])
        if len(solos) == 0 and len(components) == 0:
            self._start_solo(t)
            return
        merged = [t] + [self._from_solo(self._solos.pop(i)) for i in solos.tolist()]
        for ident in components.tolist():
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
            shape = _Shape([routes[i] for i in keep], [sizes[i] for i in keep],
                           None if part_of is None else [part_of[i] for i in keep], parts)
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
        self._owner[t.links] = ident
        self.env.timeout(duration).callbacks.append(lambda _event: self._solo_done(ident))
        if t.parts:  # parts that end before the last: one timeout per distinct end
            ends: dict[float, list[int]] = {}
            for p in t.parts:
                ends.setdefault(self._part_ends(t.shape)[p], []).append(p)
            for end, parts in ends.items():
                if end < duration:
                    self.env.timeout(end).callbacks.append(
                        lambda _event, parts=parts: self._solo_parts(ident, t, parts))

    def _part_ends(self, shape: _Shape) -> list[float]:
        """Seconds each part of a batch takes alone (cached on its shape)."""
        if shape.part_ends is None:
            ends = fluid_finish_times(shape.pair_flow, shape.pair_link, self.capacity,
                                      shape.size)
            shape.part_ends = [float(ends[f].max()) if len(f) else 0.0
                               for f in shape.part_flows]
        return shape.part_ends

    def _solo_parts(self, ident: int, t: _Transfer, parts: list[int]) -> None:
        if self._solos.get(ident) is t:  # still solo: these parts have ended
            for p in parts:
                self._fire(t, p)

    def _solo_done(self, ident: int) -> None:
        t = self._solos.pop(ident, None)
        if t is None:
            return  # it joined a component before its solo end
        self._owner[t.links] = -1
        self._complete(t)

    def _fire(self, t: _Transfer, part: int) -> None:
        """Part ``part`` of a batch has ended (if not fired yet): fire its event."""
        event = t.parts.pop(part, None)
        if event is not None:
            succeed_at(self.env, event, t.then)

    def _complete(self, t: _Transfer) -> None:
        """Flows all ended: fire the transfer's event after its ``then`` delay."""
        if t.parts is not None:
            for p in list(t.parts):
                self._fire(t, p)
        elif t.then > 0:
            succeed_at(self.env, t.done, t.then)
        else:
            t.done.succeed()

    def _from_solo(self, t: _Transfer) -> _Transfer:
        """A solo transfer about to share links, with the bytes it has left now."""
        self._owner[t.links] = -1
        _, t.remaining = fluid_progress(t.pair_flow, t.pair_link, self.capacity, t.size,
                                        until=self.env.now - t.start)
        return t

    def _new_component(self, transfers: list[_Transfer]) -> int:
        ident = self._new_id()
        component = _Component(self.env.now)
        component.transfers = transfers
        self._components[ident] = component
        for t in transfers:
            self._component_of[t.links] = ident
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
            finished = _finished(t.remaining, t.size, t.rate)
            t.remaining[finished] = 0.0
            if t.parts:
                for p in [p for p in t.parts if finished[t.shape.part_flows[p]].all()]:
                    self._fire(t, p)
            if finished.all():
                self._component_of[t.links] = -1
                self._complete(t)
            else:
                live.append(t)
        component.transfers = live
        if not live:
            del self._components[ident]
            return
        for t in live:  # links of finished transfers may be shared with live ones
            self._component_of[t.links] = ident
        self._assign_rates(live)
        waits = [np.min(t.remaining[t.remaining > 0] / t.rate[t.remaining > 0]) for t in live]
        component.generation += 1
        generation = component.generation
        self.env.timeout(float(min(waits))).callbacks.append(
            lambda _event: self._wake(ident, generation))

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
