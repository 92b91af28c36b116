"""Which ranks to simulate: the fastest method that is exact, chosen by default.

With ``simulation.symmetry: auto`` (the default) and no per-rank randomness
(``cluster.compute_jitter`` 0), the ranks that run one op tuple (in Megatron's
layouts, every tensor- and data-parallel rank of a pipeline stage) form a
class, and one process runs each class as a gang (``simulator.engine.gangs``):
it joins every member's own collectives and messages, so every group's flows
still run on the fabric and every call is logged. The gang checks its own
exactness as it runs: every member's op must end when the representative's
does. Where members diverge (the fabric treats them differently, e.g. a data
parallel ring's flow shares an uplink with one replica's pipeline message),
the run finishes, each diverged class is split by the ends its members saw
(``refine``), and the run starts again; after ``MAX_REFINEMENTS`` splits every
rank is simulated. The classes that finish are exact by construction: each
member's timeline equals its representative's, op by op (same program, same
durations, same ends, by induction).

With compute jitter every rank is simulated (each draws its own kernel times),
unless ``simulation.jitter: approximate``: then the classes run as without
jitter, each representative at the pace of its groups' slowest member
(``compute.jitter.slowest_member``), and the result says it is not exact.

``simulation.symmetry: full`` always simulates every rank (for checking);
``simulation.fold_ranks`` and ``simulation.tensor_parallel_gangs`` force a
method. The result says what was done: ``"8 of 1,024 ranks simulated, exact by
symmetry (...)"`` or ``"all ranks: compute jitter breaks symmetry"``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from simulator.base.ir import Program
from simulator.compute.jitter import jitter_factors, slowest_member
from simulator.config.scenario import Scenario
from simulator.engine.assemble import Plan, program_classes, tensor_parallel_gangs
from simulator.engine.link_sharing import exclusive_dimensions
from simulator.engine.records import NotInLockstep
from simulator.network.fabric import Fabric


@dataclass(frozen=True)
class Method(Plan):
    """The engine plan for a run (``engine.assemble.Plan``: its plug-ins, checked
    against the rules, and their typed settings), and why."""

    automatic: bool = False  # chosen by symmetry: refined, or every rank, if inexact
    full_because: str = ""  # why every rank is simulated ("" when fewer are)
    refinements: int = 0  # times the classes were split where ranks diverged
    approximate_jitter: bool = False  # one rank per class stands for jittered ranks

    def durations(self, program: Program, base: Callable[[int], np.ndarray], seed: int,
                  jitter: float) -> Callable[[int], np.ndarray]:
        """A function rank -> its ops' durations under this method: ``base`` times
        the rank's own jitter, or (approximate jitter) the slowest member's
        (``compute.jitter.slowest_member``)."""
        if jitter <= 0.0:
            return base
        if self.approximate_jitter:
            return lambda rank: slowest_member(program, rank, base(rank), seed, jitter)
        def own(rank: int) -> np.ndarray:
            values = base(rank)
            return values * jitter_factors(seed, rank, len(values), jitter)
        return own


MAX_REFINEMENTS = 12  # splits before simulating every rank (each costs one more run)


def choose(scenario: Scenario, program: Program, placement: list[str], fabric: Fabric,
           batch_compute: bool = True, pace: Sequence[Hashable] | None = None,
           clocked: bool = False, fabric_changes: bool = False) -> Method:
    """The plug-ins for ``scenario``: compute planning (batching, or layer spans),
    then the fastest exact rank reduction the scenario allows; with stragglers
    (``pace``: what sets each rank's speed, its slow-down factor and throttle
    schedule) the classes start split by pace. ``clocked``: some GPUs' speeds
    change over time, so pipeline steps are not replayed (their instances differ);
    ``fabric_changes``: the fabric changes during the run, so no call is settled
    ahead at its time alone on the fabric (``exclusive_links``)."""
    base = _planning(scenario, batch_compute)
    replay = scenario.compute_jitter == 0 and not clocked  # jittered steps differ
    if scenario.fold_ranks:
        return Method((*base, "folding"))
    if scenario.gangs:
        return _gangs(base, program, placement, fabric, automatic=False, replay=replay,
                      settle=not fabric_changes)
    why = why_full(scenario, program, batch_compute, pace)
    if why:
        return Method(base, full_because=why)
    method = _gangs(base, program, placement, fabric, automatic=True, replay=replay,
                    settle=not fabric_changes)
    if pace is not None:  # slow GPUs in classes of their own, and their group peers
        method = replace(method, represents=equitable(refined_by(method.represents, pace),
                                                       program.groups))
    return replace(method, approximate_jitter=scenario.compute_jitter > 0)


def pace_of(speed, throttled: dict, ranks: int) -> list | None:
    """What sets each rank's speed (its fixed factor, its throttle schedule), or
    None when every GPU runs at the kernel table's speed."""
    if speed is None and not throttled:
        return None
    return [(1.0 if speed is None else float(speed[r]), throttled.get(r, ()))
            for r in range(ranks)]


