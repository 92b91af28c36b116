"""Sweeps: many scenarios from one base, run in parallel, nothing lost.

A sweep is a base scenario plus a design: ``grid`` keys (every combination,
the cartesian product, in the order given) and ``zip`` keys (lists of equal
length, paired element by element, each pair crossed with the grid). Every
case is checked with the strict scenario loader before anything runs;
impossible cases are reported and skipped.

Each finished case is appended at once to ``DIR/results.jsonl`` (one JSON line,
written and flushed in one call) and the results table
(``results.csv``, ``results.parquet``: the case's full scenario as dotted
columns plus every summary key, nested ones flattened) is rewritten
atomically (a temporary file, then a rename) at most once a second while
cases stream in, and at the end or on Ctrl-C. So a crash or Ctrl-C leaves a
consistent table, and running the same command again rebuilds it from the
log and skips the cases already finished (a case is named by a hash of its
overrides). A case that fails records its error and the sweep goes on.

Cases run in local worker processes (``workers``), or on an existing Dask
cluster (``dask``: the scheduler's address); ``dask`` and ``distributed`` are
optional extras.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import pandas as pd
import yaml

from simulator.base.processes import follow_parent
from simulator.config.scenario import ScenarioError, from_dict, read_raw
from simulator.experiments.sweep_design import Case, SweepError, expand
from simulator.outputs.out_dirs import guarded

__all__ = ["Case", "Results", "SweepError", "expand", "sweep"]

RESULTS = "results.jsonl"
DESIGN = "sweep.yaml"


def validate(base: Mapping[str, Any], cases: Iterable[Case], base_dir: Path | None
             ) -> tuple[list[Case], dict[str, str]]:
    """(cases that load, {case id: the loader's error} for the others)."""
    good, bad = [], {}
    for case in cases:
        try:
            from_dict(case.scenario(base), base_dir=base_dir)
        except ScenarioError as error:
            bad[case.id] = str(error)
        else:
            good.append(case)
    return good, bad


def flatten(value: Any, prefix: str = "") -> dict[str, Any]:
    """Nested dicts as dotted keys; lists as JSON text (one cell each).

    >>> flatten({"a": {"b": 1, "c": [1, 2]}, "d": None})
    {'a.b': 1, 'a.c': '[1, 2]', 'd': None}
    """
    if isinstance(value, Mapping):
        out: dict[str, Any] = {}
        for key, item in value.items():
            out.update(flatten(item, f"{prefix}{key}."))
        return out
    if isinstance(value, (list, tuple)):
        value = json.dumps(value, default=str)
    return {prefix[:-1]: value}


def run_case(base: Mapping[str, Any], base_dir: str | None, case: Case) -> dict[str, Any]:
    """Simulate one case; its row of the results table (never raises for a
    failing case: the error is in the row)."""
    from simulator.runner.simulate import run

    row: dict[str, Any] = {"case": case.id, "status": "ok", "error": ""}
    raw = case.scenario(base)
    row.update(flatten({k: v for k, v in raw.items() if k != "name"}))
    try:
        result = run(from_dict(raw, base_dir=Path(base_dir) if base_dir else None))
    except Exception as error:  # noqa: BLE001 - one case's failure must not stop a sweep
        row.update(status="failed", error=f"{type(error).__name__}: {error}")
        return row
    row.update(flatten(result.summary))
    return row


def read_log(log: Path, *keys: str) -> list[dict]:
    """The rows of a JSON-lines log (those with every one of ``keys``); a line a
    crash cut short (no newline, or not JSON) is dropped from the file, so the
    next row starts on a line of its own and what it held is done again once."""
    if not log.exists():
        return []
    lines = log.read_bytes().split(b"\n")
    rows, kept = [], []
    for line in lines[:-1]:  # the part after the last newline is never whole
        try:
            row = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError):
            continue
        if isinstance(row, dict) and all(key in row for key in keys):
            rows.append(row)
            kept.append(line)
    if len(kept) != len(lines) - 1 or lines[-1]:
        partial = log.with_name(f".{log.name}.partial")
        partial.write_bytes(b"".join(line + b"\n" for line in kept))
        partial.replace(log)
    return rows


class Results:
    """The sweep's results on disk: the JSON-lines log and the table built from it."""

    def __init__(self, out: Path, refresh: float = 1.0) -> None:
        self.out = out
        self.rows: dict[str, dict] = {}
        self.order: dict[str, int] = {}  # case id -> position in the design
        self.refresh = refresh  # seconds between table rewrites while cases stream in
        self._written = 0.0
        self._repair(out / RESULTS)

    def _repair(self, log: Path) -> None:
        for row in read_log(log, "case", "status"):
            self.rows[row["case"]] = row

    def finished(self, retry_failed: bool = False) -> set[str]:
        return {cid for cid, row in self.rows.items()
                if row["status"] == "ok" or not retry_failed}

    def add(self, row: dict) -> None:
        """Append one finished case to the log (one write, flushed) and rewrite the
        table if the last rewrite is ``refresh`` seconds old (the sweep rewrites it
        at its end and on Ctrl-C; the log alone rebuilds it after a crash)."""
        self.rows[row["case"]] = row

        def append() -> None:
            with open(self.out / RESULTS, "a") as log:
                log.write(json.dumps(row, default=str) + "\n")
                log.flush()
        guarded(self.out / RESULTS, append)
        if time.monotonic() - self._written >= self.refresh:
            self.write_table()

    def table(self) -> pd.DataFrame:
        """One row per finished case of the current design, in design order (whatever
        order they ended in); cases of an earlier design stay in the log only."""
        rows = [row for row in self.rows.values() if not self.order or row["case"] in self.order]
        rows.sort(key=lambda row: self.order.get(row["case"], 0))
        return pd.DataFrame(rows)

    def write_table(self) -> None:
        self._written = time.monotonic()
        table = self.table()
        for suffix in ("csv", "parquet"):
            final = self.out / f"results.{suffix}"
            partial = final.with_name(f".{final.name}.partial")
            if suffix == "csv":
                guarded(final, lambda p=partial: table.to_csv(p, index=False))
            else:
                guarded(final, lambda p=partial: _parquet_safe(table).to_parquet(p, index=False))
            partial.replace(final)


def _parquet_safe(table: pd.DataFrame) -> pd.DataFrame:
    """Columns mixing types (a key that is a number in one case and text in
    another) become text, which Parquet needs."""
    out = table.copy()
    for column in out.columns:
        kinds = {type(v) for v in out[column] if v is not None and v == v}
        if len(kinds) > 1 and not kinds <= {int, float, bool}:
            out[column] = out[column].map(lambda v: None if v is None else str(v))
    return out


def _write_invalid(out: Path, cases: list[Case], invalid: Mapping[str, str]) -> None:
    """``invalid.csv``: the cases the loader refused, with its error."""
    rows = [{"case": c.id, **{k: json.dumps(v) if isinstance(v, (list, dict)) else v
                              for k, v in c.overrides}, "error": invalid[c.id]}
            for c in cases if c.id in invalid]
    path = out / "invalid.csv"
    if rows:
        pd.DataFrame(rows).to_csv(path, index=False)
    elif path.exists():
        path.unlink()


def code_version() -> str:
    """A hash of clustersim's own source: results of another version are stale."""
    digest = hashlib.sha1()
    for package in ("simulator", "workloads", "topologies"):
        folder = Path(__import__(package).__file__).parent
        for file in sorted(folder.rglob("*.py")):
            digest.update(str(file.relative_to(folder)).encode())
            digest.update(file.read_bytes())
    return digest.hexdigest()[:16]


def prepare(out: Path, base: Mapping[str, Any]) -> Results:
    """Create or reopen ``out``; refuse one holding a sweep of another base, or
    one made by another version of clustersim (its results would be stale)."""
    out.mkdir(parents=True, exist_ok=True)
    design = out / DESIGN
    text = yaml.safe_dump({"base": dict(base), "clustersim": code_version()}, sort_keys=True)
    if design.exists() and design.read_text() != text:
        old = yaml.safe_load(design.read_text()) or {}
        what = ("a different base scenario" if old.get("base") != dict(base)
                else "another version of clustersim")
        raise SweepError(f"--out: {out} holds a sweep of {what}; choose another directory "
                         "(or remove it to start again)")
    design.write_text(text)
    return Results(out)


def execute(base: Mapping[str, Any], base_dir: Path | None, cases: list[Case],
            workers: int = 1, dask: str | None = None) -> Iterator[dict]:
    """Run ``cases``; yield each row as it finishes (any order)."""
    args = (dict(base), str(base_dir) if base_dir else None)
    if dask:
        yield from _on_dask(dask, args, cases)
    elif workers <= 1:
        for case in cases:
            yield run_case(*args, case)
    else:
        with ProcessPoolExecutor(max_workers=workers, initializer=follow_parent,
                                 initargs=(os.getpid(), False)) as pool:
            futures = [pool.submit(run_case, *args, case) for case in cases]
            try:
                for future in as_completed(futures):
                    yield future.result()
            finally:
                for future in futures:
                    future.cancel()


def _on_dask(address: str, args: tuple, cases: list[Case]) -> Iterator[dict]:
    try:
        from distributed import Client
        from distributed import as_completed as dask_completed
    except ImportError:
        raise SweepError("--dask: needs the optional extras: pip install 'clustersim[dask]'"
                         ) from None
    try:
        client = Client(address, timeout=10)
    except OSError as error:
        raise SweepError(f"--dask: cannot reach the scheduler at {address} ({error})") from None
    try:
        futures = client.map(run_case, *([a] * len(cases) for a in args), cases, pure=False)
        for future in dask_completed(futures):
            yield future.result()
    finally:
        client.close()


def sweep(base_path: str | Path, grid: Mapping[str, list], zipped: Mapping[str, list],
          out: str | Path, workers: int = 1, dask: str | None = None,
          retry_failed: bool = False, progress: Callable[..., Any] | None = None
          ) -> tuple[Results, dict[str, str]]:
    """Validate and run a sweep into ``out``; return the results and the invalid cases.

    ``progress(total, done_before)`` returns an object with ``update(row)`` and
    ``close()`` (the CLI's progress bar); None runs silently.
    """
    base = read_raw(base_path)
    base_dir = Path(base_path).parent
    cases = expand(dict(grid), dict(zipped))
    good, invalid = validate(base, cases, base_dir)
    results = prepare(Path(out), base)
    results.order = {case.id: n for n, case in enumerate(cases)}
    _write_invalid(Path(out), cases, invalid)
    done = results.finished(retry_failed)
    todo = [case for case in good if case.id not in done]
    bar = progress(len(good), len(good) - len(todo)) if progress and good else None
    try:
        for row in execute(base, base_dir, todo, workers, dask):
            results.add(row)
            if bar:
                bar.update(row)
    finally:
        if bar:
            bar.close()
        results.write_table()
    return results, invalid
