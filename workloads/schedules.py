"""Pipeline schedules: the order in which a stage runs forward and backward steps.

A schedule is, per pipeline stage, a list of ``Step(forward, microbatch, chunk)``;
``chunk`` is the model chunk (virtual stage) on that device, 0 unless
interleaved. Virtual stage ``chunk * p + stage`` holds the chunk's layers.

- GPipe (Huang et al. 2019): every forward, then every backward.
- 1F1B (PipeDream-Flush; Narayanan et al. 2021): stage s runs
  ``min(p - s - 1, m)`` warm-up forwards, then alternates one forward and one
  backward, then drains the remaining backwards. At most p - s micro-batches are
  in flight on stage s.
- Interleaved 1F1B (Narayanan et al., SC21, Sec. 2.2): each device holds v
  chunks; virtual micro-batch k runs chunk ``(k mod pv) div p`` (backward:
  reversed) of micro-batch ``(k div pv) p + k mod p``; warm-up is
  ``2 (p - s - 1) + (v - 1) p`` steps. Megatron requires m to be a multiple of p.

Bubble fraction on equal stages (idle over total time): (p-1)/(m+p-1) for
GPipe and 1F1B, (p-1)/(vm+p-1) interleaved; ``makespan`` below checks it.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Schedule(Enum):
    GPIPE = "gpipe"
    ONE_F_ONE_B = "1f1b"
    INTERLEAVED = "interleaved"


ALL, INPUT, WEIGHT = "all", "input", "weight"  # a backward's parts (``Step.part``)


@dataclass(frozen=True)
class Step:
    """One forward or backward of one micro-batch through one chunk; ``part`` of a
    backward: ``all``, or under a zero-bubble split (``workloads.dualpipe``) its
    ``input`` gradients with the weights' deferred, or those ``weight`` gradients."""

    forward: bool
    microbatch: int
    chunk: int = 0
    part: str = ALL


class ScheduleError(ValueError):
    """Parameters a schedule cannot run with; the message names the constraint."""


def gpipe(p: int, m: int, stage: int) -> list[Step]:
    """All forwards, then all backwards.

    >>> [("F" if s.forward else "B") + str(s.microbatch) for s in gpipe(2, 2, 0)]
    ['F0', 'F1', 'B0', 'B1']
    """
    return [Step(True, i) for i in range(m)] + [Step(False, i) for i in range(m)]


def one_f_one_b(p: int, m: int, stage: int, extra: int = 0) -> list[Step]:
    """PipeDream-Flush 1F1B (``extra``: warm-up forwards beyond its own, the
    combined 1F1B schedule's one: ``workloads.moe_overlap``).

    >>> [("F" if s.forward else "B") + str(s.microbatch) for s in one_f_one_b(3, 4, 0)]
    ['F0', 'F1', 'F2', 'B0', 'F3', 'B1', 'B2', 'B3']
    """
    warmup = warmups(Schedule.ONE_F_ONE_B, p, m, 1, stage, extra)
    steps = [Step(True, i) for i in range(warmup)]
    for i in range(m - warmup):
        steps += [Step(True, warmup + i), Step(False, i)]
    steps += [Step(False, m - warmup + i) for i in range(warmup)]
    return steps


def _virtual(k: int, p: int, v: int, forward: bool) -> Step:
    in_group = k % (p * v)
    chunk = in_group // p
    if not forward:
        chunk = v - 1 - chunk
    return Step(forward, (k // (p * v)) * p + k % p, chunk)


def interleaved(p: int, m: int, v: int, stage: int, extra: int = 0) -> list[Step]:
    """Megatron's interleaved 1F1B over ``v`` chunks per device (``extra`` as in
    ``one_f_one_b``).

    >>> [f"{'F' if s.forward else 'B'}{s.microbatch}.{s.chunk}" for s in interleaved(2, 2, 2, 1)]
    ['F0.0', 'F1.0', 'F0.1', 'B0.1', 'F1.1', 'B1.1', 'B0.0', 'B1.0']
    """
    if m % p:
        raise ScheduleError(f"interleaved needs micro-batches ({m}) to be a multiple of "
                            f"pipeline stages ({p})")
    total = m * v
    warmup = warmups(Schedule.INTERLEAVED, p, m, v, stage, extra)
    steps = [_virtual(k, p, v, True) for k in range(warmup)]
    for k in range(total - warmup):
        steps += [_virtual(warmup + k, p, v, True), _virtual(k, p, v, False)]
    steps += [_virtual(total - warmup + k, p, v, False) for k in range(warmup)]
    return steps


def warmups(schedule: Schedule, p: int, m: int, v: int, stage: int, extra: int = 0) -> int:
    """Forwards stage ``stage`` runs before its first backward's turn (every one
    under GPipe): 1F1B's ``p - stage - 1``, interleaved's ``2 (p - stage - 1) +
    (v - 1) p``, plus ``extra``, at most all of them.

    >>> warmups(Schedule.INTERLEAVED, 2, 4, 2, 0), warmups(Schedule.ONE_F_ONE_B, 1, 2, 1, 0, 1)
    (4, 1)
    """
    if schedule is Schedule.GPIPE:
        return m
    if schedule is Schedule.INTERLEAVED:
        return min((p - stage - 1) * 2 + (v - 1) * p + extra, m * v)
    return min(p - stage - 1 + extra, m)


def steps_for(schedule: Schedule, p: int, m: int, v: int, stage: int,
              extra: int = 0) -> list[Step]:
    """Stage ``stage``'s steps; ``extra`` warm-up forwards beyond the schedule's
    own (1F1B and interleaved only)."""
    if schedule is Schedule.INTERLEAVED:
        return interleaved(p, m, v, stage, extra)
    if v != 1:
        raise ScheduleError(f"virtual stages ({v}) need the interleaved schedule")
    if schedule is Schedule.GPIPE:
        return gpipe(p, m, stage)
    return one_f_one_b(p, m, stage, extra)


def makespan(schedule: Schedule, p: int, m: int, v: int, forward: float,
             backward: float) -> float:
    """Time to run the schedule on equal stages with no communication cost.

    ``forward``/``backward`` are one micro-batch's times on one device (all its
    chunks). F of virtual stage k waits for F of k-1; B of k waits for B of k+1
    (and its own F); each device runs its steps in order.
    """
    order = [steps_for(schedule, p, m, v, s) for s in range(p)]
    done: dict[tuple[bool, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    tf, tb, last = forward / v, backward / v, p * v - 1
    while any(pos[s] < len(order[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            while pos[s] < len(order[s]):
                step = order[s][pos[s]]
                k = step.chunk * p + s
                dep = (True, step.microbatch, k - 1) if step.forward else (
                    (True, step.microbatch, k) if k == last else (False, step.microbatch, k + 1))
                if step.forward and k == 0:
                    ready = 0.0
                elif dep in done:
                    ready = done[dep]
                else:
                    break
                free[s] = max(free[s], ready) + (tf if step.forward else tb)
                done[(step.forward, step.microbatch, k)] = free[s]
                pos[s] += 1
                progressed = True
        if not progressed:
            raise ScheduleError("schedule deadlocks")
    return max(free)
