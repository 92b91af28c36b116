"""Scenario files: strict loading into immutable specs.

A scenario is YAML with the sections ``cluster``, ``model``, ``training``,
``parallelism``, ``network`` and ``simulation`` (see the README for every key),
each checked by the module and the specs it configures (``config.cluster``,
``config.model``, ``config.training``, ``config.network``,
``config.simulation``). Loading is strict:
an unknown key, a wrong type, a value with a missing or wrong unit, or an
impossible combination raises ``ScenarioError`` whose one-line message names
the dotted key, the value and what is allowed. Nothing runs before the whole
scenario has been checked.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.base.fields import ScenarioError, fail, integer, schema_of, section, setting, text
from simulator.base.fields import unknown as unknown_key
from simulator.base.user_files import finite_numbers, read_yaml, text_keys, user_path
from simulator.collectives.nccl import Algorithm, Protocol
from simulator.collectives.states import FabricStates
from simulator.config.cluster import Machine, machine_from
from simulator.config.jobs import jobs_from
from simulator.config.model import model_from
from simulator.config.network import network_from
from simulator.config.overrides import apply_overrides
from simulator.config.simulation import SimulationSpec, simulation_from
from simulator.config.training import check_layout, parallel_from, training_from  # noqa: F401 (re-exported)
from simulator.config.workload import Workload, traced, training_of
from topologies import ClusterSpec, GpuSpec
from workloads.jobs import JobSpec
from workloads.models import ModelSpec
from workloads.training import ParallelSpec, TrainingSpec

__all__ = ["Machine", "Scenario", "ScenarioError", "apply_overrides", "from_dict", "load",
           "machine_from", "network_from", "read_raw", "resolved"]



@dataclass(frozen=True)
class ScenarioHead:
    """The scenario's own keys, beside its sections."""

    name: str = setting(text, "scenario")  # names the run (and its default folder runs/NAME)
    seed: int = setting(integer(0), 0)  # every random draw's seed: same seed, same trace


TOP_LEVEL = schema_of(ScenarioHead)
SECTIONS = ("cluster", "model", "training", "network", "parallelism", "simulation", "jobs",
            "workload")


@dataclass(frozen=True)
class Scenario:
    """A checked scenario: everything a run needs, in SI units."""

    name: str
    seed: int
    machine: Machine
    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    algorithm: Algorithm | None  # None: chosen per call, like NCCL's tuner
    protocol: Protocol | None
    step_model: str  # "pipelined" (NCCL's chunk pipelining) or "lockstep" ring steps
    source: Mapping[str, Any]  # the scenario as written, with overrides applied
    simulation: SimulationSpec = SimulationSpec()  # how it is simulated (config.simulation)
    # the jobs section's jobs on the cluster (config.jobs; none: a plain scenario); model,
    # training and parallel are then the first training job's
    job_section: tuple[JobSpec, ...] = ()
    workload: Workload | None = None  # a program read from Chakra traces (config.workload)

    @property
    def jobs(self) -> tuple[JobSpec, ...]:
        """The set of jobs a run simulates: the jobs section's, or a plain scenario's
        one training job (its model, training and parallelism on every node)."""
        return self.job_section or (JobSpec(self.name, tuple(range(self.machine.nodes)),
                                            self.model, self.training, self.parallel,
                                            workload=self.workload),)

    @property
    def fold_ranks(self) -> bool:
        """Simulate one rank per pipeline stage (identical ranks)."""
        return self.simulation.fold_ranks

    @property
    def gangs(self) -> bool:
        """Run each tensor-parallel group as one process, in lockstep."""
        return self.simulation.tensor_parallel_gangs

    @property
    def layer_spans(self) -> bool:
        """One compute span per layer, phase and micro-batch."""
        return self.simulation.span_detail == "layer"

    @property
    def symmetry(self) -> str:
        return self.simulation.symmetry

    @property
    def jitter(self) -> str:
        return self.simulation.jitter

    @property
    def contention_passes(self) -> int:
        return self.simulation.contention_passes

    @property
    def cluster(self) -> ClusterSpec:
        return self.machine.cluster

    @property
    def gpu(self) -> GpuSpec:
        return self.machine.gpu

    @property
    def gpus(self) -> int:
        return self.machine.gpus

    @property
    def compute_jitter(self) -> float:
        return self.machine.compute_jitter

    def fabric_states(self) -> FabricStates:
        """The cluster's fabric in each state of a run (faults at given times), each
        with its lowering under the ``network`` settings, and the healthy fabric's
        lowering: built here for the run, blame and the estimate alike."""
        machine = self.machine
        return FabricStates.build(
            machine.build_graph(), machine.changes, algorithm=self.algorithm,
            protocol=self.protocol, lockstep=self.step_model == "lockstep",
            healthy_graph=machine.healthy_graph if machine.healthy is not None else None)


