"""One run of a scenario, from setup to result, in order: ``run``.

The scenario's set of jobs (``jobs.run_all``: a plain scenario's one job runs
once; several, each training job alone first), and for each run: setup
(``setup.prepare``), method (``symmetry.choose``, with the memory check of the
ranks it simulates), the loops (``loops.settle``: lockstep refinement inside
the slow-down's fixed point), result (``result.assemble``).
"""

from __future__ import annotations

import gc
import time
from contextlib import contextmanager

from simulator.base import footprint
from simulator.config.scenario import Scenario
from simulator.runner import jobs, loops, symmetry
from simulator.runner.result import RunResult, assemble
from simulator.runner.setup import Setup, prepare


def run(scenario: Scenario, *, batch_compute: bool = True) -> RunResult:
    """Simulate one training iteration of ``scenario``.

    ``batch_compute=False`` makes the engine spend one event per kernel; the
    trace is the same (a test checks it), only slower.
    """
    with _collector_paused():
        return jobs.run_all(scenario, lambda s, reach, alone=None: simulate(
            s, batch_compute, reach, alone or {}))


def simulate(scenario: Scenario, batch_compute: bool, background_s: float = 0.0,
             alone: dict | None = None) -> RunResult:
    """One run of ``scenario`` (``background_s``: how long background traffic
    without a duration lasts; ``alone``: each training job's time alone)."""
    wall = time.perf_counter()
    setup = prepare(scenario, batch_compute, background_s)
    method = _method(setup, batch_compute)
    method, result, spans, slowdown = loops.settle(setup, method, batch_compute)
    return assemble(setup, method, result, spans, slowdown, alone or {}, wall)


def _method(setup: Setup, batch_compute: bool) -> symmetry.Method:
    """The method for ``setup``, the memory of the ranks it simulates checked."""
    program, pace = setup.program, setup.pace
    method = symmetry.choose(setup.scenario, program, setup.placement, setup.fabrics.fabric,
                             batch_compute, pace, clocked=setup.clocks is not None,
                             fabric_changes=bool(setup.fabrics.changes))
    if not method.full_because:  # (every rank's ops were checked in the setup)
        footprint.check_run(program, method.simulated_ranks(program))
    elif pace is not None:  # every rank for its GPUs' speeds: not checked in the setup
        footprint.check_run(program, None)
    return method


@contextmanager
def _collector_paused():
    """Pause Python's cyclic garbage collector (restoring its state after).

    A large run holds millions of span tuples; every full collection would scan
    them all to find nothing (spans hold no cycles), which cost a fifth of a
    1024-GPU run. Reference counting still frees everything as usual; cycles
    made meanwhile (SimPy's processes) are collected once the collector resumes.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
