"""clustersim's engine and everything around it.

``simulator.run(scenario)`` simulates one iteration; ``scenario`` is a path to a
YAML file, a dict in the scenario format, or a loaded ``Scenario``. It returns a
``RunResult`` with ``.summary``, ``.spans`` and ``.comms`` (pandas DataFrames)
and ``.gantt(path)``. Imports are lazy so that ``simulator.base.ir`` and
``simulator.base.units`` stay light for ``workloads`` and ``topologies``.
"""

from __future__ import annotations

from typing import Any

from simulator.base import clock  # noqa: F401 - first: the program's start (clock.STARTED)


def run(scenario: Any, overrides: tuple[str, ...] = ()):
    """Simulate ``scenario`` (path, dict or Scenario) and return its RunResult."""
    import copy
    from pathlib import Path

    from simulator.config import scenario as scenario_module
    from simulator.experiments import runner

    if isinstance(scenario, (str, Path)):
        scenario = scenario_module.load(scenario, overrides)
    elif isinstance(scenario, dict):
        scenario = scenario_module.from_dict(
            scenario_module.apply_overrides(copy.deepcopy(scenario), overrides))
    return runner.run(scenario)
