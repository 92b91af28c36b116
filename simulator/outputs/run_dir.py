"""A finished run's directory: what ``clustersim run`` writes, and reading it back.

    summary.json        the summary (see simulator.analysis.summary)
    scenario.yaml       the scenario as given (with --set applied)
    spans.csv           every span: rank, node, stream, kind, name, start, end,
                        phase, micro-batch, layer, bytes, call (row of comms)
    comms.csv/.parquet  the communication log: every collective call and message
    ranks.csv           per-rank time breakdown (simulator.analysis.timeline.rank_table)
    streams.csv         per (rank, stream) busy/overlap/exposed/wait
    critical_path.csv   the chain of spans that sets the iteration time
    trace.json          Chrome/Perfetto trace with flows and counters
    gantt.FMT, memory.FMT  figures

``clustersim gantt``, ``comms`` and ``compare`` read these back without
simulating again.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import yaml

from simulator.outputs import exports

TEXT_COLUMNS = ("stream", "kind", "name", "phase")


class RunDirError(ValueError):
    """A directory that is not a readable run; the message names the path."""


@dataclass
class FinishedRun:
    """A run read back from its directory."""

    path: Path
    name: str
    summary: dict
    spans: pd.DataFrame
    comms: pd.DataFrame


def write(result, out: Path, fmt: str = "png") -> None:
    """Write every output of ``result`` (a RunResult) into ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    exports.write_summary(result.summary, out / "summary.json")
    (out / "scenario.yaml").write_text(yaml.safe_dump(dict(result.scenario.source),
                                                      sort_keys=False))
    exports.write_spans(result.spans, out / "spans.csv")
    for suffix in ("csv", "parquet"):
        exports.write_table(result.comms, out / f"comms.{suffix}")
    exports.write_table(result.ranks(), out / "ranks.csv")
    exports.write_table(result.streams(), out / "streams.csv")
    exports.write_table(result.critical_path(), out / "critical_path.csv")
    counters = exports.memory_counters(result.memory, result.node_of_rank)
    counters.update(result.traffic())
    exports.write_chrome_trace(result.spans, result.placement, out / "trace.json",
                               result.comms, counters)
    result.gantt(str(out / f"gantt.{fmt}"))
    result.memory_plot(str(out / f"memory.{fmt}"))


def read(path: str | Path) -> FinishedRun:
    """Read a run directory back; a missing or unreadable file is a RunDirError
    naming it."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: not a run directory (write one with clustersim run)")
    try:
        summary = json.loads((path / "summary.json").read_text())
        spans = pd.read_csv(path / "spans.csv")
        parquet = path / "comms.parquet"
        comms = pd.read_parquet(parquet) if parquet.exists() else pd.read_csv(path / "comms.csv")
        scenario = yaml.safe_load((path / "scenario.yaml").read_text()) or {}
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise RunDirError(f"{path}: cannot read the run ({error})") from None
    for column in TEXT_COLUMNS:
        spans[column] = spans[column].astype(str).astype("category")
    return FinishedRun(path, str(scenario.get("name", path.name)), summary, spans, comms)
