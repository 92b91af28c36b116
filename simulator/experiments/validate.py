"""Validation as a feature: run the validation set, compare with the published
measurements, report the error.

The set (``simulator/experiments/validation/cases.yaml``) holds published measurements,
each with what is needed to rebuild it: a scenario file (end to end), a
collective (nccl-tests ``all_reduce_perf`` on an idle fabric), or a kernel (one
kernel on one GPU); the metric and how the source counts it; and the
assumptions the source leaves open, written per case rather than hidden in
code. Every simulated figure is computed here; only ``measured`` is
transcribed.

Metrics: ``tflops_per_gpu`` (``counting: megatron_eq3``: Narayanan et al.
Eq. 3, hardware FLOPs with full recompute, 96Bslh^2(1 + s/6h + V/16lh); or
``model_flops``: the summary's model TFLOP/s), ``mfu``, ``iteration_time_s``,
``peak_memory_gib`` (from the summary), ``tokens_per_s_per_gpu`` (the
summary's tokens/s over the GPUs), ``busbw`` (nccl-tests bus bandwidth,
GB/s), ``gemm_tflops``, ``attention_tflops`` (forward + backward, 3x the
4bs^2h forward FLOPs) and ``hbm_tbs``; a ``pair`` (a scenario and the
``--set`` overrides of its baseline, e.g. the same layout in BF16) has the
metric ``speedup``: the scenario's tokens/s over the baseline's.

Halves: every source (a publication, declared once under ``sources:`` with its
citation) is in the ``fit`` half (its measurements set model parameters) or
the ``check`` half (no constant may be chosen while looking at its cases); a
case names its source (``source_id``) and takes its half from it, so no
source has cases on both sides. Errors are signed so that positive is
simulated faster (or higher) than measured (``case_error_pct``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.base.user_files import parse_yaml, read_text
from simulator.config.scenario import ScenarioError

HERE = Path(__file__).resolve().parent / "validation"
CASES = HERE / "cases.yaml"
GIB = 2.0**30
SUMMARY_METRICS = ("mfu", "iteration_time_s", "peak_memory_gib")
TARGETS = ("scenario", "collective", "kernel", "pair")
HALVES = ("fit", "check")
LOWER_IS_FASTER = frozenset({"iteration_time_s"})  # a time: its error is its rate's


class ValidationError(ScenarioError):
    """A validation set or selection that cannot be used (names the case and field)."""


@dataclass(frozen=True)
class Case:
    name: str
    tags: tuple[str, ...]
    source: str
    metric: str
    counting: str
    unit: str
    measured: float
    basis: str
    assumptions: tuple[str, ...]
    target: str  # scenario | collective | kernel | pair
    spec: Any = field(compare=False)  # the scenario path, or the collective/kernel/pair mapping
    source_id: str = ""  # the key of its source under ``sources:``, whose half is ``basis``
    fitted: bool = False  # this measurement set a model parameter (so its half is fit)


@dataclass(frozen=True)
class Source:
    """A publication the cases come from, and the half all its cases are in."""

    id: str
    citation: str
    half: str


def error_pct(measured: float, simulated: float) -> float:
    """Signed error of the simulation, in percent of the measurement.

    >>> error_pct(200.0, 210.0)
    5.0
    """
    return 100.0 * (simulated - measured) / measured


def case_error_pct(metric: str, measured: float, simulated: float) -> float:
    """A case's signed error in percent, positive when the simulation is faster
    (or higher) than the measurement: a time's is the error of its rate.

    >>> case_error_pct("iteration_time_s", 2.0, 1.6)
    25.0
    """
    if metric in LOWER_IS_FASTER:
        return error_pct(1.0 / measured, 1.0 / simulated)
    return error_pct(measured, simulated)


def _source(key: str, raw: Any) -> Source:
    where = f"sources: source {key}"
    if not isinstance(raw, Mapping):
        raise ValidationError(f"{where}: must be a mapping of citation and half")
    missing = [k for k in ("citation", "half") if k not in raw]
    unknown = sorted(set(raw) - {"citation", "half"})
    if missing or unknown:
        raise ValidationError(f"{where}: " + "; ".join(
            ([f"missing {', '.join(missing)}"] if missing else [])
            + ([f"unknown key {', '.join(map(str, unknown))}"] if unknown else [])))
    if raw["half"] not in HALVES:
        raise ValidationError(f"{where}: half {raw['half']!r} is not one of {', '.join(HALVES)}")
    return Source(str(key), str(raw["citation"]), raw["half"])


def _half(raw: Mapping[str, Any], name: str, sources: Mapping[str, Source]) -> Source:
    """The case's source, checked against what the case says of its half."""
    source = sources.get(raw["source_id"]) if isinstance(raw["source_id"], str) else None
    if source is None:
        raise ValidationError(f"{name}: source_id {raw['source_id']!r} is not declared under "
                              f"sources: (declared: {', '.join(sorted(sources))})")
    if "basis" in raw and raw["basis"] != source.half:
        raise ValidationError(f"{name}: basis {raw['basis']!r} disagrees with its source "
                              f"{source.id!r}, which is in the {source.half} half")
    fitted = raw.get("fitted", False)
    if not isinstance(fitted, bool):
        raise ValidationError(f"{name}: fitted: {fitted!r} is not true or false")
    if fitted and source.half != "fit":
        raise ValidationError(f"{name}: fitted: a case that set a model parameter is in the "
                              f"fit half, but its source {source.id!r} is in the check half")
    return source


