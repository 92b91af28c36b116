"""Scenario files: strict loading into immutable specs.

A scenario is YAML with the sections ``cluster``, ``model``, ``training``,
``parallelism`` and ``network`` (see the README for every key). Loading is strict: an unknown
key, a wrong type, a value with a missing or wrong unit, or an impossible
combination raises ``ScenarioError`` whose one-line message names the dotted
key, the value and what is allowed. Nothing runs before the whole scenario has
been checked.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from simulator.base import units
from simulator.base.fields import (
    BANDWIDTH,
    EFFICIENCY,
    LATENCY,
    REQUIRED,
    ScenarioError,
    boolean,
    choice,
    fail,
    integer,
    number,
    quantity,
    schema_of,
    section,
    text,
    unknown,
)
from simulator.collectives.nccl import Algorithm, Protocol
from topologies import CLUSTERS, GPUS, ClusterSpec, GpuSpec
from topologies.gpus import GpuFileError, calibrated, check_calibration
from topologies.graph_file import GraphFileError
from topologies.networks import NETWORKS, NetworkSpec
from workloads.hf_config import HfConfigError, model_from_hf
from workloads.layout import parse_order
from workloads.memory import Recompute
from workloads.models import MODELS, Mlp, ModelSpec
from workloads.program import LayoutError, check
from workloads.schedules import Schedule, ScheduleError
from workloads.training import DTYPE_BYTES, FsdpSpec, ParallelSpec, Sharding, TrainingSpec


def _subsection(schema: dict) -> Callable[[str, object], dict[str, Any]]:
    return lambda path, value: section(path, value, schema)


def _layer_list(path: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise fail(path, value, "must be a list of positive integers, one per pipeline stage")
    return tuple(value)


def _order(path: str, value: object) -> str:
    try:
        return "-".join(parse_order(str(value)))
    except ValueError as error:
        raise ScenarioError(f"{path}: {error}") from None


SHARED_NETWORK_KEYS = ("oversubscription", "leaf_ports")  # may also be given on cluster


def _fabric_section(path: str, raw: object) -> dict[str, Any]:
    """A ``cluster.fabric`` section: ``type`` (a kind of ``topologies.networks``) and
    that kind's own settings, checked by the kind's spec."""
    if not isinstance(raw, dict):
        raise fail(path, raw, "must be a mapping of keys to values")
    rest = {k: v for k, v in raw.items() if k != "type"}
    values = {"type": choice(NETWORKS)(f"{path}.type", raw["type"])} if "type" in raw else {}
    if "type" not in raw:  # the kind is the preset's: check against every kind's keys
        schema = {k: v for kind in NETWORKS.values() for k, v in schema_of(kind).items()}
    else:
        schema = schema_of(NETWORKS[values["type"]])
    schema = {k: (check, None) for k, (check, _) in schema.items()}
    given = section(path, rest, schema)
    return {**values, **{k: v for k, v in given.items() if v is not None}}


FSDP_SCHEMA = {
    "sharding": (choice(s.value for s in Sharding), "full_shard"),
    "prefetch": (boolean, True),
    "reshard_after_forward": (boolean, True),
}

SCHEMA: dict[str, dict[str, tuple[Callable[[str, object], Any], object]]] = {
    "cluster": {
        "preset": (choice(CLUSTERS), REQUIRED),
        "nodes": (integer(1), 1),
        "gpu": (choice(GPUS), None),
        "gpus_per_node": (integer(1), None),
        "nvlink_bandwidth": (BANDWIDTH, None),
        "nvlink_latency": (LATENCY, None),
        "nics_per_node": (integer(1), None),
        "nic_bandwidth": (BANDWIDTH, None),
        "pcie_bandwidth": (BANDWIDTH, None),
        "link_latency": (LATENCY, None),
        "oversubscription": (number(1.0, 64.0), None),
        "leaf_ports": (integer(1), None),
        "nvlink_efficiency": (EFFICIENCY, None),
        "nic_efficiency": (EFFICIENCY, None),
        "nvls": (boolean, None),
        "nvls_efficiency": (EFFICIENCY, None),
        "fabric": (_fabric_section, None),
        "compute_jitter": (number(0.0, 1.0), 0.0),
        "calibration": (text, None),
    },
    "model": {
        "preset": (choice(MODELS), None),
        "hf_config": (text, None),
        "layers": (integer(1), None),
        "hidden": (integer(1), None),
        "heads": (integer(1), None),
        "kv_heads": (integer(1), None),
        "ffn_hidden": (integer(1), None),
        "vocab": (integer(1), None),
        "mlp": (choice(m.value for m in Mlp), None),
        "tied_embeddings": (boolean, None),
    },
    "training": {
        "seq_len": (integer(1), REQUIRED),
        "global_batch": (integer(1), REQUIRED),
        "micro_batch": (integer(1), 1),
        "precision": (choice(DTYPE_BYTES), "bf16"),
        "recompute": (choice(r.value for r in Recompute), "none"),
        "flash_attention": (boolean, True),
    },
    "network": {
        "algorithm": (choice(["auto"] + [a.value for a in Algorithm
                                          if a is not Algorithm.DIRECT]), "auto"),
        "protocol": (choice(["auto"] + [p.value for p in Protocol]), "auto"),
        "step_model": (choice(["pipelined", "lockstep"]), "pipelined"),
    },
    "parallelism": {
        "dp": (integer(1), None),
        "tp": (integer(1), 1),
        "cp": (integer(1), 1),
        "pp": (integer(1), 1),
        "sequence_parallel": (boolean, False),
        "schedule": (choice(s.value for s in Schedule), "1f1b"),
        "virtual_stages": (integer(1), 1),
        "stage_layers": (_layer_list, None),
        "zero": (choice([0, 1, 2, 3]), 0),
        "fsdp": (_subsection(FSDP_SCHEMA), None),
        "order": (_order, "tp-cp-dp-pp"),
        "bucket_size": (quantity(units.Dimension.SIZE, positive=True), 25e6),
        "overlap_grad_reduce": (boolean, True),
    },
}
TOP_LEVEL = {"name": (text, "scenario"), "seed": (integer(0), 0)}
SCHEMA["simulation"] = {
    "fold_ranks": (boolean, False),
    "tensor_parallel_gangs": (boolean, False),
    "span_detail": (choice(["kernel", "layer"]), "kernel"),
}


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
    fold_ranks: bool = False  # simulate one rank per pipeline stage (identical ranks)
    gangs: bool = False  # run each tensor-parallel group as one process, in lockstep
    layer_spans: bool = False  # one compute span per layer, phase and micro-batch

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


_CLUSTER_FIELDS = {f.name for f in dataclasses.fields(ClusterSpec)} - {"fabric"}


def _fabric(preset: NetworkSpec, values: dict[str, Any]) -> NetworkSpec:
    """The preset's network with the scenario's kind and settings applied."""
    given = dict(values.get("fabric") or {})
    kind = NETWORKS[given.pop("type", preset.name)]
    for key in SHARED_NETWORK_KEYS:
        if values.get(key) is not None:
            if key in given:
                raise ScenarioError(f"cluster.{key}: give it once, here or as "
                                    f"cluster.fabric.{key}")
            given[key] = values[key]
    own = {f.name for f in dataclasses.fields(kind)}
    for key in given:
        if key not in own:
            where = f"cluster.{key}" if key in SHARED_NETWORK_KEYS else f"cluster.fabric.{key}"
            raise fail(where, given[key], f"is not a setting of a {kind.name} fabric "
                                           f"(its settings: {', '.join(sorted(own)) or 'none'})")
    base = preset if isinstance(preset, kind) else kind()
    spec = dataclasses.replace(base, **given)
    if kind.name == "file" and not spec.path:
        raise ScenarioError("cluster.fabric.path: missing; a file fabric needs the GraphML "
                            "or YAML file")
    return spec


def _cluster(values: dict[str, Any]) -> tuple[ClusterSpec, GpuSpec]:
    overrides = {k: v for k, v in values.items() if k in _CLUSTER_FIELDS and v is not None}
    preset = CLUSTERS[values["preset"]]
    spec = dataclasses.replace(preset, fabric=_fabric(preset.fabric, values), **overrides)
    return spec, GPUS[spec.gpu]


def _calibration(path_text: str, gpu: GpuSpec, base_dir: Path | None) -> GpuSpec:
    """The GPU with the efficiencies of a calibration file (``clustersim calibrate``)."""
    path = Path(path_text)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        raw = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise fail("cluster.calibration", path_text, f"must be a readable calibration file "
                                                      f"({error})") from None
    if not isinstance(raw, dict):
        raise fail("cluster.calibration", path_text, "must hold a mapping of efficiencies")
    if raw.get("gpu") != gpu.name:
        raise fail("cluster.calibration", path_text, f"was fitted for gpu {raw.get('gpu')!r}, "
                                                      f"but the cluster's GPU is {gpu.name!r}")
    try:
        return calibrated(gpu, check_calibration(raw, "cluster.calibration"))
    except GpuFileError as error:
        raise ScenarioError(str(error)) from None


def _whole_graph(spec: ClusterSpec, base_dir: Path | None) -> nx.DiGraph | None:
    """The cluster's graph when its network kind reads it whole from a file."""
    try:
        return spec.fabric.whole_graph(base_dir)
    except GraphFileError as error:
        raise ScenarioError(f"cluster.fabric.path: {error}") from None


