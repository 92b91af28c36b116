"""A run's setup: everything the engine needs, made once from the scenario.

The program (the scenario's set of jobs merged, each job's block of ranks), the
fabric in each state with its lowering (``Scenario.fabric_states``), where each
rank runs, each GPU's speed factor and throttle clock, and each rank's compute
durations (kernel table, slow GPUs, host-bound launches). Nothing here runs
the engine; the method (``symmetry``), the loops (``loops``) and the result
(``result``) read a ``Setup``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.base import footprint
from simulator.base.ir import HOST_KERNELS, Program
from simulator.collectives.states import FabricStates
from simulator.compute import stragglers, throttle
from simulator.compute.host import host_bound_waits
from simulator.compute.host_costs import HostPlan
from simulator.compute.model import ComputeModel
from simulator.config.scenario import Scenario
from simulator.runner import jobs, symmetry
from workloads.jobs import Placed


@dataclass
class Setup:
    """What one run simulates, on what, and how long each op takes alone."""

    scenario: Scenario
    program: Program
    placed: list[Placed]  # each job's block of ranks (a plain scenario: its one job's)
    fabrics: FabricStates
    placement: list[str]  # each rank's GPU
    nodes: list[int]  # each rank's server, as cluster.nodes counts them
    computing: int  # the leading ranks that train (the rest: background traffic)
    speed: np.ndarray | None  # each rank's GPU's speed factor (None: all full speed)
    throttled: dict  # rank -> its GPU's throttle schedule
    clocks: dict | None  # rank -> its throttle clock
    model: ComputeModel  # the kernel timing of the scenario's (first) training job
    durations: Any  # rank -> its ops' durations alone (``durations_of``)

    @property
    def pace(self) -> list | None:
        """What sets each rank's speed (``symmetry.pace_of``)."""
        return symmetry.pace_of(self.speed, self.throttled, self.program.ranks)


def prepare(scenario: Scenario, batch_compute: bool, background_s: float = 0.0) -> Setup:
    """The setup of ``scenario`` (``background_s``: how long background traffic
    without a duration lasts), its size checked before anything large is made."""
    program, placed = jobs.programs(scenario, background_s)
    footprint.check_fabric(scenario.gpus, "cluster.nodes", scenario.machine.nodes)
    if symmetry.why_full(scenario, program, batch_compute):  # every rank will run
        footprint.check_run(program, None)
    fabrics = scenario.fabric_states()
    placement = jobs.placement(placed, fabrics.gpus, fabrics.fabric.tray_of)
    nodes = [fabrics.fabric.tray_of(g) for g in placement]
    computing = jobs.training_ranks(placed)
    speed, throttled = _speeds(scenario, program, fabrics.gpus, placement, nodes,
                               computing)
    model = compute_model(scenario)
    durations = jobs.durations(placed, program, scenario, speed, durations_of)
    clocks = {r: throttle.Clock(s) for r, s in throttled.items()} or None
    return Setup(scenario, program, placed, fabrics, placement, nodes, computing, speed,
                 throttled, clocks, model, durations)


def _speeds(scenario: Scenario, program: Program, gpus: list[str],
            placement: list[str], nodes: list[int], computing: int
            ) -> tuple[np.ndarray | None, dict]:
    """Each rank's GPU's fixed speed factor (``compute.stragglers``; background
    traffic's ranks at 1) and the training ranks' throttle schedules."""
    machine = scenario.machine
    index = {g: k for k, g in enumerate(gpus)}
    gpu_of = [index[g] for g in placement[:computing]]
    speed = stragglers.factors(machine.slow, machine.gpu_speed_spread, scenario.seed,
                               nodes[:computing], gpu_of)
    if speed is not None:
        speed = np.concatenate([speed, np.ones(program.ranks - computing)])
    throttled = throttle.schedules(machine.throttle, nodes[:computing], gpu_of)
    return speed, throttled


def compute_model(scenario: Scenario) -> ComputeModel:
    return ComputeModel.for_training(scenario.gpu, scenario.training,
                                     scenario.parallel.framework.value,
                                     scenario.machine.cluster.host_rates())


def durations_of(program: Program, model: ComputeModel, host: HostPlan | float = 0.0,
                 speed=None):
    """A function rank -> compute duration of each of its ops without jitter
    (shared by the ranks of one program and speed), kernels slowed by the rank's
    GPU's ``speed`` factor (``compute.stragglers``; None: all 1), host-bound
    kernels stretched (``compute.host``: the job's ``HostPlan``, or seconds of
    host time per kernel, which a slow GPU does not change). Its ``host_stall``
    is a rank's total of launch waits, its ``host_waits`` each op's (None: none)."""
    base: dict[tuple, Any] = {}
    stalls: dict[tuple, float] = {}
    waits: dict[tuple, np.ndarray | None] = {}

    def key(rank: int) -> tuple:
        return id(program.ops[rank]), 1.0 if speed is None else float(speed[rank])

    def durations(rank: int):
        k = key(rank)
        if k not in base:
            ops = program.ops[rank]
            steps = program.steps[rank] if program.steps else ()
            kernels = model.durations(ops)
            if k[1] != 1.0:  # a slow GPU's kernels; its copies and host work keep their pace
                kernels *= np.where([op.kernel in HOST_KERNELS for op in ops], 1.0, k[1])
            base[k], waits[k] = host_bound_waits(ops, steps, kernels, host)
            stalls[k] = float(base[k].sum() - kernels.sum())
        return base[k]

    def host_waits(rank: int) -> np.ndarray | None:
        durations(rank)
        return waits[key(rank)]

    durations.host_stall = lambda rank: stalls.get(key(rank), 0.0)
    durations.host_waits = host_waits
    return durations