def from_dict(raw: object, base_dir: Path | None = None) -> Scenario:
    """Check a parsed scenario and build its specs; raises ScenarioError.

    ``base_dir`` resolves a relative ``cluster.fabric.path`` (the scenario
    file's folder when loading a file).
    """
    if not isinstance(raw, dict):
        raise fail("scenario", raw, "must be a mapping with cluster, model, training, "
                                     "parallelism")
    raw = original = text_keys(raw, "")
    allowed = {**TOP_LEVEL, **{k: None for k in SECTIONS}}
    for key in raw:
        if key not in allowed:
            raise unknown_key("", key, allowed)
    finite_numbers(raw, "")
    top = section("", {k: v for k, v in raw.items() if k in TOP_LEVEL}, TOP_LEVEL)
    machine = machine_from(raw.get("cluster"), base_dir)
    algorithm, protocol, step_model = network_from(raw.get("network"), machine)
    jobs = _jobs(raw, machine, top["seed"], base_dir)
    workload, raw = traced(raw, machine.gpus, base_dir, also=("jobs",))
    if jobs:
        first = next(j for j in jobs if j.background is None)
        model, training, parallel = first.model, first.training, first.parallel
    else:
        training = training_of(workload, raw.get("training"), machine.gpu)
        model = model_from(raw.get("model"), base_dir)
        parallel = parallel_from(raw.get("parallelism"), machine.gpus,
                                 machine.gpus // max(1, machine.nodes), machine.cluster.domain)
        check_layout(model, training, parallel, raw.get("parallelism"))
    simulation = simulation_from(raw.get("simulation"), machine, jobs)
    return Scenario(
        name=top["name"], seed=top["seed"], machine=machine, model=model, training=training,
        parallel=parallel,
        algorithm=algorithm, protocol=protocol, step_model=step_model,
        source=resolved(original, base_dir), simulation=simulation, job_section=jobs,
        workload=workload)


# keys that name a file, relative to the scenario's folder (a job's model keys too)
FILE_KEYS = (("cluster", "fabric", "path"), ("cluster", "calibration"), ("workload", "chakra"),
             ("cluster", "kernel_table"), ("model", "hf_config"), ("model", "routing_histogram"))
NOT_FILES = ("none",)  # kernel_table: none (the roofline alone)


def resolved(raw: Mapping[str, Any], base_dir: Path | None) -> dict[str, Any]:
    """``raw`` with every file it names as an absolute path (a relative one taken
    from ``base_dir``, the scenario file's folder): a scenario written elsewhere
    (a run directory's ``scenario.yaml``, the search's ``best.yaml``) still
    finds its files."""
    out = copy.deepcopy(dict(raw))
    if base_dir is None:
        return out
    trees = [out, *(j for j in (out.get("jobs") or {}).values() if isinstance(j, dict))]
    for tree in trees:
        for keys in FILE_KEYS:
            node = tree
            for key in keys[:-1]:
                node = node.get(key) if isinstance(node, dict) else None
            value = node.get(keys[-1]) if isinstance(node, dict) else None
            if isinstance(value, str) and value.strip().lower() not in NOT_FILES:
                node[keys[-1]] = os.path.abspath(user_path(value, base_dir))
    return out


def _jobs(raw: dict, machine: Machine, seed: int, base_dir: Path | None) -> tuple:
    """The ``jobs`` section's jobs (none without one), which replaces the top-level
    model, training and parallelism sections."""
    if raw.get("jobs") is None:
        return ()
    given = [k for k in ("model", "training", "parallelism") if raw.get(k) is not None]
    if given:
        raise fail(given[0], raw[given[0]], "cannot be given beside jobs: each job has its own "
                                            "model, training and parallelism")
    return jobs_from(raw["jobs"], machine, seed, base_dir)


def load(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read, override and check a scenario file."""
    return from_dict(apply_overrides(read_raw(path), overrides), base_dir=Path(path).parent)


def read_raw(path: str | Path) -> dict[str, Any]:
    """A scenario file as a dict (``name`` defaults to the file's stem), unchecked."""
    file = Path(path)
    raw = read_yaml(file, "scenario file")
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping of sections, not "
                            f"{type(raw).__name__}")
    raw.setdefault("name", file.stem)
    return raw