def _network(values: dict[str, Any], cluster: ClusterSpec, graph: nx.DiGraph | None):
    algorithm = None if values["algorithm"] == "auto" else Algorithm(values["algorithm"])
    protocol = None if values["protocol"] == "auto" else Protocol(values["protocol"])
    has_nvls = cluster.nvls if graph is None else any(
        d.get("nvls") for _, d in graph.nodes(data=True))
    if algorithm is Algorithm.NVLS and not has_nvls:
        raise fail("network.algorithm", "nvls", "needs an NVSwitch with NVLink SHARP "
                                                 "(dgx-h100, dgx-h200, or cluster.nvls: true)")
    if algorithm is Algorithm.NVLS and protocol not in (None, Protocol.SIMPLE):
        raise fail("network.protocol", protocol.value, "cannot run with network.algorithm "
                                                        "nvls, which uses simple only")
    return algorithm, protocol


def _model(values: dict[str, Any], base_dir: Path | None = None) -> ModelSpec:
    inline = {k: v for k, v in values.items() if k not in ("preset", "hf_config")
              and v is not None}
    if values["preset"] is not None and values["hf_config"] is not None:
        raise fail("model.hf_config", values["hf_config"], "cannot be combined with "
                                                            "model.preset; give one")
    if values["hf_config"] is not None:
        path = Path(values["hf_config"])
        if base_dir is not None and not path.is_absolute():
            path = base_dir / path
        try:
            base = dataclasses.asdict(model_from_hf(path))
        except HfConfigError as error:
            raise ScenarioError(f"model.hf_config: {error}") from None
    elif values["preset"] is not None:
        base = dataclasses.asdict(MODELS[values["preset"]])
    else:
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in inline]
        if missing:
            raise ScenarioError(f"model.{missing[0]}: missing; give model.preset "
                                f"(one of {', '.join(MODELS)}) or layers, hidden, heads, vocab")
        base = {"name": "custom", "ffn_hidden": 4 * inline["hidden"],
                "kv_heads": inline["heads"]}
    base.update(inline)
    base.setdefault("kv_heads", base["heads"])
    base["mlp"] = Mlp(base.get("mlp", Mlp.GELU))
    if base["hidden"] % base["heads"]:
        raise fail("model.heads", base["heads"], f"must divide model.hidden ({base['hidden']})")
    if base["heads"] % base["kv_heads"]:
        raise fail("model.kv_heads", base["kv_heads"],
                    f"must divide model.heads ({base['heads']})")
    return ModelSpec(**base)


