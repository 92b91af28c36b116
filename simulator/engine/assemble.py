"""The engine a run uses: the reference core plus the chosen plug-ins.

Each plug-in is a subclass of ``Engine`` in its own module; an engine with
several is the class that inherits from all of them (Python's method order
chains their hooks). ``PLUGINS`` is the registry: adding a speed-up is one
module and one line here, plus its equivalence test. ``NEEDS`` and ``EXCLUDES``
are the rules of a plan (which plug-ins go together), ``valid_plans()`` every
plan they allow: the method choice builds no other, and the equivalence test
runs each one. A ``Plan`` is typed: its plug-ins and their settings (the
classes gangs run, from ``program_classes`` or ``tensor_parallel_gangs``,
published here for the method choice; the dimensions exclusive links settle
alone); it builds its engine and says which ranks it runs. A run reads a
plan's result through ``records.EngineResult`` (``expand`` for the ranks it
stood for, ``replayed`` for the steps it replayed), never a plug-in's own
records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from types import MappingProxyType
from typing import Any

from simulator.base.ir import Program
from simulator.engine.batching import BatchedCompute
from simulator.engine.call_groups import CallGroups
from simulator.engine.core import Engine
from simulator.engine.exclusive import ExclusiveLinks
from simulator.engine.folding import Folding, first_of_each_program
from simulator.engine.gangs import Gangs, program_classes, tensor_parallel_gangs
from simulator.engine.layer_spans import LayerSpans
from simulator.engine.passes import Passes
from simulator.engine.pipeline_streams import PipelineStreams
from simulator.engine.records import SimulationError

PLUGINS: Mapping[str, type[Engine]] = MappingProxyType({
    # outermost first: a plug-in listed earlier overrides the hooks of later ones
    "pipeline_streams": PipelineStreams,  # needs passes: compute and pipeline streams driven
    "passes": Passes,  # needs exclusive_links and Program.steps: replays pipeline steps
    "exclusive_links": ExclusiveLinks,  # needs gangs: settles calls a gang fills alone
    "call_groups": CallGroups,  # needs gangs: a gang's whole groups' calls as one batch
    "gangs": Gangs,
    "folding": Folding,
    "layer_spans": LayerSpans,  # includes batching
    "batching": BatchedCompute,
})
__all__ = ("PLUGINS", "NEEDS", "EXCLUDES", "Plan", "engine_class", "program_classes",
           "tensor_parallel_gangs", "valid", "valid_plans")  # the engine's API for a run


# What a plan may hold: each plug-in's needs (every one listed must be in the plan
# too), and plug-ins that never go together. The method choice
# (``runner.symmetry.choose``) builds only ``valid_plans()``, and the
# equivalence test runs each of them against the reference core.
NEEDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "pipeline_streams": ("passes",),
    # (and the program's pipeline steps; the choice always drives the streams too)
    "passes": ("exclusive_links", "batching", "pipeline_streams"),
    "exclusive_links": ("gangs",),
    "call_groups": ("gangs",),
    "gangs": ("call_groups",),  # (a gang's calls on whole groups always batched)
})
EXCLUDES: tuple[frozenset[str], ...] = (
    frozenset({"folding", "gangs"}),  # two ways of running fewer ranks
    frozenset({"layer_spans", "batching"}),  # layer spans batch compute their own way
)


def valid(names: tuple[str, ...] | frozenset[str]) -> bool:
    """Whether a set of plug-ins is a plan a run may use (``NEEDS``, ``EXCLUDES``).

    >>> valid(("batching", "gangs")), valid(("batching", "gangs", "call_groups"))
    (False, True)
    """
    names = frozenset(names)
    return (all(set(NEEDS.get(n, ())) <= names for n in names)
            and not any(pair <= names for pair in EXCLUDES))


@cache
def valid_plans() -> tuple[tuple[str, ...], ...]:
    """Every plan a run may use, each in registry order: the reference, and every
    set of plug-ins ``valid`` accepts.

    >>> len(valid_plans()), valid_plans()[0]
    (13, ())
    """
    plans = []
    for mask in range(2 ** len(PLUGINS)):
        names = tuple(n for k, n in enumerate(PLUGINS) if mask >> k & 1)
        if valid(names):
            plans.append(names)
    return tuple(sorted(plans, key=lambda p: (len(p), p)))


@dataclass(frozen=True)
class Plan:
    """A run's engine plan, typed: the plug-ins (a set ``valid`` accepts) and
    their settings. ``represents`` (gangs): each class's representative and
    the ranks it stands for (``program_classes``, ``tensor_parallel_gangs``);
    ``strict`` (gangs): stop at the first class whose ranks diverge
    (``records.NotInLockstep``); ``exclusive`` and ``late`` (exclusive links):
    the dimensions whose calls may be settled alone and those sharing their
    servers (``link_sharing.exclusive_dimensions``)."""

    plugins: tuple[str, ...] = ()
    represents: Mapping[int, tuple[int, ...]] | None = None
    strict: bool = False
    exclusive: frozenset[str] = frozenset()
    late: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if not valid(self.plugins):  # (the rules: ``NEEDS``, ``EXCLUDES``)
            raise SimulationError(f"internal: the engine plug-ins {self.plugins} are not a "
                                  "valid plan (engine.assemble.valid_plans)")
        if ("gangs" in self.plugins) != (self.represents is not None) or \
                ("exclusive_links" in self.plugins) != bool(self.exclusive):
            raise SimulationError(f"internal: the plan {self.plugins} lacks its settings or "
                                  "has another plug-in's (represents: gangs; exclusive: "
                                  "exclusive_links)")

    def engine(self, *args: Any, **core: Any) -> Engine:
        """This plan's engine on the core's arguments (``Engine``'s: the program,
        placement, durations, fabric, lowering, clocks and changes)."""
        options: dict[str, Any] = {}
        if "gangs" in self.plugins:
            options.update(represents=self.represents, strict=self.strict)
        if "exclusive_links" in self.plugins:
            options.update(exclusive=self.exclusive, late=self.late)
        return engine_class(*self.plugins)(*args, **core, **options)

    def simulated_ranks(self, program: Program) -> list[int] | None:
        """The ranks this plan runs (None: every rank): with rank folding the first
        rank of each program, with gangs each class's representative."""
        if "folding" in self.plugins:
            return first_of_each_program(program)
        return list(self.represents) if self.represents else None


def engine_class(*names: str) -> type[Engine]:
    """The Engine class with the named plug-ins (any order; ``()``: the reference).

    >>> engine_class("batching", "gangs").__mro__[1:3] == (Gangs, BatchedCompute)
    True
    """
    unknown = [n for n in names if n not in PLUGINS]
    if unknown:
        raise ValueError(f"unknown engine plug-in {unknown[0]!r}; known: {', '.join(PLUGINS)}")
    return _composed(tuple(n for n in PLUGINS if n in names))


@cache
def _composed(names: tuple[str, ...]) -> type[Engine]:
    """One class per set of plug-ins, in registry order."""
    if not names:
        return Engine
    return type(f"Engine[{','.join(names)}]", tuple(PLUGINS[n] for n in names), {})
