"""Layout search: the fastest parallel layout of a scenario's model on its
cluster that fits, found with the simulator.

1. Enumerate the space's layouts the simulator accepts (``layouts``).
2. First pass, every layout (``estimate``): its exact peak memory (a layout
   over the GPU's memory is listed with its peak and the category that fills
   it, never simulated), and an estimate of its iteration time from the same
   compute and collective models, without a simulation.
3. Simulate the ``top`` layouts by estimate (local worker processes, or Dask),
   each a sweep case: finished ones are logged at once and a rerun of the same
   search skips them (``sweep.Results``).
4. Rank the simulated layouts by iteration time; report the estimate's error
   against each simulation.

The first pass itself runs in worker processes and logs each layout as it is
done (``estimates.jsonl``; the table in ``estimates.parquet``), so a rerun, or
one after a kill, picks up where it stopped.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import pandas as pd

from simulator.config.scenario import from_dict, read_raw
from simulator.experiments import layouts as L
from simulator.experiments import sweep
from simulator.experiments.estimate import Estimator

GIB = 2**30
ESTIMATES = "estimates.parquet"
ESTIMATES_LOG = "estimates.jsonl"
TABLE = "search"  # search.parquet, search.csv
COLUMNS = ["rank", "layout", "status", "iteration_time_s", "tokens_per_s", "mfu",
           "peak_memory_gib", "exposed_comm_s", "bubble_s", "estimate_s", "estimate_error_pct",
           "why"]


def first_pass(base: Mapping[str, Any], found: list[L.Layout], base_dir: Path | None,
               workers: int = 1, bar=None, keep=None) -> pd.DataFrame:
    """Memory and estimated time of every layout (one row each, in ``found``'s
    order); ``keep(row)`` and ``bar.update(1)`` as each is done."""
    jobs = [(dict(base), str(base_dir) if base_dir else None, layout) for layout in found]
    if workers <= 1 or len(jobs) < 2 * workers:
        rows = [_tick(row, bar, keep) for row in map(_first_pass_star, jobs)]
    else:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            results = pool.map(_first_pass_star, jobs,
                               chunksize=max(1, len(jobs) // (16 * workers)))
            rows = [_tick(row, bar, keep) for row in results]
    if bar:
        bar.close()
    return pd.DataFrame(rows)


def _tick(row: dict, bar, keep) -> dict:
    if keep:
        keep(row)
    if bar:
        bar.update(1)
    return row


_ESTIMATORS: dict[str, Estimator] = {}  # per worker process: one per cluster


def _first_pass_star(job: tuple) -> dict[str, Any]:
    return _first_pass_one(*job)


def _first_pass_one(base: dict, base_dir: str | None, layout: L.Layout) -> dict[str, Any]:
    scenario = from_dict(layout.scenario(base), base_dir=Path(base_dir) if base_dir else None)
    key = json.dumps(base.get("cluster"), sort_keys=True, default=str)
    if key not in _ESTIMATORS:
        _ESTIMATORS.clear()
        _ESTIMATORS[key] = Estimator(scenario)
    e = _ESTIMATORS[key].estimate(scenario)
    capacity = scenario.gpu.memory_bytes
    fits = e.peak_bytes <= capacity
    why = "" if fits else (f"needs {e.peak_bytes / GIB:.1f} GiB on stage {e.peak_stage} "
                           f"({_largest(e)}), the GPU has {capacity / GIB:.0f}")
    tokens = scenario.training.global_batch * scenario.training.seq_len
    return {"layout": layout.label, **layout.as_dict(), "fits": fits, "tokens": tokens,
            "estimate_peak_gib": e.peak_bytes / GIB, "estimate_s": e.seconds,
            "estimate_bubble_s": e.bubble_s, "estimate_comm_s": e.comm_s, "why": why}


def _largest(e) -> str:
    biggest = max(e.breakdown, key=e.breakdown.get) if e.breakdown else "?"
    return f"most of it {biggest}"


def layout_of(row: Mapping[str, Any]) -> L.Layout:
    """The layout of a table's row (a column a table of an older search lacks: unset)."""
    return L.Layout(**{name: row[name] if not hasattr(row[name], "item") else row[name].item()
                       for name in L.columns() if name in row and not _missing(row[name])})


def _missing(value: Any) -> bool:
    return isinstance(value, float) and value != value  # NaN: a column older rows lack


def load_or_estimate(out: Path, base: Mapping[str, Any], found: list[L.Layout],
                     base_dir: Path | None, workers: int, bar_of=None) -> pd.DataFrame:
    """The first pass's table. Each row is appended to ``estimates.jsonl`` as it
    is done (one flushed write), so a rerun of the same search estimates only
    the layouts it had not reached (``bar_of(total, done)`` makes the bar)."""
    log = out / ESTIMATES_LOG
    done = {row["layout"]: row for row in sweep.read_log(log, "layout")}
    todo = [layout for layout in found if layout.label not in done]

    def keep(row: dict) -> None:
        with open(log, "a") as file:
            file.write(json.dumps(row, default=str) + "\n")
            file.flush()

    bar = bar_of(len(found), len(found) - len(todo)) if bar_of and todo else None
    for _, row in first_pass(base, todo, base_dir, workers, bar, keep).iterrows():
        done[row["layout"]] = row.to_dict()
    table = pd.DataFrame([done[layout.label] for layout in found])
    partial = out / f".{ESTIMATES}.partial"
    table.to_parquet(partial, index=False)
    partial.replace(out / ESTIMATES)
    return table


