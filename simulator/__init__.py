"""clustersim's engine and everything around it.

``simulator.run(scenario)`` simulates one iteration; ``scenario`` is a path to a
YAML file, a dict in the scenario format, or a loaded ``Scenario``. It returns a
``RunResult`` with ``.summary``, ``.spans`` and ``.comms`` (pandas DataFrames)
and ``.gantt(path)``. ``simulator.search(path, space, out)`` runs a layout
search (``clustersim search``) and returns its ranked DataFrame;
``simulator.sweep(path, grid, zip, out)`` a sweep (``clustersim sweep``) and
returns its results table. Imports are
lazy so that ``simulator.base.ir`` and ``simulator.base.units`` stay light for
``workloads`` and ``topologies``.

Its packages, by layer (docs/ARCHITECTURE.md): ``base``, ``network``,
``collectives`` and ``compute``, ``engine``, ``analysis``, ``outputs``,
``config``, ``runner``, ``experiments``, ``cli`` (``python -m simulator``: ``__main__``).
"""

from __future__ import annotations

from typing import Any

from simulator.base import clock  # noqa: F401 - first: the program's start (clock.STARTED)


def run(scenario: Any, overrides: tuple[str, ...] = ()):
    """Simulate ``scenario`` (path, dict or Scenario) and return its RunResult."""
    import copy
    from pathlib import Path

    from simulator.config import scenario as scenario_module
    from simulator.runner import simulate as runner

    if isinstance(scenario, (str, Path)):
        scenario = scenario_module.load(scenario, overrides)
    elif isinstance(scenario, dict):
        scenario = scenario_module.from_dict(
            scenario_module.apply_overrides(copy.deepcopy(scenario), overrides))
    return runner.run(scenario)


def search(scenario: Any, space: dict | None = None, out: Any = None, top: int = 8,
           workers: int = 1):
    """Search the layouts of ``space`` (dimension -> values, as ``--space FILE``;
    None: every valid layout) for the scenario at path ``scenario``: the ranked
    DataFrame ``clustersim search`` writes to ``out/search.parquet`` (default
    ``runs/NAME-search``), the top ``top`` layouts simulated."""
    from pathlib import Path

    from simulator.config.scenario import machine_from, model_from, read_raw, training_from
    from simulator.experiments import layouts
    from simulator.experiments import search as searching

    if space is None:
        base, folder = read_raw(scenario), Path(scenario).parent
        machine = machine_from(base.get("cluster"), folder)
        model = model_from(base.get("model"), folder)
        training = training_from(base.get("training"), machine.gpu)
        space = layouts.default_space(machine.gpus, model.layers, model.heads,
                                      layouts.domain_of(machine), training.global_batch,
                                      model.experts)
    out = Path(out) if out is not None else Path("runs") / f"{Path(scenario).stem}-search"
    return searching.run_search(scenario, space, out, top, workers)[0]


def sweep(scenario: Any, grid: dict | None = None, zip: dict | None = None, out: Any = None,
          workers: int = 1):
    """Run a sweep of the scenario at path ``scenario`` (``clustersim sweep``):
    ``grid`` maps keys to values crossed with each other, ``zip`` keys to values
    taken together (``{"cluster.nodes": [2, 4], "parallelism.dp": [16, 32]}``);
    the cases run in ``workers`` processes into ``out`` (default
    ``runs/NAME-sweep``), resumable, a failed case kept as a row. Returns the
    results table (a DataFrame, one row per case: its keys, status and summary)."""
    from pathlib import Path

    from simulator.experiments import sweep as sweeping

    out = Path(out) if out is not None else Path("runs") / f"{Path(scenario).stem}-sweep"
    results, _ = sweeping.sweep(scenario, grid or {}, zip or {}, out, workers)
    return results.table()
