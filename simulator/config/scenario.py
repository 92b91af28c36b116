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
import difflib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import networkx as nx
import yaml

from simulator.base import units
from simulator.collectives.nccl import Algorithm, Protocol
from topologies import CLUSTERS, GPUS, ClusterSpec, GpuSpec
from topologies.clusters import FabricKind, FabricSpec
from topologies.gpus import GpuFileError, calibrated, check_calibration
from topologies.graph_file import GraphFileError, load_graph
from workloads.hf_config import HfConfigError, model_from_hf
from workloads.layout import parse_order
from workloads.memory import Recompute
from workloads.models import MODELS, Mlp, ModelSpec
from workloads.program import LayoutError, check
from workloads.schedules import Schedule, ScheduleError
from workloads.training import DTYPE_BYTES, FsdpSpec, ParallelSpec, Sharding, TrainingSpec


class ScenarioError(ValueError):
    """Bad scenario input; ``str(error)`` is one line naming key, value and what is allowed."""


_REQUIRED = object()


def _fail(path: str, value: object, allowed: str) -> ScenarioError:
    return ScenarioError(f"{path}: {value!r} {allowed}")


def _integer(minimum: int) -> Callable[[str, object], int]:
    def parse(path: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise _fail(path, value, f"must be an integer >= {minimum}")
        return value
    return parse


def _number(minimum: float, maximum: float = float("inf")) -> Callable[[str, object], float]:
    def parse(path: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                minimum <= value <= maximum):
            raise _fail(path, value, f"must be a number in [{minimum:g}, {maximum:g}]")
        return float(value)
    return parse


def _boolean(path: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(path, value, "must be true or false")
    return value


def _text(path: str, value: object) -> str:
    if not isinstance(value, str) or not value:
        raise _fail(path, value, "must be a non-empty string")
    return value


def _choice(options: Iterable[str]) -> Callable[[str, object], str]:
    names = list(options)

    def parse(path: str, value: object) -> Any:
        if isinstance(value, bool) or value not in names:
            raise _fail(path, value, f"is not one of: {', '.join(map(str, names))}")
        return value
    return parse


def _quantity(dimension: units.Dimension, positive: bool) -> Callable[[str, object], float]:
    def parse(path: str, value: object) -> float:
        try:
            parsed = units.parse_quantity(value, dimension)
        except units.UnitError as error:
            raise ScenarioError(f"{path}: {error}") from None
        if parsed < 0 or (positive and parsed == 0):
            sign = "positive" if positive else "non-negative"
            raise _fail(path, value, f"must be a {sign} {dimension.name.lower()}, "
                                     f"e.g. {dimension.value}")
        return parsed
    return parse


_BANDWIDTH = _quantity(units.Dimension.BANDWIDTH, positive=True)
_LATENCY = _quantity(units.Dimension.TIME, positive=False)
_EFFICIENCY = _number(0.01, 1.0)

FABRIC_SCHEMA = {
    "type": (_choice(k.value for k in FabricKind), None),
    "leaf_ports": (_integer(1), None),
    "oversubscription": (_number(1.0, 64.0), None),
    "pod_leaves": (_integer(1), None),
    "core_oversubscription": (_number(1.0, 64.0), None),
    "router_nodes": (_integer(1), None),
    "group_routers": (_integer(1), None),
    "global_links": (_integer(1), None),
    "path": (_text, None),
}


def _subsection(schema: dict) -> Callable[[str, object], dict[str, Any]]:
    return lambda path, value: _section(path, value, schema)


def _layer_list(path: str, value: object) -> tuple[int, ...]:
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise _fail(path, value, "must be a list of positive integers, one per pipeline stage")
    return tuple(value)


def _order(path: str, value: object) -> str:
    try:
        return "-".join(parse_order(str(value)))
    except ValueError as error:
        raise ScenarioError(f"{path}: {error}") from None


FSDP_SCHEMA = {
    "sharding": (_choice(s.value for s in Sharding), "full_shard"),
    "prefetch": (_boolean, True),
    "reshard_after_forward": (_boolean, True),
}

SCHEMA: dict[str, dict[str, tuple[Callable[[str, object], Any], object]]] = {
    "cluster": {
        "preset": (_choice(CLUSTERS), _REQUIRED),
        "nodes": (_integer(1), 1),
        "gpu": (_choice(GPUS), None),
        "gpus_per_node": (_integer(1), None),
        "nvlink_bandwidth": (_BANDWIDTH, None),
        "nvlink_latency": (_LATENCY, None),
        "nics_per_node": (_integer(1), None),
        "nic_bandwidth": (_BANDWIDTH, None),
        "pcie_bandwidth": (_BANDWIDTH, None),
        "link_latency": (_LATENCY, None),
        "oversubscription": (_number(1.0, 64.0), None),
        "leaf_ports": (_integer(1), None),
        "nvlink_efficiency": (_EFFICIENCY, None),
        "nic_efficiency": (_EFFICIENCY, None),
        "nvls": (_boolean, None),
        "nvls_efficiency": (_EFFICIENCY, None),
        "fabric": (_subsection(FABRIC_SCHEMA), None),
        "compute_jitter": (_number(0.0, 1.0), 0.0),
        "calibration": (_text, None),
    },
    "model": {
        "preset": (_choice(MODELS), None),
        "hf_config": (_text, None),
        "layers": (_integer(1), None),
        "hidden": (_integer(1), None),
        "heads": (_integer(1), None),
        "kv_heads": (_integer(1), None),
        "ffn_hidden": (_integer(1), None),
        "vocab": (_integer(1), None),
        "mlp": (_choice(m.value for m in Mlp), None),
        "tied_embeddings": (_boolean, None),
    },
    "training": {
        "seq_len": (_integer(1), _REQUIRED),
        "global_batch": (_integer(1), _REQUIRED),
        "micro_batch": (_integer(1), 1),
        "precision": (_choice(DTYPE_BYTES), "bf16"),
        "recompute": (_choice(r.value for r in Recompute), "none"),
        "flash_attention": (_boolean, True),
    },
    "network": {
        "algorithm": (_choice(["auto"] + [a.value for a in Algorithm
                                          if a is not Algorithm.DIRECT]), "auto"),
        "protocol": (_choice(["auto"] + [p.value for p in Protocol]), "auto"),
        "step_model": (_choice(["pipelined", "lockstep"]), "pipelined"),
    },
    "parallelism": {
        "dp": (_integer(1), None),
        "tp": (_integer(1), 1),
        "cp": (_integer(1), 1),
        "pp": (_integer(1), 1),
        "sequence_parallel": (_boolean, False),
        "schedule": (_choice(s.value for s in Schedule), "1f1b"),
        "virtual_stages": (_integer(1), 1),
        "stage_layers": (_layer_list, None),
        "zero": (_choice([0, 1, 2, 3]), 0),
        "fsdp": (_subsection(FSDP_SCHEMA), None),
        "order": (_order, "tp-cp-dp-pp"),
        "bucket_size": (_quantity(units.Dimension.SIZE, positive=True), 25e6),
        "overlap_grad_reduce": (_boolean, True),
    },
}
TOP_LEVEL = {"name": (_text, "scenario"), "seed": (_integer(0), 0)}
SCHEMA["simulation"] = {
    "fold_ranks": (_boolean, False),
    "tensor_parallel_gangs": (_boolean, False),
    "span_detail": (_choice(["kernel", "layer"]), "kernel"),
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


def _unknown(path: str, key: object, allowed: Iterable[str]) -> ScenarioError:
    names = sorted(allowed)
    close = difflib.get_close_matches(str(key), names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    prefix = f"{path}." if path else ""
    return ScenarioError(f"{prefix}{key}: unknown key{hint}; allowed: {', '.join(names)}")


def _section(path: str, raw: object, schema: Mapping[str, tuple]) -> dict[str, Any]:
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise _fail(path or "scenario", raw, "must be a mapping of keys to values")
    for key in raw:
        if key not in schema:
            raise _unknown(path, key, schema)
    values = {}
    for key, (parse, default) in schema.items():
        dotted = f"{path}.{key}" if path else key
        if key in raw and raw[key] is not None:
            values[key] = parse(dotted, raw[key])
        elif default is _REQUIRED:
            raise ScenarioError(f"{dotted}: missing; it is required")
        else:
            values[key] = default
    return values


_CLUSTER_FIELDS = {f.name for f in dataclasses.fields(ClusterSpec)} - {"fabric"}
_FABRIC_FIELDS = {f.name for f in dataclasses.fields(FabricSpec)}


def _fabric(preset: FabricSpec, values: dict[str, Any]) -> FabricSpec:
    """The preset's fabric with the scenario's type and parameters applied."""
    given = {k: v for k, v in (values.get("fabric") or {}).items() if v is not None}
    for key in ("oversubscription", "leaf_ports"):
        if values.get(key) is not None:
            if key in given:
                raise ScenarioError(f"cluster.{key}: give it once, here or as "
                                    f"cluster.fabric.{key}")
            given[key] = values[key]
    kind = FabricKind(given.pop("type", preset.kind.value))
    base = preset if kind is preset.kind else FabricSpec(kind=kind)
    spec = dataclasses.replace(base, kind=kind, **{k: v for k, v in given.items()
                                                   if k in _FABRIC_FIELDS})
    if kind is FabricKind.FILE and not spec.path:
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
        raise _fail("cluster.calibration", path_text, f"must be a readable calibration file "
                                                      f"({error})") from None
    if not isinstance(raw, dict):
        raise _fail("cluster.calibration", path_text, "must hold a mapping of efficiencies")
    if raw.get("gpu") != gpu.name:
        raise _fail("cluster.calibration", path_text, f"was fitted for gpu {raw.get('gpu')!r}, "
                                                      f"but the cluster's GPU is {gpu.name!r}")
    try:
        return calibrated(gpu, check_calibration(raw, "cluster.calibration"))
    except GpuFileError as error:
        raise ScenarioError(str(error)) from None


def _file_graph(spec: ClusterSpec, base_dir: Path | None) -> nx.DiGraph:
    path = Path(spec.fabric.path)
    if base_dir is not None and not path.is_absolute():
        path = base_dir / path
    try:
        return load_graph(path)
    except GraphFileError as error:
        raise ScenarioError(f"cluster.fabric.path: {error}") from None


def _network(values: dict[str, Any], cluster: ClusterSpec, graph: nx.DiGraph | None):
    algorithm = None if values["algorithm"] == "auto" else Algorithm(values["algorithm"])
    protocol = None if values["protocol"] == "auto" else Protocol(values["protocol"])
    has_nvls = cluster.nvls if graph is None else any(
        d.get("nvls") for _, d in graph.nodes(data=True))
    if algorithm is Algorithm.NVLS and not has_nvls:
        raise _fail("network.algorithm", "nvls", "needs an NVSwitch with NVLink SHARP "
                                                 "(dgx-h100, dgx-h200, or cluster.nvls: true)")
    if algorithm is Algorithm.NVLS and protocol not in (None, Protocol.SIMPLE):
        raise _fail("network.protocol", protocol.value, "cannot run with network.algorithm "
                                                        "nvls, which uses simple only")
    return algorithm, protocol


def _model(values: dict[str, Any], base_dir: Path | None = None) -> ModelSpec:
    inline = {k: v for k, v in values.items() if k not in ("preset", "hf_config")
              and v is not None}
    if values["preset"] is not None and values["hf_config"] is not None:
        raise _fail("model.hf_config", values["hf_config"], "cannot be combined with "
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
        raise _fail("model.heads", base["heads"], f"must divide model.hidden ({base['hidden']})")
    if base["heads"] % base["kv_heads"]:
        raise _fail("model.kv_heads", base["kv_heads"],
                    f"must divide model.heads ({base['heads']})")
    return ModelSpec(**base)


def _parallel(p: dict[str, Any], gpus: int, ranks_per_node: int) -> ParallelSpec:
    """The ParallelSpec of a ``parallelism:`` section on ``gpus`` GPUs."""
    tp, cp, pp = p["tp"], p["cp"], p["pp"]
    if p["fsdp"] is not None and p["zero"]:
        raise _fail("parallelism.fsdp", p["fsdp"], "cannot be combined with parallelism.zero; "
                                                   "FSDP sets its own sharding")
    model_parallel = tp * cp * pp
    if gpus % model_parallel:
        raise ScenarioError(f"parallelism: tp x cp x pp = {tp} x {cp} x {pp} = {model_parallel} "
                            f"must divide the GPU count {gpus}")
    dp = p["dp"] if p["dp"] is not None else gpus // model_parallel
    if gpus % dp:
        raise _fail("parallelism.dp", dp, f"must divide the GPU count {gpus} "
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
    per_step = parallel.dp * training.micro_batch
    if training.global_batch % per_step:
        raise _fail("training.global_batch", training.global_batch,
                    f"must be divisible by dp x micro_batch = {parallel.dp} x "
                    f"{training.micro_batch} = {per_step}")
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
    values = _section("cluster", raw, SCHEMA["cluster"])
    cluster, gpu = _cluster(values)
    if values["calibration"] is not None:
        gpu = _calibration(values["calibration"], gpu, base_dir)
    nodes, graph = values["nodes"], None
    gpus = nodes * cluster.gpus_per_node
    if cluster.fabric.kind is FabricKind.FILE:
        graph = _file_graph(cluster, base_dir)
        if (raw or {}).get("nodes") not in (None, graph.graph["servers"]):
            raise _fail("cluster.nodes", nodes, f"disagrees with the fabric file's "
                                                f"{graph.graph['servers']} servers")
        nodes, gpus = graph.graph["servers"], len(graph.graph["gpus"])
    return Machine(cluster, gpu, nodes, gpus, values["compute_jitter"], graph)


def network_from(raw: object, machine: Machine) -> tuple[Algorithm | None, Protocol | None, str]:
    """Check a ``network:`` section: (algorithm or None, protocol or None, step model)."""
    values = _section("network", raw, SCHEMA["network"])
    algorithm, protocol = _network(values, machine.cluster, machine.graph)
    return algorithm, protocol, values["step_model"]


def from_dict(raw: object, base_dir: Path | None = None) -> Scenario:
    """Check a parsed scenario and build its specs; raises ScenarioError.

    ``base_dir`` resolves a relative ``cluster.fabric.path`` (the scenario
    file's folder when loading a file).
    """
    if not isinstance(raw, dict):
        raise _fail("scenario", raw, "must be a mapping with cluster, model, training, "
                                     "parallelism")
    allowed = {**TOP_LEVEL, **{k: None for k in SCHEMA}}
    for key in raw:
        if key not in allowed:
            raise _unknown("", key, allowed)
    top = _section("", {k: v for k, v in raw.items() if k in TOP_LEVEL}, TOP_LEVEL)
    machine = machine_from(raw.get("cluster"), base_dir)
    t = _section("training", raw.get("training"), SCHEMA["training"])
    t["recompute"] = Recompute(t["recompute"])
    training = TrainingSpec(**t)
    if training.precision not in machine.gpu.peak_flops:
        raise _fail("training.precision", training.precision,
                    f"is not supported by {machine.gpu.name}")
    model = _model(_section("model", raw.get("model"), SCHEMA["model"]), base_dir)
    algorithm, protocol, step_model = network_from(raw.get("network"), machine)
    p = _section("parallelism", raw.get("parallelism"), SCHEMA["parallelism"])
    parallel = _parallel(p, machine.gpus, machine.gpus // max(1, machine.nodes))
    _check_layout(model, training, parallel)
    sim = _section("simulation", raw.get("simulation"), SCHEMA["simulation"])
    fold, gangs = sim["fold_ranks"], sim["tensor_parallel_gangs"]
    for key, on in (("fold_ranks", fold), ("tensor_parallel_gangs", gangs)):
        if on and machine.compute_jitter > 0:
            raise _fail(f"simulation.{key}", True, "needs cluster.compute_jitter 0: it "
                                                   "assumes the ranks it shares are identical")
    if fold and gangs:
        raise _fail("simulation.tensor_parallel_gangs", True, "cannot be combined with "
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
