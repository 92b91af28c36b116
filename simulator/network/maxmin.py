"""Max-min fair rates and fluid progress of flows on links (pure functions).

While flows are active every link's capacity is split max-min fairly among the
flows crossing it (progressive filling, Bertsekas & Gallager, *Data Networks*,
Sec. 6.5.2). A flow is described by the links it crosses: parallel arrays
``pair_flow[i]`` crosses ``pair_link[i]``.
"""

from __future__ import annotations

import math

import numpy as np


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
    used_links, pair_link = _compact(pair_link)  # only links in use
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
        newly = np.zeros(flows, dtype=bool)  # (a mask: no sort, as np.unique would)
        newly[pair_flow[active & bottleneck[pair_link]]] = True
        rates[newly] = level
        frozen[newly] = True
        leaving = active & frozen[pair_flow]
        remaining -= level * np.bincount(pair_link[leaving], minlength=links)
        active &= ~leaving
    return rates


def _compact(values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct values, sorted, and each value's index among them: what
    ``np.unique(values, return_inverse=True)`` gives, in half its time.

    >>> [a.tolist() for a in _compact(np.array([7, 3, 7, 5]))]
    [[3, 5, 7], [2, 0, 2, 1]]
    """
    ordered = np.sort(values)
    first = np.empty(len(ordered), dtype=bool)
    first[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=first[1:])
    distinct = ordered[first]
    return distinct, np.searchsorted(distinct, values)


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


def finished_flows(remaining: np.ndarray, size: np.ndarray, rate: np.ndarray,
                   now: float = 0.0) -> np.ndarray:
    """Flows whose bytes left are zero up to rounding (relative to size or rate),
    or would take less time than the clock can still resolve at ``now`` (else a
    very long run would wait for a step that does not move the clock, forever)."""
    tick = max(1e-12, 4.0 * math.ulp(now))  # 1e-12 s below 2,048 s of simulated time
    return remaining <= np.maximum(size * 1e-9, rate * tick)


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
        remaining[finished_flows(remaining, size, rates)] = 0.0
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
        ended = live & finished_flows(remaining, size, rates)
        remaining[ended] = 0.0
        ends[ended] = elapsed
    return ends