def _parallel(p: dict[str, Any], gpus: int, ranks_per_node: int) -> ParallelSpec:
    """The ParallelSpec of a ``parallelism:`` section on ``gpus`` GPUs."""
    tp, cp, pp = p["tp"], p["cp"], p["pp"]
    if p["fsdp"] is not None and p["zero"]:
        raise fail("parallelism.fsdp", p["fsdp"], "cannot be combined with parallelism.zero; "
                                                   "FSDP sets its own sharding")
    model_parallel = tp * cp * pp
    if gpus % model_parallel:
        raise ScenarioError(f"parallelism: tp x cp x pp = {tp} x {cp} x {pp} = {model_parallel} "
                            f"must divide the GPU count {gpus}")
    dp = p["dp"] if p["dp"] is not None else gpus // model_parallel
    if gpus % dp:
        raise fail("parallelism.dp", dp, f"must divide the GPU count {gpus} "
                                          "(cluster.nodes x gpus_per_node)")
    if model_parallel * dp != gpus:
        raise ScenarioError(f"parallelism: tp x cp x pp x dp = {tp} x {cp} x {pp} x {dp} = "
                            f"{model_parallel * dp} must equal the GPU count {gpus}")
    fsdp = None
    if p["fsdp"] is not None:
        f = p["fsdp"]
        fsdp = FsdpSpec(Sharding(f["sharding"]), f["prefetch"], f["reshard_after_forward"])
    return ParallelSpec(
        dp=dp, tp=tp, cp=cp, pp=pp, sequence_parallel=p["sequence_parallel"],
        schedule=Schedule(p["schedule"]), virtual_stages=p["virtual_stages"],
        stage_layers=p["stage_layers"], zero=p["zero"], fsdp=fsdp, order=p["order"],
        bucket_bytes=p["bucket_size"], overlap_grad_reduce=p["overlap_grad_reduce"],
        ranks_per_node=ranks_per_node)


