"""A parallel dimension, declared once in its strategy's module: its name (the
``ParallelSpec`` field, the scenario key ``parallelism.<name>``, the name of
its rank groups, the layout search's column and its flag ``--<name>``), the
stream its calls run on, and how the layout search tries it (its default
values and the quick arithmetic rule a combination must pass before the
scenario loader checks the rest).

``workloads.program.DIMENSIONS`` collects them from ``STRATEGIES`` in order;
the program builder takes each strategy's groups, the search
(``simulator.experiments.layouts``) its columns, values and rules, and
``clustersim search`` its flags from there, so a new dimension is its
strategy module and its ``ParallelSpec`` field
(``tests/test_declarations.py`` adds a toy one and finds it everywhere).

>>> tp = Dimension("tp", "tp", "tensor-parallel sizes", powers_within_domain)
>>> tp.values(Bounds(world=16, layers=8, heads=16, domain=8))
[1, 2, 4, 8]
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

POWERS = (1, 2, 4, 8, 16, 32, 64)  # the sizes a default search tries for tp and ep


@dataclass(frozen=True)
class Bounds:
    """What bounds a layout search's values: the GPUs, the model's layers, heads
    and experts, and the GPUs of an NVLink domain (a server's or a rack's)."""

    world: int
    layers: int
    heads: int
    domain: int
    experts: int = 0


def always(sizes: Mapping[str, int], bounds: Bounds) -> bool:
    """No quick rule: the scenario loader's checks decide."""
    return True


def powers_within_domain(bounds: Bounds) -> list[int]:
    """Powers of two inside an NVLink domain dividing the heads (tensor parallelism:
    its all-reduces in every layer need NVLink)."""
    return [t for t in POWERS if t <= bounds.domain and bounds.heads % t == 0
            and t <= bounds.world]


def only_one(bounds: Bounds) -> list[int]:
    """Just 1: a dimension the default space leaves off (give its flag to search it)."""
    return [1]


@dataclass(frozen=True)
class Dimension:
    """One parallel dimension (see the module's docstring)."""

    name: str
    stream: str  # the stream its calls run on
    help: str  # what ``clustersim search --<name>`` takes
    values: Callable[[Bounds], list[int]] | None = None  # None: derived (dp), not searched
    fits: Callable[[Mapping[str, int], Bounds], bool] = always
    carved: bool = False  # carved out of a stage's ranks (ep, etp): no GPUs of its own
    shown: bool = False  # in a layout's label even at 1 (tp, pp)

    @property
    def flag(self) -> str:
        return f"--{self.name.replace('_', '-')}"