def _case(raw: Mapping[str, Any], file: str, n: int, sources: Mapping[str, Source]) -> Case:
    where = f"{file}: case {n}"
    if not isinstance(raw, Mapping):
        raise ValidationError(f"{where}: must be a mapping")
    missing = [k for k in ("name", "tags", "source", "source_id", "metric", "unit", "measured")
               if k not in raw]
    if missing:
        name = f" ({raw['name']})" if "name" in raw else ""
        raise ValidationError(f"{where}{name}: missing {', '.join(missing)}")
    targets = [t for t in TARGETS if t in raw]
    if len(targets) != 1:
        raise ValidationError(f"{where} ({raw['name']}): needs exactly one of "
                              f"{', '.join(TARGETS)}")
    if raw["metric"] not in METRICS:
        raise ValidationError(f"{where} ({raw['name']}): metric {raw['metric']!r} is not one "
                              f"of {', '.join(METRICS)}")
    source = _half(raw, f"{file}: case {raw['name']}", sources)
    return Case(str(raw["name"]), tuple(raw["tags"]), str(raw["source"]), raw["metric"],
                str(raw.get("counting", "")), str(raw["unit"]), float(raw["measured"]),
                source.half, tuple(raw.get("assumptions", ())), targets[0], raw[targets[0]],
                source.id, bool(raw.get("fitted", False)))


def load_sources(path: Path, raw: Any) -> dict[str, Source]:
    """The ``sources:`` table of the set at ``path``, checked."""
    if not isinstance(raw, Mapping) or set(raw) != {"sources", "cases"}:
        raise ValidationError(f"{path}: must be a mapping with sources and cases (and nothing "
                              "else)")
    if not isinstance(raw["sources"], Mapping) or not raw["sources"]:
        raise ValidationError(f"{path.name}: sources: must declare at least one source")
    return {str(k): _source(k, v) for k, v in raw["sources"].items()}


def load_cases(path: Path = CASES) -> list[Case]:
    """The validation set, checked: each case's source declared, its half the source's."""
    raw = parse_yaml(read_text(path, "validation set"), str(path))
    sources = load_sources(path, raw)
    if not isinstance(raw["cases"], list):
        raise ValidationError(f"{path.name}: cases: must be a list of cases")
    cases = [_case(item, path.name, n + 1, sources) for n, item in enumerate(raw["cases"])]
    names = [c.name for c in cases]
    duplicate = next((n for n in names if names.count(n) > 1), None)
    if duplicate:
        raise ValidationError(f"{path}: case name {duplicate!r} appears twice")
    unused = sorted(set(sources) - {c.source_id for c in cases})
    if unused:
        raise ValidationError(f"{path.name}: sources: {', '.join(unused)} is declared but no case "
                              "names it")
    return cases


