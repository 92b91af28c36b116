"""The loops that run the engine until its result holds, each a named strategy.

- ``Lockstep``: a run by symmetry that finds a class of ranks diverging
  (``NotInLockstep``) splits that class (``symmetry.refine``) and runs again,
  until every class stays in lockstep (or every rank runs).
- ``settle``: compute slowed by NCCL kernels beside it, solved as a fixed point
  over runs (``contention.solve``), each pass a ``Lockstep`` run; the run's
  lengths to settle are its training jobs' (``jobs.lengths``).

Around them, ``jobs.run_all`` runs the scenario's set of jobs: several, each
training job alone first, then together, background traffic lengthened until
it outlasts them; a plain scenario's one job, once.
"""

from __future__ import annotations

import gc
from collections.abc import Callable

import numpy as np
import pandas as pd

from simulator.engine.records import NotInLockstep
from simulator.runner import contention, jobs, symmetry
from simulator.runner.result import span_table
from simulator.runner.setup import Setup


class Lockstep:
    """Runs the engine with a method; where a class of ranks diverged, splits it
    and runs again. ``method`` is the one the last run used."""

    def __init__(self, setup: Setup, method: symmetry.Method, batch_compute: bool) -> None:
        self.setup, self.method, self.batch_compute = setup, method, batch_compute

    def __call__(self, durations: Callable[[int], np.ndarray]):
        setup = self.setup
        fabrics = setup.fabrics
        while True:
            try:
                return self.method.engine(
                    setup.program, setup.placement, durations, fabrics.fabric,
                    fabrics.lowering, clocks=setup.clocks, changes=fabrics.changes).run()
            except NotInLockstep as diverged:  # a class's ranks diverged: split, run again
                gc.collect()  # the stopped run's processes (cycles) while the collector is off
                self.method = symmetry.refine(setup.scenario, self.method, diverged,
                                              self.batch_compute, setup.program.groups)


def settle(setup: Setup, method: symmetry.Method, batch_compute: bool
           ) -> tuple[symmetry.Method, object, pd.DataFrame, contention.Contention]:
    """Run until the slow-down of compute beside NCCL is settled (one run where
    there is none): (the method of the last run, its engine result, its spans,
    how the slow-down was solved)."""
    scenario = setup.scenario
    lockstep = Lockstep(setup, method, batch_compute)
    result, spans, slowdown = contention.solve(
        lockstep, lambda r: span_table(r, setup.nodes), setup.program,
        _work(setup, lockstep), scenario.gpu.overlap_slowdown, scenario.contention_passes,
        jobs.lengths(setup.placed))
    return lockstep.method, result, spans, slowdown


def _work(setup: Setup, lockstep: Lockstep) -> Callable[[int], np.ndarray]:
    """rank -> its ops' durations alone under the method running now (a class's
    slowest member's with approximate jitter), made once per method."""
    made: dict = {}
    scenario = setup.scenario

    def work(rank: int) -> np.ndarray:
        if made.get("method") is not lockstep.method:
            made.update(method=lockstep.method, durations=lockstep.method.durations(
                setup.program, setup.durations, scenario.seed, scenario.compute_jitter))
        return made["durations"](rank)
    return work
