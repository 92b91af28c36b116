"""Thermal and power throttling: a GPU whose speed changes at given times.

A GPU that reaches its thermal or power limit lowers its clock for a while and
recovers later (Sinha et al. 2022, "Not All GPUs Are Created Equal": clock and
power drops under sustained load, of tens of percent; NVIDIA's
``nvidia-smi -q -d PERFORMANCE`` lists the throttle reasons). ``cluster.throttle``
gives a part's slow-down factor from given times on:

    throttle: {"gpu 5": {"20 ms": 1.5, "60 ms": 1.0}, "node 2": {"0 s": 1.2}}

GPU 5 runs at the kernel table's speed until 20 ms into the iteration, its
kernels take 50 % longer from 20 ms to 60 ms, then it recovers; every GPU of
node 2 is 20 % slower all along. Before a part's first time its factor is 1;
factors multiply the fixed ones of ``cluster.slow`` and ``gpu_speed_spread``,
and a GPU's own schedule multiplies its node's.

A kernel's work does not change with the clock, its duration does: a kernel
that starts at ``s`` with ``d`` seconds of work at full speed ends at the
``t`` where the work done, the integral of 1/f from ``s`` to ``t``, reaches
``d`` (``Clock``). The engine asks each throttled rank's clock for the end of
every kernel it starts, so a kernel that straddles a change is exact.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence

from simulator.base.fields import ScenarioError, fail
from simulator.base.units import UnitError, parse_time
from simulator.compute.stragglers import distinct, factor, part

Schedule = tuple[tuple[float, float], ...]  # (from time in s, factor), by time


def parse(path: str, raw: object) -> tuple[tuple[str, int, Schedule], ...]:
    """Check a ``cluster.throttle`` mapping: keys ``node N`` or ``gpu N``, each a
    mapping of times (``"20 ms"``) to slow-down factors (>= 1) from then on."""
    example = '{"gpu 5": {"20 ms": 1.5, "60 ms": 1.0}}'
    if not isinstance(raw, Mapping):
        raise fail(path, raw, f"must be a mapping of parts to schedules, such as {example}")
    parts = []
    distinct(path, list(raw), [part(path, key, steps) for key, steps in raw.items()])
    for key, steps in raw.items():
        kind, index = part(path, key, steps)
        if not isinstance(steps, Mapping) or not steps:
            raise fail(f"{path}.{key}", steps, "must map times to slow-down factors, as in "
                                               f"{example}")
        parts.append((kind, index, _schedule(f"{path}.{key}", steps)))
    return tuple(sorted(parts))


def _schedule(path: str, steps: Mapping) -> Schedule:
    out = []
    for when, value in steps.items():
        try:
            at = parse_time(when)
        except UnitError as error:
            hint = (" (a --set key that holds a dot is quoted: cluster.throttle.\"gpu 5\"."
                    "\"0.5 ms\"=2)" if isinstance(value, Mapping) else "")
            raise ScenarioError(f"{path}: the time {when!r}: {error}{hint}") from None
        if at < 0:
            raise fail(f"{path}.{when}", when, "must be a time from the iteration's start (>= 0)")
        out.append((at, factor(f"{path}.{when}", value,
                               "1.5: its kernels take 50 % longer from then on")))
    return tuple(sorted(out))


def combined(schedules: Sequence[Schedule]) -> Schedule:
    """One schedule whose factor is the product of every schedule's at each time.

    >>> combined([((0.01, 2.0),), ((0.0, 1.5), (0.02, 1.0))])
    ((0.0, 1.5), (0.01, 3.0), (0.02, 2.0))
    """
    times = sorted({t for s in schedules for t, _ in s})
    out = []
    for t in times:
        factor = 1.0
        for s in schedules:
            at = bisect.bisect_right([u for u, _ in s], t) - 1
            factor *= s[at][1] if at >= 0 else 1.0
        out.append((t, factor))
    return tuple(out)


def schedules(parts: Sequence[tuple[str, int, Schedule]], node_of: Sequence[int],
              gpu_of: Sequence[int] | None = None) -> dict[int, Schedule]:
    """Per throttled rank (rank r runs on GPU ``gpu_of[r]``, default r, on node
    ``node_of[r]``): its GPU's schedule, its node's and its own combined.

    >>> schedules((("gpu", 1, ((0.0, 2.0),)), ("node", 0, ((0.5, 1.5),))), [0, 0, 1])
    {0: ((0.5, 1.5),), 1: ((0.0, 2.0), (0.5, 3.0))}
    """
    out: dict[int, Schedule] = {}
    for rank, node in enumerate(node_of):
        gpu = rank if gpu_of is None else gpu_of[rank]
        own = [s for kind, index, s in parts
               if (kind, index) in (("gpu", gpu), ("node", node))]
        if own:
            out[rank] = combined(own)
    return out


class Clock:
    """When a kernel ends on a GPU running on ``schedule``: ``clock(start, work)``.

    >>> clock = Clock(((1.0, 2.0), (3.0, 1.0)))  # half speed from 1 s to 3 s
    >>> clock(0.0, 0.5), clock(0.5, 1.0), clock(2.0, 1.0)
    (0.5, 2.0, 3.5)
    """

    __slots__ = ("_times", "_factors", "_work")

    def __init__(self, schedule: Schedule) -> None:
        self._times = [0.0] + [t for t, _ in schedule]
        self._factors = [1.0] + [f for _, f in schedule]
        work = [0.0]  # full-speed seconds of work done by each change time
        for k in range(1, len(self._times)):
            span = self._times[k] - self._times[k - 1]
            work.append(work[-1] + span / self._factors[k - 1])
        self._work = work

    def __call__(self, start: float, work: float) -> float:
        k = bisect.bisect_right(self._times, start) - 1
        target = self._work[k] + (start - self._times[k]) / self._factors[k] + work
        j = max(k, bisect.bisect_right(self._work, target) - 1)
        if j == k:
            return start + work * self._factors[k]
        return self._times[j] + (target - self._work[j]) * self._factors[j]


    def work(self, start: float, end: float) -> float:
        """Full-speed seconds of work done from ``start`` to ``end``.

        >>> Clock(((1.0, 2.0),)).work(0.5, 2.0)
        1.0
        """
        return self._done(end) - self._done(start)

    def _done(self, t: float) -> float:
        k = bisect.bisect_right(self._times, t) - 1
        return self._work[k] + (t - self._times[k]) / self._factors[k]


def summary(throttled: Mapping[int, Schedule], top: int = 8) -> dict[str, object]:
    """Summary keys: the throttled ranks and their schedules (the first ``top``)."""
    if not throttled:
        return {}
    return {"throttled": [(rank, [list(step) for step in s])
                          for rank, s in list(throttled.items())[:top]],
            "throttled_count": len(throttled)}
