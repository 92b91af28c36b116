"""The ``jobs`` section: several jobs on one cluster, each a training job (its
own ``model``, ``training`` and ``parallelism`` sections) or background
traffic, and where each runs (``topologies.placement``).

```yaml
jobs:
  train-a: {nodes: 4, placement: contiguous, model: ..., training: ..., parallelism: ...}
  train-b: {nodes: [4, 6, 8, 10], model: ..., training: ..., parallelism: ...}
  checkpoints: {kind: background, traffic: storage, nodes: 2, rate: "5 GB/s"}
```

Jobs are a mapping by name, so ``--set jobs.train-b.placement=scattered``
reaches any key. A job's errors name it: ``jobs.train-b: parallelism: ...``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.base.fields import (
    ScenarioError,
    choice,
    fail,
    integer,
    schema_of,
    section,
    setting,
)
from simulator.config.cluster import Machine
from simulator.config.model import model_from
from simulator.config.training import check_layout, parallel_from
from simulator.config.workload import traced, training_of
from topologies.placement import POLICIES, PlacementError, place
from workloads.background import BackgroundSpec
from workloads.jobs import JobSpec

TRAINING_KEYS = ("model", "training", "parallelism")
MIN_PERIOD = 1e-6  # s between a background GPU's messages, at least: NCCL's per-call
# latency is several microseconds, so closer messages only queue


def _nodes(path: str, value: object) -> object:
    """a node count or a list of node indices"""
    return value  # (checked with the placement: ``_head``)


@dataclass(frozen=True)
class JobHead:
    """A job's own keys in ``jobs.NAME``, beside its sections (a training job's
    model, training and parallelism; background traffic's ``BackgroundSpec``)."""

    nodes: object = setting(_nodes, required=True)  # how many servers, or which (indices)
    # how a node count is placed (default contiguous; a list of nodes places itself)
    placement: str | None = setting(choice(POLICIES), None)
    kind: str = setting(choice(["training", "background"]), "training")  # what the job is


PLACEMENT = schema_of(JobHead)
BACKGROUND = schema_of(BackgroundSpec)


def jobs_from(raw: object, machine: Machine, seed: int,
              base_dir: Path | None = None) -> tuple[JobSpec, ...]:
    """Check a ``jobs:`` section on ``machine`` and place its jobs."""
    if not isinstance(raw, dict) or not raw:
        raise fail("jobs", raw, "must be a mapping of job names to jobs (each with nodes and "
                                "a model, training and parallelism, or kind: background)")
    for name in raw:
        if not str(name).strip():
            raise fail("jobs", name, "is not a job name: a job needs a name of at least one "
                                     "character other than spaces")
    heads = {str(name): _head(f"jobs.{name}", job) for name, job in raw.items()}
    requests = [(name, want, policy) for name, (want, policy, _) in heads.items()]
    try:
        nodes = place(requests, machine.nodes, seed)
    except PlacementError as error:
        raise ScenarioError(f"jobs: {error}") from None
    per_node = machine.gpus // max(1, machine.nodes)
    jobs = []
    for (name, (_, _, kind)), where in zip(heads.items(), nodes, strict=True):
        body = {k: v for k, v in raw[name].items() if k not in PLACEMENT}
        try:
            if kind == "background":
                jobs.append(JobSpec(name, where, background=_background(body, len(where))))
            else:
                jobs.append(_training(name, body, where, machine, per_node, base_dir))
        except ScenarioError as error:
            raise ScenarioError(f"jobs.{name}: {error}") from None
    if all(j.background is not None for j in jobs):
        raise fail("jobs", list(raw), "needs at least one training job beside background "
                                      "traffic")
    return tuple(jobs)


def _head(path: str, job: object) -> tuple[int | tuple[int, ...], str, str]:
    """A job's node count or node list, its placement policy and its kind."""
    if not isinstance(job, dict):
        raise fail(path, job, "must be a mapping with nodes and the job's sections")
    head = section(path, {k: v for k, v in job.items() if k in PLACEMENT}, PLACEMENT)
    nodes = head["nodes"]
    if isinstance(nodes, list) and nodes and all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in nodes):
        if len(set(nodes)) != len(nodes):
            raise fail(f"{path}.nodes", nodes, "lists a node twice")
        if head["placement"] is not None:
            raise fail(f"{path}.placement", head["placement"], "cannot be given with a list of "
                                                               "nodes (the list places the job)")
        return tuple(nodes), "given", head["kind"]
    count = integer(1)(f"{path}.nodes", nodes) if not isinstance(nodes, list) else None
    if count is None:
        raise fail(f"{path}.nodes", nodes, "must be a node count or a list of node indices")
    return count, head["placement"] or "contiguous", head["kind"]


def _background(body: dict[str, Any], nodes: int) -> BackgroundSpec:
    for key in ("servers", "direction"):
        if body.get("traffic") == "all_to_all" and key in body:
            raise fail(key, body[key], "is a key of storage traffic (traffic: storage), not "
                                       "of an all-to-all")
    values = section("", body, BACKGROUND)
    if values["traffic"] == "storage" and values["servers"] >= nodes:
        raise fail("servers", values["servers"], f"must leave client nodes among the job's "
                                                 f"{nodes} node(s)")
    spec = BackgroundSpec(**values)
    if spec.period < MIN_PERIOD:
        raise fail("message", body.get("message", "4 MiB"),
                   f"at {body['rate']} is a message every {spec.period * 1e9:.3g} ns; a run "
                   f"simulates each message, and ones closer than {MIN_PERIOD * 1e6:g} us "
                   "queue behind each call's latency: give a larger message or a lower rate")
    return spec


def _per_domain(nodes: tuple[int, ...], per_node: int, domain: int) -> int:
    """Consecutive ranks of a job on ``nodes`` (in that order) that share an NVLink
    domain of ``domain`` GPUs: the job's GPUs in each domain it touches when every
    one holds as many and its nodes run domain by domain (16 trays of each rack
    give 64), else a server's.

    >>> _per_domain(tuple(range(16)) + tuple(range(18, 34)), 4, 72)
    64
    >>> _per_domain((0, 20, 1), 4, 72)
    4
    """
    domains = [n * per_node // domain for n in nodes]
    counts = {d: domains.count(d) * per_node for d in domains}
    ordered = all(a <= b for a, b in zip(domains, domains[1:], strict=False))
    return counts[domains[0]] if ordered and len(set(counts.values())) == 1 else per_node


def _training(name: str, body: dict[str, Any], nodes: tuple[int, ...], machine: Machine,
              per_node: int, base_dir: Path | None) -> JobSpec:
    allowed = {*TRAINING_KEYS, "workload"}
    for key in body:
        if key not in allowed:
            raise fail(key, body[key], "is not a key of a training job (nodes, placement, kind, "
                                       "model, training, parallelism, or workload)")
    gpus = per_node * len(nodes)
    workload, body = traced(body, gpus, base_dir, whose=(  # (Chakra traces)
        f"the job has {gpus} GPUs ({len(nodes)} of the cluster's {machine.nodes} nodes, "
        f"{machine.gpus} GPUs)"))
    training = training_of(workload, body.get("training"), machine.gpu)
    model = model_from(body.get("model"), base_dir)
    parallel = parallel_from(body.get("parallelism"), per_node * len(nodes), per_node,
                             _per_domain(nodes, per_node, machine.cluster.domain))
    check_layout(model, training, parallel, body.get("parallelism"))
    return JobSpec(name, nodes, model, training, parallel, workload=workload)
