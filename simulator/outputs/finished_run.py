"""A finished run read back from its directory (``clustersim gantt``, ``comms``,
``compare``, ``trace`` and ``blame`` read it; nothing is simulated again).

Every file is checked before it is used: against the run's ``manifest.json``
(``out_dirs.verify``: present, whole, written by this run), then for what a
reader needs of it (the summary's keys, the tables' columns, one placement
row per rank, span ranks within the run), so a damaged directory is an error
that names the file, never a traceback or a silently partial result.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import yaml

from simulator.engine.folded import Folded
from simulator.engine.records import SPAN_TEXT
from simulator.outputs.out_dirs import RunDirError, verify

READ = ("summary.json", "scenario.yaml", "spans.parquet", "spans.csv", "comms.parquet",
        "comms.csv", "placement.csv", "classes.csv", "mate_calls.parquet")
SUMMARY_KEYS = {"iteration_time_s": float, "gpus": int, "critical_rank": int}
SPAN_COLUMNS = {"rank": "i", "stream": "O", "kind": "O", "name": "O", "start": "f", "end": "f"}
COMMS_COLUMNS = {"dimension": "O", "group": "O", "start": "f", "end": "f", "bytes": "f"}


@dataclass
class FinishedRun:
    """A run read back from its directory."""

    path: Path
    name: str
    summary: dict
    spans: pd.DataFrame
    comms: pd.DataFrame
    placement: list[str]  # the GPU of each rank
    nodes: list[int] = field(default_factory=list)  # the server of each rank
    folded: Folded | None = None  # spans hold one rank per class (see classes.csv)
    scenario: dict = field(default_factory=dict)  # scenario.yaml, as given

    def spans_of(self, ranks: list[int]) -> pd.DataFrame:
        """The spans of ``ranks``, expanded from their classes in a folded run."""
        if self.folded is None:
            return self.spans[self.spans["rank"].isin(ranks)]
        return self.folded.ranks(self.spans, ranks, self.nodes)

    def classes(self) -> list[list[int]] | None:
        """A folded run's ranks, class by class (None when every rank's spans are here)."""
        return None if self.folded is None else self.folded.classes()


def read(path: str | Path) -> FinishedRun:
    """Read a run directory back; a missing, damaged or foreign file is a
    RunDirError naming it."""
    path = Path(path)
    if not path.is_dir():
        raise RunDirError(f"{path}: not a run directory (write one with clustersim run)")
    files = verify(path, READ)["files"]
    try:
        summary = _summary(path / "summary.json")
        scenario = _mapping(path / "scenario.yaml")
        spans = _table(path, "spans", files, SPAN_COLUMNS)
        comms = _table(path, "comms", files, COMMS_COLUMNS)
        placement = _table(path, "placement", files, {"rank": "i", "node": "i", "gpu": "O"})
        folded = _read_folded(path) if "classes.csv" in files else None
    except (OSError, ValueError, yaml.YAMLError) as error:
        raise RunDirError(f"{path}: cannot read the run ({error})") from None
    _check_ranks(path, spans, placement, folded)
    for column in SPAN_TEXT:
        spans[column] = spans[column].astype(str).astype("category")
    return FinishedRun(path, str(scenario.get("name", path.name)), summary, spans, comms,
                       placement["gpu"].astype(str).tolist(),
                       placement["node"].astype(int).tolist(), folded, scenario)


def _summary(where: Path) -> dict:
    summary = json.loads(where.read_text())
    if not isinstance(summary, dict):
        raise RunDirError(f"{where}: holds {type(summary).__name__}, not a run's summary")
    for key, kind in SUMMARY_KEYS.items():
        value = summary.get(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (
                kind is int and value != int(value)):
            raise RunDirError(f"{where}: {key} is {value!r}, not a number a summary holds")
    return summary


def _mapping(where: Path) -> dict:
    raw = yaml.safe_load(where.read_text())
    if not isinstance(raw, dict):
        raise RunDirError(f"{where}: holds {type(raw).__name__}, not a scenario (a mapping)")
    return raw


def _table(path: Path, name: str, files: dict, columns: dict[str, str]) -> pd.DataFrame:
    """A table of the run (Parquet where written, else CSV) with ``columns`` of
    the kinds a reader needs (i integer, f number, O any)."""
    parquet = path / f"{name}.parquet"
    where = parquet if f"{name}.parquet" in files else path / f"{name}.csv"
    if not where.is_file():
        raise RunDirError(f"{where}: missing; run the scenario again")
    table = pd.read_parquet(where) if where.suffix == ".parquet" else pd.read_csv(where)
    for column, kind in columns.items():
        if column not in table.columns:
            raise RunDirError(f"{where}: has no column {column!r}; it is not this run's "
                              f"{name} table")
        dtype = table[column].dtype
        if (kind == "i" and not pd.api.types.is_integer_dtype(dtype)) or (
                kind == "f" and not pd.api.types.is_numeric_dtype(dtype)):
            raise RunDirError(f"{where}: column {column!r} holds {dtype}, not numbers")
    return table


def _check_ranks(path: Path, spans: pd.DataFrame, placement: pd.DataFrame,
                 folded: Folded | None) -> None:
    """One placement row per rank, 0 to n-1; spans of those ranks only, every one
    of them unless the run keeps one timeline per class."""
    ranks = len(placement)
    if not np.array_equal(placement["rank"].to_numpy(), np.arange(ranks)):
        raise RunDirError(f"{path / 'placement.csv'}: its ranks are not 0 to {ranks - 1}")
    seen = np.unique(spans["rank"].to_numpy())
    if len(seen) and (seen[0] < 0 or seen[-1] >= ranks):
        raise RunDirError(f"{path}: spans of rank {int(seen[-1])}, but placement.csv places "
                          f"{ranks} ranks")
    expected = ranks if folded is None else len(folded.classes())
    if len(seen) != expected:
        raise RunDirError(f"{path}: spans of {len(seen)} ranks, but the run had {expected}"
                          + ("" if folded is None else " classes"))


def _read_folded(path: Path) -> Folded:
    classes = pd.read_csv(path / "classes.csv")
    for column in ("rank", "representative"):
        if column not in classes.columns:
            raise RunDirError(f"{path / 'classes.csv'}: has no column {column!r}")
    represents: dict[int, list[int]] = {}
    for rank, rep in zip(classes["rank"], classes["representative"], strict=True):
        members = represents.setdefault(int(rep), [])
        if rank != rep:
            members.append(int(rank))
    calls = pd.read_parquet(path / "mate_calls.parquet")
    folded = Folded({r: tuple(m) for r, m in represents.items()}, {})
    plans: dict[int, dict[int, int]] = {}
    for rank, copied, own, plan in zip(calls["rank"].tolist(), calls["copied_call"].tolist(),
                                       calls["call"].tolist(), calls["plan"].tolist(),
                                       strict=True):
        if plan == -1:  # an explicit row: the mate's own call
            folded.mate_calls.setdefault(rank, {})[copied] = own
        elif plan == -2:  # a plan's offset for one mate
            plans.setdefault(-1 - copied, {})[rank] = own
        else:  # a representative's row that heads a block
            folded.mate_blocks.setdefault(rank, {})[copied] = plan
    used = [p for blocks in folded.mate_blocks.values() for p in blocks.values()]
    folded.plans = [plans.get(p, {}) for p in range(max([*plans, *used], default=-1) + 1)]
    return folded
