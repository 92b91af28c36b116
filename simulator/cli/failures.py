"""What a failed command says and exits with: one rule for ``main`` and for each
scenario of a ``run`` of several (whose others still run).

Bad input exits 2 (``error: ...``); a simulation, its fabric or its outputs
failing, or the system refusing a file or memory, exits 1; anything else is a
bug: exit 3, one line, the traceback saved to a file.
"""

from __future__ import annotations

import itertools
import os
import tempfile
import traceback

from simulator.collectives.tuner import CollectiveError
from simulator.config.scenario import ScenarioError
from simulator.engine.records import SimulationError
from simulator.network.fabric import FabricError
from simulator.outputs.out_dirs import OutputError, RunDirError

# (the errors, exit code, what the line starts with), in the order they are matched
KINDS = (((ScenarioError, RunDirError), 2, "error"),
         ((SimulationError, FabricError, CollectiveError), 1, "simulation failed"),
         ((OutputError,), 1, "output failed"))
_SAVED = itertools.count(1)  # (a run of several scenarios may save more than one)


def failure(error: Exception, crash_dir: str | None) -> tuple[int, str]:
    """(exit code, the one line for stderr) of ``error``; an internal error's
    traceback is saved beside the run directory (``crash_dir``) or in the
    temporary folder, and the line says where."""
    for kinds, code, prefix in KINDS:
        if isinstance(error, kinds):
            return code, f"{prefix}: {error}"
    if isinstance(error, OSError):  # the system refused a file or a resource: not a bug
        where = f"{error.filename}: " if error.filename else ""
        return 1, f"failed: {where}{error.strerror or error}"
    if isinstance(error, MemoryError):
        return 1, ("failed: out of memory (the run needs more than this machine has free; try "
                   "fewer ranks, a shorter run, or simulation.symmetry auto)")
    where = save_traceback(crash_dir)
    return 3, (f"internal error: {type(error).__name__}: {error} (a clustersim bug; please "
               f"report it with {where})")


def save_traceback(folder: str | None) -> str:
    """Write the current exception's traceback to ``folder`` (beside the run
    directory, when the command got that far) or the temporary folder; return
    the path."""
    text = traceback.format_exc()
    n = next(_SAVED)
    name = f"clustersim-error-{os.getpid()}" + (f"-{n}" if n > 1 else "") + ".txt"
    for place in (folder, tempfile.gettempdir()):
        if place is None:
            continue
        path = os.path.join(place, name)
        try:
            with open(path, "w") as file:
                file.write(text)
            return path
        except OSError:
            continue
    return "the traceback: it could not be saved"