def _check_layout(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    try:
        check(model, training, parallel)
    except (LayoutError, ScheduleError) as error:
        raise ScenarioError(str(error) if str(error).startswith(("model.", "training.",
                                                                 "parallelism"))
                            else f"parallelism.schedule: {error}") from None


@dataclass(frozen=True)
class Machine:
    """A checked cluster: its spec, GPU, size, and the fabric graph if read from a file."""

    cluster: ClusterSpec
    gpu: GpuSpec
    nodes: int
    gpus: int
    compute_jitter: float
    graph: nx.DiGraph | None = dataclasses.field(default=None, compare=False, repr=False)

    def build_graph(self) -> nx.DiGraph:
        if self.graph is not None:
            return self.graph
        from topologies import build_cluster

        return build_cluster(self.cluster, self.nodes)


def machine_from(raw: object, base_dir: Path | None = None) -> Machine:
    """Check a ``cluster:`` section (see ``SCHEMA``) and build its Machine."""
    values = section("cluster", raw, SCHEMA["cluster"])
    cluster, gpu = _cluster(values)
    if values["calibration"] is not None:
        gpu = _calibration(values["calibration"], gpu, base_dir)
    nodes = values["nodes"]
    gpus = nodes * cluster.gpus_per_node
    graph = _whole_graph(cluster, base_dir)
    if graph is not None:
        if (raw or {}).get("nodes") not in (None, graph.graph["servers"]):
            raise fail("cluster.nodes", nodes, f"disagrees with the fabric file's "
                                                f"{graph.graph['servers']} servers")
        nodes, gpus = graph.graph["servers"], len(graph.graph["gpus"])
    return Machine(cluster, gpu, nodes, gpus, values["compute_jitter"], graph)


def network_from(raw: object, machine: Machine) -> tuple[Algorithm | None, Protocol | None, str]:
    """Check a ``network:`` section: (algorithm or None, protocol or None, step model)."""
    values = section("network", raw, SCHEMA["network"])
    algorithm, protocol = _network(values, machine.cluster, machine.graph)
    return algorithm, protocol, values["step_model"]


def from_dict(raw: object, base_dir: Path | None = None) -> Scenario:
    """Check a parsed scenario and build its specs; raises ScenarioError.

    ``base_dir`` resolves a relative ``cluster.fabric.path`` (the scenario
    file's folder when loading a file).
    """
    if not isinstance(raw, dict):
        raise fail("scenario", raw, "must be a mapping with cluster, model, training, "
                                     "parallelism")
    allowed = {**TOP_LEVEL, **{k: None for k in SCHEMA}}
    for key in raw:
        if key not in allowed:
            raise unknown("", key, allowed)
    top = section("", {k: v for k, v in raw.items() if k in TOP_LEVEL}, TOP_LEVEL)
    machine = machine_from(raw.get("cluster"), base_dir)
    t = section("training", raw.get("training"), SCHEMA["training"])
    t["recompute"] = Recompute(t["recompute"])
    training = TrainingSpec(**t)
    if training.precision not in machine.gpu.peak_flops:
        raise fail("training.precision", training.precision,
                    f"is not supported by {machine.gpu.name}")
    model = _model(section("model", raw.get("model"), SCHEMA["model"]), base_dir)
    algorithm, protocol, step_model = network_from(raw.get("network"), machine)
    p = section("parallelism", raw.get("parallelism"), SCHEMA["parallelism"])
    parallel = _parallel(p, machine.gpus, machine.gpus // max(1, machine.nodes))
    _check_layout(model, training, parallel)
    sim = section("simulation", raw.get("simulation"), SCHEMA["simulation"])
    fold, gangs = sim["fold_ranks"], sim["tensor_parallel_gangs"]
    for key, on in (("fold_ranks", fold), ("tensor_parallel_gangs", gangs)):
        if on and machine.compute_jitter > 0:
            raise fail(f"simulation.{key}", True, "needs cluster.compute_jitter 0: it "
                                                   "assumes the ranks it shares are identical")
    if fold and gangs:
        raise fail("simulation.tensor_parallel_gangs", True, "cannot be combined with "
                                                              "simulation.fold_ranks; give one")
    return Scenario(
        name=top["name"], seed=top["seed"], machine=machine, model=model, training=training,
        parallel=parallel,
        algorithm=algorithm, protocol=protocol, step_model=step_model, source=raw,
        fold_ranks=fold, gangs=gangs, layer_spans=sim["span_detail"] == "layer")


def set_key(raw: dict[str, Any], path: str, value: Any, source: str = "--set") -> None:
    """Set the dotted key ``path`` of a scenario dict, making sections as needed."""
    keys = path.strip().split(".")
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"{source}: {'.'.join(keys[:i + 1])} is a value, not a section")
        node = child
    node[keys[-1]] = value


def apply_overrides(raw: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are read as YAML scalars."""
    for assignment in assignments:
        path, sep, text = assignment.partition("=")
        if not sep or not path.strip():
            raise ScenarioError(f"--set: {assignment!r} must look like key.path=value")
        set_key(raw, path, yaml.safe_load(text) if text.strip() else None)
    return raw


def load(path: str | Path, overrides: Iterable[str] = ()) -> Scenario:
    """Read, override and check a scenario file."""
    return from_dict(apply_overrides(read_raw(path), overrides), base_dir=Path(path).parent)


def read_raw(path: str | Path) -> dict[str, Any]:
    """A scenario file as a dict (``name`` defaults to the file's stem), unchecked."""
    file = Path(path)
    try:
        raw = yaml.safe_load(file.read_text())
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read the scenario file ({error.strerror})") from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ScenarioError(f"{path}: not valid YAML{where}") from None
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ScenarioError(f"{path}: a scenario is a mapping of sections, not "
                            f"{type(raw).__name__}")
    raw.setdefault("name", file.stem)
    return raw
