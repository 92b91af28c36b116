"""What the engine records and hands back: span and log columns, calls,
messages, the result, and the error for programs that cannot finish."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import simpy

from simulator.base.ir import Op
from simulator.engine.call_log import CallLog

Span = tuple  # (rank, stream, kind, name, start, end, phase, microbatch, layer, bytes, call)
SPAN_COLUMNS = ("rank", "stream", "kind", "name", "start", "end", "phase", "microbatch",
                "layer", "bytes", "call")  # call: row of the collectives log, -1 for compute
SPAN_DTYPES = (int, object, object, object, float, float, object, int, int, float, int)
SPAN_TEXT = ("stream", "kind", "name", "phase")  # few distinct values: kept as categories
COLLECTIVE_COLUMNS = ("group", "group_index", "seq", "collective", "name", "ranks", "bytes",
                      "algorithm", "protocol", "channels", "first_arrival", "start", "end")


class SimulationError(RuntimeError):
    """The program cannot finish (a collective some members never reach)."""


class NotInLockstep(RuntimeError):
    """Ranks simulated as one (a gang) did not run in lockstep: the reduction is not
    exact for this scenario (raised at the end of a strict gang run). ``split``
    groups each diverged gang's ranks by the ends they saw."""

    def __init__(self, message: str, split: list[tuple[int, ...]]) -> None:
        super().__init__(message, split)  # both in args: SimPy re-raises a copy
        self.split = split

    def __str__(self) -> str:
        return str(self.args[0])


@dataclass
class Call:
    """One collective call of one group, gathering its members."""

    op: Op
    members: tuple[int, ...]
    done: simpy.Event
    arrivals: dict[int, float] = field(default_factory=dict)
    expected: int = 0  # members that will arrive
    start: float = 0.0
    end: float = 0.0
    row: int = -1  # its row in the collectives log, once finished


@dataclass
class Message:
    """One point-to-point message, from the sender's send to the receiver's receive."""

    done: simpy.Event
    start: float | None = None
    end: float | None = None
    row: int = -1


@dataclass
class EngineResult:
    spans: list[Span]
    collectives: CallLog  # its rows: .frame(COLLECTIVE_COLUMNS)
    memory_events: list[list[tuple[float, float, str]]]  # per rank: (time, delta, category)
    events: int
    network_recomputes: int
    ranks: list[int]  # the ranks whose programs ran
    # spans of the running ranks (a DataFrame) -> every rank's; None: they are every rank's
    expand: Callable | None = None
    # why a plug-in's result may differ from the reference's (None: it is the same)
    inexact: str | None = None
    # the spans of replayed steps as columns (SPAN_COLUMNS; text as codes and categories),
    # besides ``spans``, made when called (engine.passes); None: no step was replayed
    replayed: Callable[[], dict] | None = None
    # what the speed-ups did: calls settled alone (exclusive_links), steps replayed (passes)
    calls_alone: int = 0
    steps_replayed: int = 0
