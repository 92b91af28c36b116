"""The ``simulation`` section: how a run is simulated, never what it simulates.

Each key is a setting declared on ``SimulationSpec`` (``base.fields.setting``),
read and checked by the spec like every other section's; ``check`` holds the
rules between them and the cluster. The default is the fast exact path
(``runner.symmetry``); the opt-in approximations and their limits are in
docs/design.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from simulator.base.fields import boolean, choice, fail, integer, schema_of, section, setting


@dataclass(frozen=True)
class SimulationSpec:
    """The ``simulation`` section's settings."""

    # simulate one rank per pipeline stage (its ranks identical: no jitter, no stragglers)
    fold_ranks: bool = setting(boolean, False)
    # run each tensor-parallel group as one process, in lockstep (the same condition)
    tensor_parallel_gangs: bool = setting(boolean, False)
    # kernel: a span per kernel; layer: one compute span per layer, phase and micro-batch
    span_detail: str = setting(choice(["kernel", "layer"]), "kernel")
    # auto: simulate one rank per class where that is exact; full: every rank
    symmetry: str = setting(choice(["auto", "full"]), "auto")
    # exact: every rank's own draws; approximate: one rank per class waits for its slowest
    jitter: str = setting(choice(["exact", "approximate"]), "exact")
    # most runs to solve compute slowed by NCCL beside it (a fixed point)
    contention_passes: int = setting(integer(1), 8)


def simulation_from(raw: object, machine, jobs: tuple = ()) -> SimulationSpec:
    """Check a ``simulation:`` section against the cluster (``machine``) and the
    scenario's ``jobs`` (several: none of the options that assume one)."""
    spec = SimulationSpec(**section("simulation", raw, schema_of(SimulationSpec)))
    fold, gangs = spec.fold_ranks, spec.tensor_parallel_gangs
    for key, on in (("fold_ranks", fold), ("tensor_parallel_gangs", gangs)):
        if on and (machine.compute_jitter > 0 or machine.stragglers):
            raise fail(f"simulation.{key}", True, "needs cluster.compute_jitter 0 and no "
                                                   "cluster.slow, throttle or gpu_speed_spread: it "
                                                   "assumes the ranks it shares are identical")
    if spec.span_detail == "layer" and machine.throttle:
        raise fail("simulation.span_detail", "layer", "cannot be used with cluster.throttle: "
                                                      "a throttled GPU's kernels are timed one "
                                                      "by one (give span_detail: kernel)")
    if jobs and (fold or gangs):
        raise fail("simulation.fold_ranks" if fold else "simulation.tensor_parallel_gangs",
                   True, "cannot be used with jobs (symmetry, the default, reduces each job's "
                         "ranks where it is exact)")
    if fold and gangs:
        raise fail("simulation.tensor_parallel_gangs", True, "cannot be combined with "
                                                              "simulation.fold_ranks; give one")
    return spec
