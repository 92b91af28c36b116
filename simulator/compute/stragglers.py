"""Stragglers: GPUs that compute slower than their peers, by a fixed factor.

At thousands of GPUs the slowest member of each collective sets the pace
(Kokolis et al. 2024, "Revisiting Reliability in Large-Scale Machine Learning
Research Clusters"; Sinha et al. 2022, "Not All GPUs Are Created Equal":
up to 22 % spread between GPUs of one model under one workload, from power and
thermal limits). Two scenario keys give each GPU a slow-down factor that
multiplies every kernel it runs (before the host's launch floor, which a slow
GPU does not change):

- ``cluster.slow``: named slow parts, ``{"node 17": 1.3, "gpu 5": 1.1}``; a
  GPU's factor is the product of its node's and its own;
- ``cluster.gpu_speed_spread`` sigma: every GPU's speed drawn once from a
  seeded log-normal, ``exp(sigma z)`` with z ~ N(0, 1) (median 1: as many GPUs
  faster than the kernel table as slower), by (seed, GPU index), so a GPU keeps
  its draw whatever the cluster's size.

Per-kernel ``compute_jitter`` stays, on top. ``factors`` gives the factor of
every rank (1 where nothing is slow); a scenario without either key gives none
and runs exactly as before.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

import numpy as np

from simulator.base.fields import fail

SPREAD_SEED = 23  # separates the speed draws from other seeded streams
PART = re.compile(r"^\s*(node|gpu)\s+(\d+)\s*$")


def part(path: str, key: object, value: object) -> tuple[str, int]:
    """A part named ``node N`` or ``gpu N``: (kind, index); else an error naming it."""
    match = PART.match(str(key))
    if match is None:
        raise fail(f"{path}.{key}", value, 'is not a part: allowed keys are "node N" '
                                           'and "gpu N" (N from 0)')
    return match.group(1), int(match.group(2))


MAX_FACTOR = 100.0  # a GPU that computes 100x slower than its peers has failed: a fault


def factor(path: str, value: object, example: str) -> float:
    """A slow-down factor in [1, MAX_FACTOR]; ``example`` says what one means."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
            1 <= value <= MAX_FACTOR):
        raise fail(path, value, f"must be a slow-down factor from 1 to {MAX_FACTOR:g} "
                                f"({example}; a GPU slower than that has failed)")
    return float(value)


def distinct(path: str, keys: Sequence[object], parts: Sequence[tuple[str, int]]) -> None:
    """Refuse one part named twice (``"gpu 3"`` and ``"gpu 03"``): its factors would
    multiply without anyone having meant it."""
    seen: dict[tuple[str, int], object] = {}
    for key, named in zip(keys, parts, strict=True):
        if named in seen:
            raise fail(f"{path}.{key}", key, f"names {named[0]} {named[1]}, as {seen[named]!r} "
                                             "does; give each part once")
        seen[named] = key


def slow_parts(path: str, raw: object) -> tuple[tuple[str, int, float], ...]:
    """Check a ``cluster.slow`` mapping: keys ``node N`` or ``gpu N``, values
    slow-down factors of at least 1."""
    if not isinstance(raw, Mapping):
        raise fail(path, raw, 'must be a mapping such as {"node 17": 1.3, "gpu 5": 1.1}')
    named = [part(path, key, value) for key, value in raw.items()]
    distinct(path, list(raw), named)
    return tuple(sorted((*p, factor(f"{path}.{key}", value, "1.3: its kernels take 30 % longer"))
                        for p, (key, value) in zip(named, raw.items(), strict=True)))


def check_parts(parts: Sequence[tuple], nodes: int, gpus: int,
                path: str = "cluster.slow") -> None:
    """Every named part ((kind, index, ...) each) exists in the cluster."""
    for kind, index, *_ in parts:
        count = nodes if kind == "node" else gpus
        if index >= count:
            raise fail(f"{path}.{kind} {index}", index,
                       f"is not in the cluster: it has {count} {kind}s (0 to {count - 1})")


def factors(parts: Sequence[tuple[str, int, float]], spread: float, seed: int,
            node_of: Sequence[int], gpu_of: Sequence[int] | None = None) -> np.ndarray | None:
    """Each rank's slow-down factor (rank r runs on GPU ``gpu_of[r]``, default r,
    on node ``node_of[r]``), or None when every GPU runs at the kernel table's speed.

    >>> factors((("gpu", 1, 1.1), ("node", 1, 1.5)), 0.0, 0, [0, 0, 1, 1]).tolist()
    [1.0, 1.1, 1.5, 1.5]
    """
    if not parts and spread <= 0.0:
        return None
    gpus = np.arange(len(node_of)) if gpu_of is None else np.asarray(gpu_of)
    out = np.ones(len(node_of))
    if spread > 0.0:
        out = np.array([np.exp(spread * np.random.default_rng([seed, SPREAD_SEED, int(gpu)])
                               .standard_normal()) for gpu in gpus])
    nodes = np.asarray(node_of)
    for kind, index, factor in parts:  # (a GPU or node no job uses slows nothing)
        out[(nodes if kind == "node" else gpus) == index] *= factor
    return out


def summary(speed: np.ndarray | None, top: int = 8) -> dict[str, object]:
    """Summary keys: the slowest GPUs (rank, factor), slowest first, and their count."""
    if speed is None:
        return {}
    order = np.argsort(-speed, kind="stable")
    slow = [(int(r), round(float(speed[r]), 4)) for r in order[:top] if speed[r] > 1.0]
    return {"stragglers": slow, "straggler_count": int((speed > 1.0).sum()),
            "slowest_gpu_factor": float(speed.max())}
