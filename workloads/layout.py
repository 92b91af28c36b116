"""Rank layout: which ranks form each tensor, context, data and pipeline group.

Megatron-LM's rank generator (``parallel_state.RankGenerator``) orders the
dimensions from fastest to slowest varying; the default ``tp-cp-dp-pp`` puts
the ranks of a tensor-parallel group next to each other, so with tp <= GPUs
per server they share a server and its NVLink. A rank's coordinates are its
mixed-radix digits in that order:

    rank = tp_i + tp * (cp_i + cp * (dp_i + dp * pp_i))          (tp-cp-dp-pp)

A group of dimension d is the set of ranks whose other coordinates agree,
listed in increasing coordinate d.

Worked example, tp=2, dp=2, pp=2 (8 ranks): tensor groups (0,1) (2,3) (4,5)
(6,7); data groups (0,2) (1,3) (4,6) (5,7); pipeline groups (0,4) (1,5) (2,6) (3,7).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from itertools import product

DIMENSIONS = ("tp", "cp", "dp", "pp")
DEFAULT_ORDER = "tp-cp-dp-pp"


def parse_order(order: str) -> tuple[str, ...]:
    """``"tp-cp-dp-pp"`` -> ('tp', 'cp', 'dp', 'pp'); every dimension exactly once."""
    parts = tuple(order.split("-"))
    if sorted(parts) != sorted(DIMENSIONS):
        raise ValueError(f"order {order!r} must name tp, cp, dp and pp once each, "
                         f"separated by '-', e.g. {DEFAULT_ORDER}")
    return parts


@dataclass(frozen=True)
class Layout:
    sizes: Mapping[str, int]  # dimension -> degree
    order: tuple[str, ...] = parse_order(DEFAULT_ORDER)

    @property
    def world(self) -> int:
        total = 1
        for d in DIMENSIONS:
            total *= self.sizes[d]
        return total

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinates of ``rank``.

        >>> Layout({"tp": 2, "cp": 1, "dp": 2, "pp": 2}).coords(5)
        {'tp': 1, 'cp': 0, 'dp': 0, 'pp': 1}
        """
        out = {}
        for d in self.order:
            rank, out[d] = divmod(rank, self.sizes[d])
        return {d: out[d] for d in DIMENSIONS}

    def rank(self, coords: Mapping[str, int]) -> int:
        value = 0
        for d in reversed(self.order):
            value = value * self.sizes[d] + coords[d]
        return value

    def groups(self, dim: str | tuple[str, ...]) -> tuple[tuple[int, ...], ...]:
        """Every group of ``dim`` (or of several dimensions together, e.g. Megatron's
        data-parallel-with-context group ``("cp", "dp")``), ordered by smallest rank."""
        dims = (dim,) if isinstance(dim, str) else dim
        others = [d for d in DIMENSIONS if d not in dims]
        inner = [d for d in self.order if d in dims]
        found = []
        for values in product(*(range(self.sizes[d]) for d in others)):
            base = dict(zip(others, values, strict=True))
            members = []
            for inside in product(*(range(self.sizes[d]) for d in reversed(inner))):
                members.append(self.rank({**base, **dict(zip(reversed(inner), inside,
                                                             strict=True))}))
            found.append(tuple(sorted(members)))
        return tuple(sorted(found))

    def stage_ranks(self, stage: int) -> list[int]:
        """Ranks of pipeline stage ``stage``."""
        return [r for r in range(self.world) if self.coords(r)["pp"] == stage]
