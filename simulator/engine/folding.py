"""Plug-in: simulate one rank per distinct program (rank folding).

Ranks that share an op tuple (Megatron's layouts give one per pipeline stage)
run identical programs. Only the first rank of each runs; a collective starts
when its running members have arrived and still lowers over its whole group,
so its flows load the fabric as in the full run. Exact when the folded ranks
are identical (no compute jitter) and the groups they stand for use disjoint
links, as in the symmetric layouts Megatron uses.

Contract: ``tests/test_parallelism.py::test_folded_ranks_give_the_same_timeline``
(the running ranks' spans and the summary equal the full run's).
"""

from __future__ import annotations

from simulator.base.ir import Program
from simulator.engine.core import Engine


def first_of_each_program(program: Program) -> list[int]:
    """The lowest rank of every distinct op tuple, in rank order."""
    firsts: dict[int, int] = {}
    for rank, ops in enumerate(program.ops):
        firsts.setdefault(id(ops), rank)
    return sorted(firsts.values())


class Folding(Engine):
    """Runs only the first rank of each distinct program."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.ranks = first_of_each_program(self.program)

    def _arriving(self) -> set[int]:
        return set(self.ranks)