def refined_by(represents: dict[int, tuple[int, ...]], pace: Sequence[Hashable]
               ) -> dict[int, tuple[int, ...]]:
    """``represents`` with each class split by its ranks' paces (speed factors).

    >>> refined_by({0: (1, 2, 3)}, [1.0, 1.3, 1.0, 1.3])
    {0: (2,), 1: (3,)}
    """
    out: dict[int, tuple[int, ...]] = {}
    for rep, mates in represents.items():
        parts: dict[Hashable, list[int]] = {}
        for r in (rep, *mates):
            parts.setdefault(pace[r], []).append(r)
        out.update({ranks[0]: tuple(ranks[1:]) for ranks in parts.values()})
    return out


def refine(scenario: Scenario, method: Method, diverged: NotInLockstep,
           batch_compute: bool, groups: Mapping[str, tuple[tuple[int, ...], ...]]) -> Method:
    """The method after an automatic run whose classes diverged: the same plug-ins
    with those classes split by the ends their ranks saw (``diverged.split``) and
    the split carried to the ranks they communicate with (``equitable``), or every
    rank once ``MAX_REFINEMENTS`` splits did not give a run in lockstep."""
    if method.refinements >= MAX_REFINEMENTS:
        return full(scenario, batch_compute, f"{diverged} (after {method.refinements} "
                    "splits of the classes), so symmetry does not hold")
    split = refined(method.represents, diverged.split)
    return replace(method, represents=equitable(split, groups),
                   refinements=method.refinements + 1)


def refined(represents: dict[int, tuple[int, ...]], split: list[tuple[int, ...]]
            ) -> dict[int, tuple[int, ...]]:
    """``represents`` with the class holding ``split``'s ranks replaced by its parts.

    >>> refined({0: (1, 2, 3), 4: (5,)}, [(0, 2), (1, 3)])
    {4: (5,), 0: (2,), 1: (3,)}
    """
    ranks = {r for part in split for r in part}
    out = {rep: mates for rep, mates in represents.items() if rep not in ranks}
    out.update({part[0]: part[1:] for part in split})
    return out


