"""Which ranks to simulate: the fastest method that is exact, chosen by default.

With ``simulation.symmetry: auto`` (the default) and no per-rank randomness
(``cluster.compute_jitter`` 0), the ranks of each tensor-parallel group run
as one gang (``simulator.engine.gangs``): they run one program on identical
inputs, so one process can stand for them while every group's collectives and
messages still run on the fabric. The gang checks its own exactness as it
runs (every mate's ops end when the representative's do); at the first mate
that diverges, as on an asymmetric fabric, the gang run stops and the runner
simulates every rank instead, and says so. ``simulation.symmetry: full``
always simulates every rank (for checking); ``simulation.fold_ranks`` and
``simulation.tensor_parallel_gangs`` force a method.

The result says what was done: ``"128 of 1,024 ranks simulated, exact by
symmetry (tensor-parallel gangs, mates verified in lockstep)"`` or ``"all
ranks: compute jitter breaks symmetry"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from simulator.base.ir import Program
from simulator.config.scenario import Scenario
from simulator.engine.exclusive import exclusive_dimensions
from simulator.engine.gangs import tensor_parallel_gangs
from simulator.network.fabric import Fabric


@dataclass(frozen=True)
class Method:
    """The engine plug-ins for a run, and why."""

    plugins: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)
    automatic: bool = False  # chosen by symmetry: falls back to every rank if inexact
    full_because: str = ""  # why every rank is simulated ("" when fewer are)


def choose(scenario: Scenario, program: Program, placement: list[str], fabric: Fabric,
           batch_compute: bool = True) -> Method:
    """The plug-ins for ``scenario``: compute planning (batching, or layer spans),
    then the fastest exact rank reduction the scenario allows."""
    base = _planning(scenario, batch_compute)
    if scenario.fold_ranks:
        return Method((*base, "folding"))
    if scenario.gangs:
        return _gangs(base, program, placement, fabric, automatic=False)
    why = _why_full(scenario, program, batch_compute)
    if why:
        return Method(base, full_because=why)
    return _gangs(base, program, placement, fabric, automatic=True)


def full(scenario: Scenario, batch_compute: bool, because: str) -> Method:
    """Every rank, with the usual compute planning."""
    return Method(_planning(scenario, batch_compute), full_because=because)


def _planning(scenario: Scenario, batch_compute: bool) -> tuple[str, ...]:
    """The compute-planning plug-in: layer spans, batching, or none (the reference)."""
    return ("layer_spans",) if scenario.layer_spans else ("batching",) if batch_compute else ()


def _why_full(scenario: Scenario, program: Program, batch_compute: bool) -> str:
    if scenario.symmetry == "full":
        return "simulation.symmetry is full"
    if not batch_compute:
        return "the reference engine (one event per kernel) was asked for"
    if scenario.compute_jitter > 0:
        return "compute jitter breaks symmetry"
    if not any(len(group) > 1 for group in program.groups.get("tp", ())):
        return "no tensor-parallel groups to share a process"
    return ""


def _gangs(base: tuple[str, ...], program: Program, placement: list[str], fabric: Fabric,
           automatic: bool) -> Method:
    options: dict[str, Any] = {"represents": tensor_parallel_gangs(program),
                               "strict": automatic}  # automatic: stop at a divergence
    exclusive = exclusive_dimensions(program, fabric, placement)
    if exclusive:
        options["exclusive"] = exclusive
    return Method((*base, "gangs", *(("exclusive_links",) if exclusive else ())), options,
                  automatic)


def describe(method: Method, simulated: int, ranks: int, inexact: str | None
             ) -> tuple[str, bool]:
    """(the line that says what was simulated, whether it is exact)."""
    if method.full_because:
        return f"all {ranks:,} ranks: {method.full_because}", True
    of = f"{simulated:,} of {ranks:,} ranks simulated"
    if "folding" in method.plugins:
        return (f"{of} (simulation.fold_ranks: one rank per program; exact when the folded "
                "ranks' groups use disjoint links, which is not checked)"), False
    if inexact:
        return f"{of}, not exact: {inexact}", False
    how = "automatic" if method.automatic else "simulation.tensor_parallel_gangs"
    return (f"{of}, exact by symmetry (tensor-parallel gangs, {how}; mates verified in "
            "lockstep)"), True
