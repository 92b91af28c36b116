"""Placement of several jobs on one cluster's nodes (pure index math).

A job asks either for given nodes (a list of node indices) or for a count
of nodes and a policy:

- ``contiguous``: the lowest-numbered run of that many consecutive free nodes
  (a scheduler that packs a job under as few leaf switches as it can, as
  Slurm's topology plug-in tries to);
- ``scattered``: that many free nodes spread evenly over all the free ones
  (every other node when two equal jobs share the cluster: the fragmented
  allocation a busy cluster hands out);
- ``random``: that many free nodes drawn with the scenario's seed.

Jobs with given nodes are placed first, then the others in the order written,
each on the nodes still free.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

POLICIES = ("contiguous", "scattered", "random")
RANDOM_SEED = 0x10B5  # the stream of draws for random placement (with the scenario's seed)


class PlacementError(ValueError):
    """A placement that cannot be met; the message names the job and why."""


def place(requests: Sequence[tuple[str, int | tuple[int, ...], str]], nodes: int,
          seed: int = 0) -> list[tuple[int, ...]]:
    """Each job's nodes, in the order of ``requests``: (job name, count or given
    node indices, policy) on a cluster of ``nodes`` nodes.

    >>> place([("a", 2, "contiguous"), ("b", 2, "contiguous")], 4)
    [(0, 1), (2, 3)]
    >>> place([("a", 2, "scattered"), ("b", 2, "scattered")], 4)
    [(0, 2), (1, 3)]
    >>> place([("a", 2, "contiguous"), ("b", (0,), "given")], 4)
    [(1, 2), (0,)]
    """
    free = list(range(nodes))
    out: dict[int, tuple[int, ...]] = {}
    for k, (name, want, _) in enumerate(requests):
        if isinstance(want, tuple):
            taken = [n for n in want if n not in free]
            if taken:
                raise PlacementError(f"job {name}: node {taken[0]} is "
                                     + ("outside the cluster (nodes 0 to "
                                        f"{nodes - 1})" if not 0 <= taken[0] < nodes
                                        else "given to another job"))
            free = [n for n in free if n not in want]
            out[k] = want
    for k, (name, want, policy) in enumerate(requests):
        if isinstance(want, tuple):
            continue
        if want > len(free):
            raise PlacementError(f"job {name}: needs {want} node(s), only {len(free)} of the "
                                 f"cluster's {nodes} are free")
        chosen = _choose(name, want, policy, free, seed, k)
        free = [n for n in free if n not in chosen]
        out[k] = chosen
    return [out[k] for k in range(len(requests))]


def _choose(name: str, count: int, policy: str, free: list[int], seed: int,
            job: int) -> tuple[int, ...]:
    if policy == "contiguous":
        for i in range(len(free) - count + 1):
            if free[i + count - 1] - free[i] == count - 1:
                return tuple(free[i:i + count])
        raise PlacementError(f"job {name}: no {count} consecutive nodes are free "
                             "(placement: scattered or random takes any free nodes)")
    if policy == "scattered":
        return tuple(free[(i * len(free)) // count] for i in range(count))
    if policy == "random":
        rng = np.random.default_rng([seed, RANDOM_SEED, job])
        return tuple(sorted(int(n) for n in rng.choice(free, size=count, replace=False)))
    raise PlacementError(f"job {name}: placement {policy!r} must be one of "
                         + ", ".join(POLICIES))
