"""Several jobs on one cluster: each job's spec, and their programs merged into
one the engine runs, so their calls share the fabric's links.

The merged program gives each job a block of consecutive ranks (training jobs
in the order written, then background jobs); each dimension's groups are all
the jobs' groups of that name, each moved to its job's ranks. A rank belongs
to its own job's groups only, so the engine matches calls within a job and
the fabric is the only thing jobs share.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from simulator.base.ir import Program
from workloads.background import BackgroundSpec
from workloads.models import ModelSpec
from workloads.training import ParallelSpec, TrainingSpec


@dataclass(frozen=True)
class JobSpec:
    """One job of a scenario's ``jobs:`` section, on its nodes of the cluster."""

    name: str
    nodes: tuple[int, ...]
    model: ModelSpec | None = None
    training: TrainingSpec | None = None
    parallel: ParallelSpec | None = None
    background: BackgroundSpec | None = None
    workload: object = None  # a program read from traces (config.workload.Workload)

    @property
    def kind(self) -> str:
        return "background" if self.background is not None else "training"


@dataclass(frozen=True)
class Placed:
    """A job's program and its block of ranks in the merged program."""

    job: JobSpec
    first: int
    program: Program

    @property
    def ranks(self) -> range:
        return range(self.first, self.first + self.program.ranks)


def rank_order(jobs: Sequence[JobSpec]) -> list[JobSpec]:
    """Training jobs in the order written, then background jobs."""
    return [j for j in jobs if j.background is None] + [j for j in jobs if j.background]


def merge(programs: Sequence[Program]) -> Program:
    """One program running ``programs`` side by side, each on the next block of
    ranks; each dimension's groups are every program's groups of that name,
    moved to their block (a rank is in its own program's groups only). Model
    FLOPs and tokens are the programs' sums; notes are left to each job. One
    program (a plain scenario's one job) is itself.

    >>> from simulator.base.ir import Program
    >>> a = Program(((), ()), {"dp": ((0, 1),)}, ({}, {}), 1.0, 2)
    >>> merge([a, a]).groups
    {'dp': ((0, 1), (2, 3))}
    >>> merge([a]) is a
    True
    """
    if len(programs) == 1:
        return programs[0]
    groups: dict[str, list[tuple[int, ...]]] = {}
    first = 0
    for program in programs:
        for dim, dim_groups in program.groups.items():
            groups.setdefault(dim, []).extend(tuple(r + first for r in g) for g in dim_groups)
        first += program.ranks
    has_steps = any(p.steps for p in programs)
    return Program(
        ops=tuple(ops for p in programs for ops in p.ops),
        groups={dim: tuple(g) for dim, g in groups.items()},
        static_memory=tuple(m for p in programs for m in p.static_memory),
        model_flops=sum(p.model_flops for p in programs),
        tokens=sum(p.tokens for p in programs),
        stage=tuple(s for p in programs for s in (p.stage or (0,) * p.ranks)),
        steps=tuple(s for p in programs for s in (p.steps or ((),) * p.ranks))
        if has_steps else (),
    )


def leading(program: Program, ranks: int) -> Program:
    """The merged ``program``'s first ``ranks`` ranks (its training jobs) as a
    program for the summary: their ops, memory and stages, its FLOPs and tokens
    (all its ranks: the program itself)."""
    if ranks == program.ranks:
        return program
    return Program(ops=program.ops[:ranks], groups={},
                   static_memory=program.static_memory[:ranks],
                   model_flops=program.model_flops, tokens=program.tokens,
                   stage=program.stage[:ranks])
