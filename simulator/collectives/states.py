"""A fabric in each of its states, each with its lowering, built in one place.

A run's fabric is the cluster's graph as it starts, then the graph after each
change a fault brings at a given time (``config.cluster.Machine.changes``).
Each state lowers calls on its own fabric with its own ``Collectives``, whose
call keys carry the state's number, so a call lowered before a change is
never taken for one lowered after it. Blame also needs each call's time alone
on the healthy fabric (no faults at all), lowered there with the same
settings. Every user builds them here from the same settings (the algorithm
and protocol a scenario forces, or None for the tuner's choice; NCCL's
pipelined steps or lockstep ring steps): the run, blame, the layout estimate,
validation, the ``collective`` command and its benchmark.

>>> from topologies import CLUSTERS, build_cluster
>>> states = FabricStates.build(build_cluster(CLUSTERS["dgx-a100"], 1))
>>> len(states.gpus), states.changes, states.healthy is states.lowering
(8, [], True)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import networkx as nx

from simulator.collectives.nccl import Algorithm, Protocol
from simulator.collectives.tuner import Collectives
from simulator.network.fabric import Fabric

State = tuple[float, Fabric, Collectives]  # (from this time on, the fabric, its lowering)


@dataclass
class FabricStates:
    """The fabric from time 0 and after each change, each with its lowering, and
    the lowering on the healthy fabric (made when first asked for)."""

    states: list[State]
    settings: tuple[Algorithm | None, Protocol | None, bool]  # algorithm, protocol, lockstep
    healthy_graph: Callable[[], nx.DiGraph] | None = None  # None: the fabric has no faults
    _healthy: Collectives | None = None

    @classmethod
    def build(cls, graph: nx.DiGraph, changes: Sequence[tuple[float, nx.DiGraph]] = (), *,
              algorithm: Algorithm | None = None, protocol: Protocol | None = None,
              lockstep: bool = False,
              healthy_graph: Callable[[], nx.DiGraph] | None = None) -> FabricStates:
        """``graph`` as the run starts and each ``(time, graph)`` change after it;
        ``healthy_graph`` makes the graph without faults (None: ``graph`` is it)."""
        settings = (algorithm, protocol, lockstep)
        fabric = Fabric(graph, [later for _, later in changes])
        states = [(0.0, fabric, _lowering(fabric, settings, 0))]
        for epoch, (at, later) in enumerate(changes, start=1):
            after = fabric.after(later)
            states.append((at, after, _lowering(after, settings, epoch)))
        return cls(states, settings, healthy_graph)

    @property
    def fabric(self) -> Fabric:
        """The fabric as the run starts."""
        return self.states[0][1]

    @property
    def lowering(self) -> Collectives:
        """The lowering of calls on the fabric as the run starts."""
        return self.states[0][2]

    @property
    def changes(self) -> list[State]:
        """The states after the first, in time order."""
        return self.states[1:]

    @property
    def gpus(self) -> list[str]:
        """The fabric's GPUs in rank order."""
        return self.fabric.graph.graph["gpus"]

    @property
    def healthy(self) -> Collectives:
        """The lowering on the fabric without faults (the first state's where it
        has none)."""
        if self._healthy is None:
            self._healthy = self.lowering if self.healthy_graph is None else _lowering(
                Fabric(self.healthy_graph()), self.settings, -1)
        return self._healthy


def _lowering(fabric: Fabric, settings: tuple, epoch: int) -> Collectives:
    algorithm, protocol, lockstep = settings
    return Collectives(fabric, algorithm, protocol, lockstep=lockstep, epoch=epoch)
