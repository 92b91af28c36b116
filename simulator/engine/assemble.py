"""The engine a run uses: the reference core plus the chosen plug-ins.

Each plug-in is a subclass of ``Engine`` in its own module; an engine with
several is the class that inherits from all of them (Python's method order
chains their hooks). ``PLUGINS`` is the registry: adding a speed-up is one
module and one line here, plus its equivalence test.
"""

from __future__ import annotations

from collections.abc import Mapping
from functools import cache
from types import MappingProxyType

from simulator.engine.batching import BatchedCompute
from simulator.engine.call_groups import CallGroups
from simulator.engine.core import Engine
from simulator.engine.exclusive import ExclusiveLinks
from simulator.engine.folding import Folding
from simulator.engine.gangs import Gangs
from simulator.engine.layer_spans import LayerSpans
from simulator.engine.passes import Passes
from simulator.engine.pipeline_streams import PipelineStreams

PLUGINS: Mapping[str, type[Engine]] = MappingProxyType({
    # outermost first: a plug-in listed earlier overrides the hooks of later ones
    "pipeline_streams": PipelineStreams,  # needs passes: compute and pipeline streams driven
    "passes": Passes,  # needs exclusive_links and Program.steps: replays pipeline steps
    "exclusive_links": ExclusiveLinks,  # needs gangs: settles calls a gang fills alone
    "call_groups": CallGroups,  # needs gangs: a gang's whole groups' calls as one batch
    "gangs": Gangs,
    "folding": Folding,
    "layer_spans": LayerSpans,  # includes batching
    "batching": BatchedCompute,
})


def engine_class(*names: str) -> type[Engine]:
    """The Engine class with the named plug-ins (any order; ``()``: the reference).

    >>> engine_class("batching", "gangs").__mro__[1:3] == (Gangs, BatchedCompute)
    True
    """
    unknown = [n for n in names if n not in PLUGINS]
    if unknown:
        raise ValueError(f"unknown engine plug-in {unknown[0]!r}; known: {', '.join(PLUGINS)}")
    return _composed(tuple(n for n in PLUGINS if n in names))


@cache
def _composed(names: tuple[str, ...]) -> type[Engine]:
    """One class per set of plug-ins, in registry order."""
    if not names:
        return Engine
    return type(f"Engine[{','.join(names)}]", tuple(PLUGINS[n] for n in names), {})