def select(cases: list[Case], names: Iterable[str] = (), tags: Iterable[str] = ()
           ) -> list[Case]:
    """Cases named in ``names`` or carrying one of ``tags``; all when both are empty."""
    names, tags = list(names), list(tags)
    known_names = {c.name for c in cases}
    known_tags = {t for c in cases for t in c.tags}
    for name in names:
        if name not in known_names:
            raise ValidationError(f"--case: {name!r} is not a case; see clustersim validate "
                                  "--list")
    for tag in tags:
        if tag not in known_tags:
            raise ValidationError(f"--tag: {tag!r} is not one of {', '.join(sorted(known_tags))}")
    if not names and not tags:
        return list(cases)
    return [c for c in cases if c.name in names or set(c.tags) & set(tags)]


def _scenario_metric(case: Case) -> float:
    from simulator.config.scenario import load
    from simulator.runner.simulate import run
    from workloads.kernels import megatron_hardware_flops

    scenario = load(HERE / case.spec)
    summary = run(scenario).summary
    if case.metric == "tflops_per_gpu":
        if case.counting == "megatron_eq3":
            t = scenario.training
            flops = megatron_hardware_flops(scenario.model, t.global_batch, t.seq_len)
            return flops / summary["iteration_time_s"] / scenario.gpus / 1e12
        return float(summary["model_tflops_per_gpu"])
    if case.metric == "tokens_per_s_per_gpu":  # over the training GPUs (a job's, with jobs:)
        return float(summary["tokens_per_s"]) / summary["gpus"]
    return float(summary[case.metric])


def _speedup(case: Case) -> float:
    """A pair's speed-up: the scenario's tokens/s over its baseline's (the same
    file with the pair's ``baseline`` overrides)."""
    from simulator.config.scenario import load
    from simulator.runner.simulate import run

    path = HERE / case.spec["scenario"]
    fast = run(load(path)).summary["tokens_per_s"]
    return fast / run(load(path, case.spec["baseline"])).summary["tokens_per_s"]


def _busbw(case: Case) -> float:
    from simulator.base.ir import Collective
    from simulator.collectives.nccl import Algorithm
    from simulator.collectives.nccl_tests import bus_factor, parse_ranks, time_alone
    from simulator.collectives.states import FabricStates
    from topologies import CLUSTERS, build_cluster

    spec = case.spec
    algorithm = Algorithm(spec["algorithm"]) if spec.get("algorithm") else None
    fabrics = FabricStates.build(build_cluster(CLUSTERS[spec["cluster"]],
                                               int(spec.get("nodes", 1))), algorithm=algorithm)
    gpus = fabrics.gpus
    if spec.get("group"):  # some of the GPUs (``clustersim collective --group``'s ranks)
        gpus = [gpus[r] for r in parse_ranks(str(spec["group"]), len(gpus))]
    kind = Collective(spec.get("op", "all_reduce"))
    size = float(spec["bytes"])
    seconds = time_alone(fabrics.fabric, fabrics.lowering, kind, gpus, size)[0]
    return size / seconds * bus_factor(kind, len(gpus)) / 1e9


def _kernel_seconds(gpu_name: str, kernel, flops: float, nbytes: float,
                    shape: tuple[int, int, int] | None = None) -> float:
    from simulator.base.ir import Op, OpKind, Phase
    from simulator.compute.model import ComputeModel
    from topologies import GPUS

    model = ComputeModel.of(GPUS[gpu_name], "bf16")
    op = Op(OpKind.COMPUTE, "kernel", "compute", Phase.FORWARD, kernel=kernel, flops=flops,
            bytes=nbytes, shape=shape)
    return model.duration(op)


