"""The ``cluster`` section: a preset, its overrides and its network, checked by
the specs they configure (``ClusterSpec``'s settings, the network kind's own
settings), plus a calibration file; the result is a ``Machine``."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import networkx as nx

from simulator.base.fields import (
    REQUIRED,
    ScenarioError,
    choice,
    fail,
    integer,
    number,
    schema_of,
    section,
    setting,
    text,
)
from simulator.base.user_files import read_yaml, user_path
from simulator.compute import throttle
from simulator.compute.stragglers import check_parts, slow_parts
from topologies import CLUSTERS, GPUS, ClusterSpec, GpuSpec, build_cluster, faults
from topologies.gpus import MAX_OVERLAP_SLOWDOWN, GpuFileError, calibrated, check_calibration
from topologies.graph_file import GraphFileError
from topologies.networks import NETWORKS, NetworkSpec
from topologies.networks.base import LEAF_PORTS, OVERSUBSCRIPTION

SHARED_NETWORK_KEYS = ("oversubscription", "leaf_ports")  # may also be given on cluster


def _fabric_kind(path: str, value: object) -> str:
    """a network kind: one of the sections below (``topologies.networks.NETWORKS``)"""
    return choice(NETWORKS)(path, value)  # (the registry as it is now)


@dataclasses.dataclass(frozen=True)
class FabricSection:
    """The ``cluster.fabric`` section's own keys, beside its kind's settings."""

    type: str | None = setting(_fabric_kind, None)  # the network kind (default: the preset's)
    faults: tuple = setting(faults.parse, ())  # degraded and failed parts (topologies.faults)


def _fabric_section(path: str, raw: object) -> dict[str, Any]:
    """A ``cluster.fabric`` section: ``type`` (a kind of ``topologies.networks``) and
    that kind's own settings, checked by the kind's spec; ``faults``."""
    if not isinstance(raw, dict):
        raise fail(path, raw, "must be a mapping of keys to values")
    own = schema_of(FabricSection)
    rest = {k: v for k, v in raw.items() if k not in own}
    values = {"type": own["type"][0](f"{path}.type", raw["type"])} if "type" in raw else {}
    if "type" not in raw:  # the kind is the preset's: check against every kind's keys
        schema = {k: v for kind in NETWORKS.values() for k, v in schema_of(kind).items()}
    else:
        schema = schema_of(NETWORKS[values["type"]])
    # keys the preset does not fix keep its values; a kind's required ones must be given
    schema = {k: (check, REQUIRED if default is REQUIRED and "type" in raw else None)
              for k, (check, default) in schema.items()}
    given = section(path, rest, schema)
    if raw.get("faults") is not None:
        values["faults"] = own["faults"][0](f"{path}.faults", raw["faults"])
    return {**values, **{k: v for k, v in given.items() if v is not None}}


@dataclasses.dataclass(frozen=True)
class Machine:
    """A checked cluster: its spec, GPU, size, the fabric graph if read from a file,
    and the run-time settings of the ``cluster`` section (each a ``setting``:
    jitter, slow and throttled GPUs, calibration and kernel files)."""

    cluster: ClusterSpec
    gpu: GpuSpec
    nodes: int
    gpus: int
    # each kernel's duration times a log-normal draw of this sigma (compute.jitter)
    compute_jitter: float = setting(number(0.0, 1.0), 0.0)
    graph: nx.DiGraph | None = dataclasses.field(default=None, compare=False, repr=False)
    # slow GPUs and nodes: ("node" | "gpu", index, factor) (compute.stragglers)
    slow: tuple[tuple[str, int, float], ...] = setting(slow_parts, ())
    # sigma of each GPU's log-normal speed (compute.stragglers)
    gpu_speed_spread: float = setting(number(0.0, 1.0), 0.0)
    # speeds that change over time: (part, index, schedule) (compute.throttle)
    throttle: tuple[tuple[str, int, throttle.Schedule], ...] = setting(throttle.parse, ())
    # the fabric after each time a fault starts during the iteration (topologies.faults)
    changes: tuple[tuple[float, nx.DiGraph], ...] = dataclasses.field(
        default=(), compare=False, repr=False)
    healthy: nx.DiGraph | None = dataclasses.field(default=None, compare=False, repr=False)
    # a calibration file of efficiencies (clustersim calibrate), applied to the GPU
    calibration: str | None = setting(text, None)
    # a measured kernel table replacing the GPU's (none: the roofline alone)
    kernel_table: str | None = setting(text, None)
    # compute slowed by NCCL beside it, at most (None: the GPU file's)
    overlap_slowdown: float | None = setting(number(1.0, MAX_OVERLAP_SLOWDOWN), None)

    def healthy_graph(self) -> nx.DiGraph:
        """The fabric without its faults (the ideal that blame measures against)."""
        return self.healthy if self.healthy is not None else self.build_graph()

    @property
    def stragglers(self) -> bool:
        """Whether some GPUs compute at their own speed (``compute.stragglers``,
        ``compute.throttle``)."""
        return bool(self.slow) or self.gpu_speed_spread > 0 or bool(self.throttle)

    def build_graph(self) -> nx.DiGraph:
        if self.graph is not None:
            return self.graph
        from topologies import build_cluster

        return build_cluster(self.cluster, self.nodes)


@dataclasses.dataclass(frozen=True)
class ClusterSection:
    """The ``cluster`` section's own keys, beside the preset's settings it may
    override (``ClusterSpec``) and the run-time ones (``Machine``)."""

    preset: str = setting(choice(CLUSTERS), required=True)  # the system (clustersim presets)
    nodes: int = setting(integer(1), 1)  # servers (trays of a rack-scale system)
    # the inter-node network: its kind (type) and that kind's settings, and faults
    fabric: dict | None = setting(_fabric_section, None)
    # the fabric's leaf ports and oversubscription, given here for the preset's kind
    oversubscription: float | None = setting(OVERSUBSCRIPTION[0], None)
    leaf_ports: int | None = setting(LEAF_PORTS[0], None)  # (as fabric.leaf_ports)


SCHEMA = {
    **schema_of(ClusterSection),
    **{key: (check, None) for key, (check, _) in schema_of(ClusterSpec).items()},
    **schema_of(Machine),  # the run-time settings
}


def _fabric(preset: NetworkSpec, values: dict[str, Any]) -> NetworkSpec:
    """The preset's network with the scenario's kind and settings applied."""
    given = dict(values.get("fabric") or {})
    given.pop("faults", None)
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
    return dataclasses.replace(base, **given)


def _cluster(values: dict[str, Any]) -> tuple[ClusterSpec, GpuSpec]:
    overrides = {k: v for k, v in values.items() if k in schema_of(ClusterSpec) and v is not None}
    preset = CLUSTERS[values["preset"]]
    spec = dataclasses.replace(preset, fabric=_fabric(preset.fabric, values), **overrides)
    problem = spec.domain_problem()
    if problem:
        raise fail("cluster.nvlink_domain", spec.domain, problem)
    return spec, GPUS[spec.gpu]


def _calibration(path_text: str, gpu: GpuSpec, base_dir: Path | None) -> GpuSpec:
    """The GPU with the efficiencies of a calibration file (``clustersim calibrate``)."""
    path = user_path(path_text, base_dir)
    try:
        raw = read_yaml(path, "calibration file")
    except ScenarioError as error:
        raise ScenarioError(f"cluster.calibration: {error}") from None
    if not isinstance(raw, dict):
        raise fail("cluster.calibration", path_text, "must hold a mapping of efficiencies")
    if raw.get("gpu") != gpu.name:
        raise fail("cluster.calibration", path_text, f"was fitted for gpu {raw.get('gpu')!r}, "
                                                      f"but the cluster's GPU is {gpu.name!r}")
    try:
        return calibrated(gpu, check_calibration(raw, "cluster.calibration"))
    except GpuFileError as error:
        raise ScenarioError(str(error)) from None


def _kernel_table(path_text: str, gpu: GpuSpec, base_dir: Path | None) -> GpuSpec:
    """The GPU with a measured kernel table (``none``: the roofline alone)."""
    if path_text.strip().lower() == "none":
        return dataclasses.replace(gpu, kernel_table=None)
    from simulator.compute.kernel_file import CalibrationError
    from simulator.compute.table import read_table

    path = user_path(path_text, base_dir)
    try:
        read_table(str(path))
    except CalibrationError as error:
        raise ScenarioError(f"cluster.kernel_table: {error}") from None
    return dataclasses.replace(gpu, kernel_table=path)


def _whole_graph(spec: ClusterSpec, base_dir: Path | None) -> nx.DiGraph | None:
    """The cluster's graph when its network kind reads it whole from a file."""
    try:
        return spec.fabric.whole_graph(base_dir)
    except GraphFileError as error:
        raise ScenarioError(f"cluster.fabric.path: {error}") from None


