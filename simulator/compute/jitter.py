"""Compute jitter: each rank's seeded kernel slow-downs, and the slowest-member
approximation that lets one rank stand for a class of jittered ranks.

Exact jitter needs every rank simulated: each rank draws its own factors, and
a collective starts when its slowest member arrives. ``slowest_member`` gives
one rank the durations of what its groups would wait for, so the symmetry
reduction (one rank per class) can run a jittered scenario
(``simulation.jitter: approximate``):

- the compute stream is cut into *segments* ending where a collective the
  stream then waits for is called (a tensor-parallel all-reduce, a ZeRO-3
  gather, the gradient reduction before the optimizer step);
- each segment takes as long as the slowest member of that collective's group
  would take for it: the largest of the members' own seeded segment sums (the
  same draws a full simulation uses), for groups of up to ``SAMPLED_MEMBERS``;
  for larger groups the largest of the group drawn from a normal fitted to
  the sampled members' sums (an order statistic: the maximum of n draws is
  ``F^-1(U^(1/n))``), never below the largest sampled one. Its kernels take
  that member's durations, scaled to the drawn total.

Exact for a group whose members all wait for every one of its collectives (a
tensor-parallel group alone); what it leaves out is drift that builds up
across several segments without a blocking call (data-parallel replicas between
gradient reductions, pipeline stages), measured against full simulation in
``benchmarks/jitter_approximation.py`` and the README. Waiting for the slowest
member shows as the representative's compute, not as ``wait`` spans.
"""

from __future__ import annotations

from statistics import NormalDist

import numpy as np

from simulator.base.ir import COMPUTE_STREAM, OpKind, Program

SAMPLED_MEMBERS = 32  # members whose own draws are used per group; beyond: extrapolated


def jitter_factors(seed: int, rank: int, count: int, sigma: float) -> np.ndarray:
    """Per-kernel slow-down factors ``1 + sigma*|N(0,1)|`` for one rank, reproducibly.

    Each rank draws from its own stream seeded by (seed, rank), so a rank's
    factors do not depend on how many other ranks there are.
    """
    if sigma <= 0.0:
        return np.ones(count)
    rng = np.random.default_rng([seed, rank])
    return 1.0 + sigma * np.abs(rng.standard_normal(count))


def mean_factor(sigma: float) -> float:
    """The expected slow-down ``jitter_factors`` draws: E[1 + sigma |N(0,1)|] =
    1 + sigma sqrt(2/pi) (the half-normal's mean).

    >>> round(mean_factor(0.02), 5)
    1.01596
    """
    return 1.0 + sigma * (2.0 / np.pi) ** 0.5


def segments(program: Program, rank: int) -> list[tuple[list[int], tuple[int, ...]]]:
    """``rank``'s compute-stream segments that end at a blocking collective's call:
    (op indices of the segment, in stream order; the collective group's members
    that run the same program). A collective is blocking when a compute op
    depends on it; its segment runs from after the previous segment's end to
    its last compute dependency."""
    ops = program.ops[rank]
    awaited = {d for op in ops if op.kind is OpKind.COMPUTE for d in op.deps}
    compute = [i for i, op in enumerate(ops)
               if op.kind is OpKind.COMPUTE and op.stream == COMPUTE_STREAM]
    position = {i: p for p, i in enumerate(compute)}
    members: dict[str, tuple[int, ...]] = {}
    out, start = [], 0
    for c in sorted(awaited):
        op = ops[c]
        if op.kind is not OpKind.COLLECTIVE:
            continue
        ends = [position[d] for d in op.deps if d in position]
        if not ends or max(ends) < start:
            continue
        if op.group not in members:
            group = next(g for g in program.groups[op.group] if rank in g)
            members[op.group] = tuple(m for m in group if program.ops[m] is ops)
        out.append((compute[start:max(ends) + 1], members[op.group]))
        start = max(ends) + 1
    return out


def slowest_member(program: Program, rank: int, base: np.ndarray, seed: int,
                   sigma: float) -> np.ndarray:
    """``rank``'s op durations under jitter ``sigma`` where each blocking
    collective's segment takes its group's slowest member's time (see the
    module docstring); elsewhere ``rank``'s own jittered durations."""
    draws: dict[int, np.ndarray] = {}  # a member's factors, shared by its groups

    def factors(member: int) -> np.ndarray:
        if member not in draws:
            draws[member] = jitter_factors(seed, member, len(base), sigma)
        return draws[member]

    out = base * factors(rank)
    by_group: dict[tuple[int, ...], list[list[int]]] = {}
    for indices, members in segments(program, rank):
        if len(members) > 1 and indices:
            by_group.setdefault(members, []).append(indices)
    rng = np.random.default_rng([seed, rank, 1])  # the extrapolated maxima
    for members, runs in by_group.items():
        sampled = (rank, *[m for m in members if m != rank][:SAMPLED_MEMBERS - 1])
        idx = np.concatenate([np.asarray(run) for run in runs])
        starts = np.cumsum([0, *map(len, runs)])[:-1]
        times = base[idx] * np.stack([factors(m)[idx] for m in sampled])  # member x kernel
        sums = np.add.reduceat(times, starts, axis=1)  # sampled member x segment
        slowest = np.argmax(sums, axis=0)
        target = _largest_of(sums, len(members), rng)
        top = sums[slowest, np.arange(len(runs))]
        scale = np.divide(target, top, out=np.ones_like(top), where=top > 0)
        segment = np.repeat(np.arange(len(runs)), [len(run) for run in runs])
        out[idx] = times[slowest[segment], np.arange(len(idx))] * scale[segment]
    return out


def _largest_of(sums: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Per segment (a column of ``sums``, the sampled members' times), the largest
    of ``n`` members' times: the sampled maximum when they are all, else a draw
    of the maximum of ``n`` from a normal fitted to them (a segment sums many
    kernels), at least the sampled maximum."""
    top = sums.max(axis=0)
    if len(sums) >= n:
        return top
    mean, spread = sums.mean(axis=0), sums.std(axis=0, ddof=1)
    u = np.clip(rng.random(sums.shape[1]) ** (1.0 / n), 1e-12, 1.0 - 1e-12)
    z = np.array([NormalDist().inv_cdf(float(x)) for x in u])
    return np.maximum(top, mean + spread * z)
