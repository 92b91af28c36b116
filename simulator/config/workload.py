"""The ``workload`` section: a program read from Chakra execution traces instead
of built from ``model``, ``training`` and ``parallelism`` sections.

```yaml
cluster: {preset: dgx-a100, nodes: 2}
workload: {chakra: traces/quickstart, durations: model}
```

The traces (``clustersim export-chakra``; ``base.chakra``) carry the program op
by op and the sections of the scenario they came from, which give the model,
training and parallelism specs the rest of a run reads (precision, memory,
FLOPs). Compute is re-timed by this scenario's compute model (``model``, the
default: the same GPU gives the same durations) or taken as recorded
(``recorded``); collectives and messages always run through clustersim's NCCL
and fabric.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.base.chakra import Trace, TraceError, read
from simulator.base.fields import ScenarioError, choice, fail, schema_of, section, setting, text
from simulator.base.user_files import user_path
from simulator.config.training import training_from


@dataclass(frozen=True)
class WorkloadSpec:
    """The ``workload`` section's settings."""

    chakra: str = setting(text, required=True)  # a folder of Chakra traces (trace.RANK.et)
    # model: compute re-timed by this scenario's compute model; recorded: as traced
    durations: str = setting(choice(["model", "recorded"]), "model")


@dataclass(frozen=True)
class Workload:
    """A checked ``workload`` section and the program its traces hold."""

    spec: WorkloadSpec
    trace: Trace

    @property
    def recorded(self) -> bool:
        return self.spec.durations == "recorded"

    def sections(self) -> dict[str, Any]:
        """The model, training and parallelism sections the traces came from."""
        return dict(self.trace.facts.get("scenario") or {})


SECTIONS = ("model", "training", "parallelism")  # what a workload's traces replace


def traced(body: dict[str, Any], gpus: int, base_dir: Path | None, also: tuple[str, ...] = (),
           whose: str | None = None) -> tuple[Workload | None, dict[str, Any]]:
    """(the ``workload`` of ``body``, a scenario or a training job, or None; the body
    with its traces' model, training and parallelism sections), refusing any of
    those sections, or of ``also``, given beside it. ``whose``: who has the
    ``gpus``, in words (``workload_from``)."""
    if body.get("workload") is None:
        return None, body
    given = [k for k in (*SECTIONS, *also) if body.get(k) is not None]
    if given:
        raise fail(given[0], body[given[0]], "cannot be given beside workload: the traces hold "
                                             "the program and the sections they were made from")
    workload = workload_from(body["workload"], gpus, base_dir, whose)
    return workload, {**body, **workload.sections()}


def workload_from(raw: object, gpus: int, base_dir: Path | None,
                  whose: str | None = None) -> Workload:
    """Check a ``workload:`` section and read its traces, one for each of the
    ``gpus`` (``whose``, in words: the cluster's by default, or a job's); one
    line on any error."""
    spec = WorkloadSpec(**section("workload", raw, schema_of(WorkloadSpec)))
    try:
        trace = read(user_path(spec.chakra, base_dir))
    except TraceError as error:
        raise ScenarioError(f"workload.chakra: {error}") from None
    if not trace.kernels and spec.durations == "model":
        raise fail("workload.durations", "model", "needs the kernels' shapes, which traces "
                                                  "another tool wrote lack; give recorded")
    if trace.program.ranks != gpus:
        raise fail("workload.chakra", spec.chakra, f"holds {trace.program.ranks} ranks' traces; "
                                                   f"{whose or f'the cluster has {gpus} GPUs'}")
    for key in SECTIONS:
        if not isinstance((trace.facts.get("scenario") or {}).get(key), dict):
            raise fail("workload.chakra", spec.chakra, f"gives no {key} section in its metadata")
    return Workload(spec, trace)


def training_of(workload: Workload | None, raw: object, gpu) -> Any:
    """The TrainingSpec of a scenario's or job's ``training`` section (``raw``; a
    workload's: its traces'): checked for ``gpu`` where the compute model times
    its kernels, not where the traces' recorded durations are replayed."""
    if workload is None:
        return training_from(raw, gpu)
    if workload.recorded:
        return training_from(raw, gpu, timed=False)
    try:
        return training_from(raw, gpu)
    except ScenarioError as error:
        raise ScenarioError(f"workload.durations: model re-times the traces' kernels on "
                            f"{gpu.name}, but the traces' {error}; give durations: "
                            f"recorded") from None