def equitable(represents: dict[int, tuple[int, ...]],
              groups: Mapping[str, tuple[tuple[int, ...], ...]]) -> dict[int, tuple[int, ...]]:
    """``represents`` split until ranks of one class see the same classes in every
    group they belong to (colour refinement over the groups: a pipeline pair, a
    data-parallel group). A rank whose peer diverged is likely to diverge next
    (a late message arrives late), so carrying a split along the groups at once
    saves the runs that would find it one pipeline stage at a time. Splitting
    more never costs exactness: every class is still checked in lockstep.

    >>> equitable({0: (1, 2, 3), 4: (6,), 5: (7,)}, {"pp": ((0, 4), (1, 5), (2, 6), (3, 7))})
    {0: (2,), 1: (3,), 4: (6,), 5: (7,)}
    """
    label = {r: rep for rep, mates in represents.items() for r in (rep, *mates)}
    memberships = [g for dim_groups in groups.values() for g in dim_groups if len(g) > 1]
    while True:
        seen: dict[int, list] = {r: [] for r in label}
        for group in memberships:
            colours = tuple(sorted(label[r] for r in group if r in label))
            for r in group:
                if r in seen:
                    seen[r].append(colours)
        keys = {r: (label[r], tuple(sorted(seen[r]))) for r in label}
        first: dict[tuple, int] = {}
        for r in sorted(label):
            first.setdefault(keys[r], r)
        new = {r: first[keys[r]] for r in label}
        if len(set(new.values())) == len(set(label.values())):
            break
        label = new
    classes: dict[int, list[int]] = {}
    for r in sorted(label):
        classes.setdefault(label[r], []).append(r)
    return {ranks[0]: tuple(ranks[1:]) for ranks in classes.values()}


def full(scenario: Scenario, batch_compute: bool, because: str) -> Method:
    """Every rank, with the usual compute planning."""
    return Method(_planning(scenario, batch_compute), full_because=because)


def _planning(scenario: Scenario, batch_compute: bool) -> tuple[str, ...]:
    """The compute-planning plug-in: layer spans, batching, or none (the reference)."""
    return ("layer_spans",) if scenario.layer_spans else ("batching",) if batch_compute else ()


def why_full(scenario: Scenario, program: Program, batch_compute: bool,
             pace: Sequence[Hashable] | None = None) -> str:
    """Why every rank must be simulated ("" when symmetry may reduce them)."""
    if scenario.symmetry == "full":
        return "simulation.symmetry is full"
    if not batch_compute:
        return "the reference engine (one event per kernel) was asked for"
    if scenario.compute_jitter > 0 and scenario.jitter == "exact":
        return ("compute jitter breaks symmetry (simulation.jitter: approximate runs one "
                "rank per class)")
    if len(program_classes(program)) == program.ranks:
        return "every rank runs a program of its own"
    if pace is not None and len(set(pace)) == program.ranks:
        return "every GPU computes at a speed of its own (cluster.gpu_speed_spread)"
    return ""


def _gangs(base: tuple[str, ...], program: Program, placement: list[str], fabric: Fabric,
           automatic: bool, replay: bool = True, settle: bool = True) -> Method:
    """Gangs, whose calls on whole groups run as one batch (with exclusive links
    where they hold, and pipeline steps replayed from templates where ``replay``:
    every instance of a step kind must take the same time, which per-kernel
    jitter breaks)."""
    represents = program_classes(program) if automatic else tensor_parallel_gangs(program)
    exclusive, late = exclusive_dimensions(program, fabric, placement) if settle else \
        (frozenset(), frozenset())
    passes = ("passes", "pipeline_streams") if replay and exclusive and program.steps and \
        base == ("batching",) else ()
    return Method((*base, "gangs", "call_groups",
                   *(("exclusive_links",) if exclusive else ()), *passes),
                  represents=represents, strict=automatic,  # automatic: stop at a divergence
                  exclusive=exclusive, late=late if exclusive else frozenset(),
                  automatic=automatic)


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
    if method.approximate_jitter:
        return (f"{of}, not exact: compute jitter approximated (simulation.jitter: "
                "approximate; each class runs at the pace of its groups' slowest member)"), False
    if not method.automatic:
        return (f"{of}, exact by symmetry (simulation.tensor_parallel_gangs; mates "
                "verified in lockstep)"), True
    split = (f"; classes split {method.refinements} time(s) where ranks diverged"
             if method.refinements else "")
    return (f"{of}, exact by symmetry (one process per class of ranks with one program, "
            f"verified in lockstep as it ran{split})"), True