def _gemm_tflops(case: Case) -> float:
    from simulator.base.ir import KernelClass

    s = case.spec
    m, n, k = int(s["m"]), int(s["n"]), int(s["k"])
    flops = 2.0 * m * n * k
    seconds = _kernel_seconds(s["gpu"], KernelClass.GEMM, flops, 2.0 * (m * k + k * n + m * n),
                              (m, n, k))
    return flops / seconds / 1e12


def _attention_tflops(case: Case) -> float:
    from simulator.base.ir import KernelClass

    s = case.spec
    forward = 4.0 * s["batch"] * s["seq"] ** 2 * s["heads"] * s["head_dim"]
    return forward / _kernel_seconds(s["gpu"], KernelClass.ATTENTION, forward, 0.0) / 1e12


def _hbm_tbs(case: Case) -> float:
    from simulator.base.ir import KernelClass

    nbytes = float(case.spec["bytes"])
    return nbytes / _kernel_seconds(case.spec["gpu"], KernelClass.ELEMENTWISE, 0.0, nbytes) / 1e12


METRICS: Mapping[str, Callable[[Case], float]] = {
    "tflops_per_gpu": _scenario_metric, "tokens_per_s_per_gpu": _scenario_metric,
    **{m: _scenario_metric for m in SUMMARY_METRICS},
    "busbw": _busbw, "gemm_tflops": _gemm_tflops, "attention_tflops": _attention_tflops,
    "hbm_tbs": _hbm_tbs, "speedup": _speedup,
}


def simulate(case: Case) -> float:
    """The simulated value of ``case``'s metric."""
    return METRICS[case.metric](case)


def run_cases(cases: Iterable[Case], progress: Callable[[Case], None] | None = None
              ) -> pd.DataFrame:
    """One row per case: measured, simulated, signed error %, and its provenance."""
    rows = []
    for case in cases:
        if progress:
            progress(case)
        simulated = simulate(case)
        rows.append({"case": case.name, "tags": ",".join(case.tags), "metric": case.metric,
                     "unit": case.unit, "measured": case.measured, "simulated": simulated,
                     "error_pct": case_error_pct(case.metric, case.measured, simulated),
                     "basis": case.basis, "source_id": case.source_id, "source": case.source})
    return pd.DataFrame(rows)


def by_group(table: pd.DataFrame) -> pd.DataFrame:
    """Per tag: cases, mean absolute and mean signed error %, worst absolute error %."""
    rows = []
    for tag in sorted({t for tags in table["tags"] for t in tags.split(",")}):
        part = table[table["tags"].str.split(",").map(lambda tags, tag=tag: tag in tags)]
        errors = part["error_pct"].abs()
        rows.append({"group": tag, "cases": len(part), "mean_abs_error_pct": errors.mean(),
                     "mean_signed_error_pct": part["error_pct"].mean(),
                     "worst_abs_error_pct": errors.max(),
                     "worst_case": part.loc[errors.idxmax(), "case"]})
    return pd.DataFrame(rows)


def markdown(table: pd.DataFrame) -> str:
    """The results as a Markdown table (what the README shows)."""
    lines = ["| case | measured | simulated | error | basis | source |",
             "|---|---:|---:|---:|---|---|"]
    for r in table.itertuples(index=False):
        simulated = f"{r.simulated:.3f}" if r.unit == "x" else f"{r.simulated:.1f}"
        lines.append(f"| {r.case} | {r.measured:g} {r.unit} | {simulated} {r.unit} | "
                     f"{r.error_pct:+.1f} % | {r.basis} | {short_source(r.source)} |")
    return "\n".join(lines)


def short_source(source: str) -> str:
    """The citation up to its first comma (the full one is in the case file).

    >>> short_source("Azure AI-benchmarking-guide, ND A100 v4 results")
    'Azure AI-benchmarking-guide'
    """
    return source.split(",")[0].split(" (")[0]