def choose(table: pd.DataFrame, top: int) -> pd.DataFrame:
    """The ``top`` fitting layouts by estimated time."""
    return table[table["fits"]].sort_values(["estimate_s", "layout"]).head(top)


def simulate(base: Mapping[str, Any], base_dir: Path | None, chosen: pd.DataFrame,
             out: Path, workers: int, dask: str | None, progress=None) -> dict[str, dict]:
    """Simulate the chosen layouts as sweep cases (logged as each finishes; a rerun
    skips the finished ones); {layout label: summary row}. ``progress(total,
    done before)`` makes a bar with ``update(row)`` and ``close()``."""
    results = sweep.prepare(out, base)
    cases = {layout_of(row).label: sweep.Case(layout_of(row).overrides())
             for _, row in chosen.iterrows()}
    results.order = {case.id: n for n, case in enumerate(cases.values())}
    done = results.finished()
    todo = [case for case in cases.values() if case.id not in done]
    bar = progress(len(cases), len(cases) - len(todo)) if progress else None
    try:
        for row in sweep.execute(_searchable(base), base_dir, todo, workers, dask):
            results.add(row)
            if bar:
                bar.update(row)
    finally:
        if bar:
            bar.close()
        results.write_table()
    by_id = results.rows
    return {label: by_id[case.id] for label, case in cases.items() if case.id in by_id}


def _searchable(base: Mapping[str, Any]) -> dict[str, Any]:
    """The base without the layout keys a layout sets (its ``fsdp`` section would
    contradict a ``zero`` stage)."""
    raw = dict(base)
    raw["parallelism"] = {k: v for k, v in (base.get("parallelism") or {}).items()
                          if k not in L.layout_keys()}
    return raw


def ranked(table: pd.DataFrame, simulated: Mapping[str, dict], capacity_gib: float
           ) -> pd.DataFrame:
    """Every layout, the simulated ones first by iteration time, then the others
    by estimate; the estimate's error where both exist."""
    rows = []
    for _, row in table.iterrows():
        out = {k: row[k] for k in ("layout", *L.columns(), "estimate_s", "why") if k in row}
        out["peak_memory_gib"] = row["estimate_peak_gib"]
        out["estimate_tokens_per_s"] = row["tokens"] / row["estimate_s"]
        run = simulated.get(row["layout"])
        if not row["fits"]:
            out["status"] = "does not fit"
        elif run is None:
            out["status"] = "estimated"
        elif run.get("status") != "ok":
            out.update(status="failed", why=run.get("error", ""))
        else:
            out.update(status="simulated", iteration_time_s=run["iteration_time_s"],
                       tokens_per_s=run["tokens_per_s"], mfu=run["mfu"],
                       peak_memory_gib=run["peak_memory_gib"],
                       exposed_comm_s=run["exposed_comm_s"], bubble_s=run["bubble_s"],
                       estimate_error_pct=100 * (row["estimate_s"] / run["iteration_time_s"] - 1))
            if run["peak_memory_gib"] > capacity_gib:
                out.update(status="does not fit", why="its simulated peak memory is over the GPU's")
        rows.append(out)
    result = pd.DataFrame(rows)
    for column in COLUMNS[1:]:
        if column not in result:
            result[column] = float("nan")
    order = {"simulated": 0, "estimated": 1, "failed": 2, "does not fit": 3}
    result["_order"] = result["status"].map(order)
    result["_time"] = result["iteration_time_s"].fillna(result["estimate_s"])
    result = result.sort_values(["_order", "_time", "layout"]).drop(columns=["_order", "_time"])
    result.insert(0, "rank", range(1, len(result) + 1))
    return result.reset_index(drop=True)


def write_table(table: pd.DataFrame, out: Path) -> None:
    for suffix in ("parquet", "csv"):
        final = out / f"{TABLE}.{suffix}"
        partial = final.with_name(f".{final.name}.partial")
        if suffix == "csv":
            table.to_csv(partial, index=False)
        else:
            sweep._parquet_safe(table).to_parquet(partial, index=False)
        partial.replace(final)


def run_search(base_path: str | Path, space: Mapping[str, list], out: str | Path,
               top: int = 8, workers: int = 1, dask: str | None = None,
               progress=None) -> tuple[pd.DataFrame, dict[L.Layout, str]]:
    """The whole search into ``out``: (ranked table, {refused layout: why}).
    ``progress(what, total, done before)`` makes a bar (``update``, ``close``)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = read_raw(base_path)
    base_dir = Path(base_path).parent
    space = L.check_space(space, base.get("parallelism") or {})
    found, refused = L.candidates(_searchable(base), space, base_dir)
    if not found:
        raise L.SearchError("no layout of the search space can run this scenario"
                            + (f"; the first refused: {next(iter(refused.values()))}"
                               if refused else ""))
    sweep.prepare(out, _searchable(base))  # refuses the directory of another search
    estimates = load_or_estimate(out, _searchable(base), found, base_dir, workers,
                                 (lambda n, d: progress("first pass", n, d)) if progress
                                 else None)
    simulated = simulate(_searchable(base), base_dir, choose(estimates, top), out, workers,
                         dask, (lambda n, d: progress("simulations", n, d)) if progress
                         else None)
    capacity = from_dict(found[0].scenario(_searchable(base)),
                         base_dir=base_dir).gpu.memory_bytes / GIB
    table = ranked(estimates, simulated, capacity)
    write_table(table, out)
    return table, refused