def machine_from(raw: object, base_dir: Path | None = None) -> Machine:
    """Check a ``cluster:`` section (see ``SCHEMA``) and build its Machine."""
    values = section("cluster", raw, SCHEMA)
    cluster, gpu = _cluster(values)
    if values["calibration"] is not None:
        gpu = _calibration(values["calibration"], gpu, base_dir)
    if values["kernel_table"] is not None:
        gpu = _kernel_table(values["kernel_table"], gpu, base_dir)
    if values["overlap_slowdown"] is not None:
        gpu = dataclasses.replace(gpu, overlap_slowdown=values["overlap_slowdown"])
    nodes = values["nodes"]
    gpus = nodes * cluster.gpus_per_node
    graph = _whole_graph(cluster, base_dir)
    if graph is not None:
        if (raw or {}).get("nodes") not in (None, graph.graph["servers"]):
            raise fail("cluster.nodes", nodes, f"disagrees with the fabric file's "
                                                f"{graph.graph['servers']} servers")
        nodes, gpus = graph.graph["servers"], len(graph.graph["gpus"])
    check_parts(values["slow"], nodes, gpus)
    check_parts(values["throttle"], nodes, gpus, "cluster.throttle")
    broken = (values.get("fabric") or {}).get("faults", ())
    later, healthy = (), None
    if broken:  # applied now, so that a bad fault is an error before the run
        healthy = graph if graph is not None else build_cluster(cluster, nodes)
        later = faults.epochs(healthy, broken)
        graph = faults.from_start(healthy, broken, later)
    own = {k: values[k] for k in schema_of(Machine)}
    return Machine(cluster, gpu, nodes, gpus, graph=graph, changes=later, healthy=healthy,
                   **own)
