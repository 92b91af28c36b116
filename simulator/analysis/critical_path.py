"""The critical path: the chain of spans that sets the iteration time.

Walk back from the span that ends last. In the engine every op starts exactly
when the last thing it waited for ended, so the span before the current one
is the one that ended when it started:

- on the same rank, a compute or communication span ending at that instant
  (the stream's previous op, or a dependency: a receive before the compute it
  feeds, the compute before the collective that reduces it);
- if the rank *waited* there (a ``wait`` span ends at that instant: peers of a
  collective not yet there, or a pipeline message not yet sent), the cause is
  on another rank: the member of the same call (``call`` column: the row of
  the collectives log) that did not wait, the last to arrive or the sender,
  and the path continues from what that rank finished at that instant.

Where the cause is not in the spans (folded ranks), the wait itself is on the
path; where nothing ends at the instant, the gap is ``idle``. The path is
contiguous from time 0 to the iteration's end, so its length is the
iteration time; its shares say what the iteration time is made of on the
chain that sets it. Waiting and bubbles are on the path only where their cause
is not simulated: otherwise the path runs through the late rank, and a
pipeline's fill and drain show up as compute on other stages (``stages``).
This is the usual critical-path analysis of a dependency graph (e.g. Holistic
Trace Analysis), with the dependencies recovered from exact event times.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.analysis.timeline import labels
from simulator.base.ir import PP_STREAM

CATEGORIES = ("compute", "communication", "waiting", "bubble", "idle")
PATH_COLUMNS = ("rank", "stream", "kind", "name", "start", "end", "category", "span")
GENERAL = -2  # a span whose predecessor the walk works out (_previous)


class _Index:
    """Spans sorted by (rank, end) and by call, for lookups at one instant."""

    def __init__(self, spans: pd.DataFrame) -> None:
        self.rank = spans["rank"].to_numpy()
        self.stream, self.kind = labels(spans["stream"]), labels(spans["kind"])
        self.start = spans["start"].to_numpy(float)
        self.end = spans["end"].to_numpy(float)
        self.call = spans["call"].to_numpy() if "call" in spans else np.full(len(spans), -1)
        self.by_end = np.lexsort((self.end, self.rank))
        self.rank_sorted = self.rank[self.by_end]
        self.end_sorted = self.end[self.by_end]
        self.by_call = np.argsort(self.call, kind="stable")
        self.call_sorted = self.call[self.by_call]
        self.eps = 1e-9 * max(1e-12, float(self.end.max()) if len(self.end) else 0.0)
        self.per_rank: dict[int, tuple[int, np.ndarray]] = {}
        self.simple = self._simple_previous()

    def _simple_previous(self) -> np.ndarray:
        """Per span, its predecessor on the path where the rule needs no choice,
        found for all spans at once: the one span of its rank that ends when it
        starts (a compute or communication span), or, where none does, the span
        that ended last before (-1: none). ``GENERAL`` where the walk must decide
        (several spans, or a wait, end then)."""
        out = np.full(len(self.start), GENERAL, dtype=np.int64)
        bounds = np.flatnonzero(np.diff(self.rank_sorted)) + 1
        for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, len(self.rank_sorted)],
                          strict=True):
            ends, mine = self.end_sorted[lo:hi], self.by_end[lo:hi]
            t = self.start[mine]
            a = ends.searchsorted(t - self.eps, "left")
            b = ends.searchsorted(t + self.eps, "right")
            none = b == a
            out[mine[none]] = np.where(a[none] > 0, mine[np.maximum(a[none] - 1, 0)], -1)
            one = np.flatnonzero(b == a + 1)
            found = mine[a[one]]
            clear = (self.start[found] < t[one] - self.eps) & (self.kind[found] != "wait")
            out[mine[one[clear]]] = found[clear]
        return out

    def _ends(self, rank: int) -> tuple[int, np.ndarray]:
        """Where ``rank``'s spans start in the (rank, end) order, and their ends."""
        if rank not in self.per_rank:
            lo = int(self.rank_sorted.searchsorted(rank, "left"))
            hi = int(self.rank_sorted.searchsorted(rank, "right"))
            self.per_rank[rank] = (lo, self.end_sorted[lo:hi])
        return self.per_rank[rank]

    def ending(self, rank: int, t: float) -> np.ndarray:
        """Spans of ``rank`` ending at ``t`` (within a relative 1e-9) with length."""
        lo, ends = self._ends(rank)
        a = lo + int(ends.searchsorted(t - self.eps, "left"))
        b = lo + int(ends.searchsorted(t + self.eps, "right"))
        found = self.by_end[a:b]
        return found[self.start[found] < t - self.eps]

    def before(self, rank: int, t: float) -> int | None:
        """The span of ``rank`` that ends last before ``t``, if any."""
        lo, ends = self._ends(rank)
        at = lo + int(ends.searchsorted(t - self.eps, "left")) - 1
        return int(self.by_end[at]) if at >= lo else None

    def of_call(self, call: int) -> np.ndarray:
        a = np.searchsorted(self.call_sorted, call, "left")
        b = np.searchsorted(self.call_sorted, call, "right")
        return self.by_call[a:b]


def _prefer(index: _Index, found: np.ndarray, stream: str) -> int:
    """Among spans ending together: the same stream, then compute, then the longest."""
    order = sorted(found.tolist(), key=lambda i: (index.stream[i] != stream,
                                                  index.kind[i] != "compute",
                                                  index.start[i], i))
    return order[0]


def _cause(index: _Index, current: int, t: float) -> int | None:
    """What another rank finished at ``t`` that let ``current``'s call start: the
    member of the call that did not wait (last to arrive, or the sender)."""
    call = int(index.call[current])
    if call < 0:
        return None
    members = index.of_call(call)
    waited = {int(index.rank[i]) for i in members if index.kind[i] == "wait"}
    for rank in sorted({int(index.rank[i]) for i in members} - waited):
        found = index.ending(rank, t)
        found = found[(index.kind[found] != "wait") & (index.call[found] != call)]
        if len(found):
            return _prefer(index, found, index.stream[current])
    return None


def _previous(index: _Index, current: int) -> int | None:
    """The span before ``current`` on the path (it may end before ``current``
    starts, leaving an idle gap), or None at the start of the run."""
    t, rank = index.start[current], int(index.rank[current])
    found = index.ending(rank, t)
    waits = found[index.kind[found] == "wait"]
    work = found[index.kind[found] != "wait"]
    if len(waits):
        cause = _cause(index, current, t)
        if cause is not None:
            return cause
    if len(work):
        return _prefer(index, work, index.stream[current])
    if len(waits):
        return _prefer(index, waits, index.stream[current])
    return index.before(rank, t)


def category(kind: str, stream: str) -> str:
    """Path category of a span: compute, communication, waiting or bubble."""
    if kind == "wait":
        return "bubble" if stream == PP_STREAM else "waiting"
    return "communication" if kind == "comm" else "compute"


def critical_path(spans: pd.DataFrame) -> pd.DataFrame:
    """The chain of spans (and idle gaps) that sets the iteration time, in time
    order; ``span`` is the row of ``spans`` (-1 for a gap)."""
    if spans.empty:
        return pd.DataFrame(columns=list(PATH_COLUMNS))
    index = _Index(spans)
    last = int(np.lexsort((index.rank, -index.end))[0])
    rows: list[tuple] = []
    current: int | None = last
    cursor = float(index.end[last])
    while current is not None and cursor > index.eps:
        start, end = float(index.start[current]), float(index.end[current])
        if end < cursor - index.eps:  # nothing ended when ``cursor``'s span started
            rows.append((int(index.rank[current]), "", "idle", "", end, cursor, "idle", -1))
        rows.append((int(index.rank[current]), index.stream[current], index.kind[current],
                     "", start, min(end, cursor),
                     category(index.kind[current], index.stream[current]), current))
        cursor = start
        simple = int(index.simple[current])
        current = _previous(index, current) if simple == GENERAL else (
            simple if simple >= 0 else None)
    if cursor > index.eps:
        rank = rows[-1][0] if rows else 0
        rows.append((rank, "", "idle", "", 0.0, cursor, "idle", -1))
    path = pd.DataFrame(rows[::-1], columns=list(PATH_COLUMNS))
    named = path["span"].to_numpy() >= 0
    path.loc[named, "name"] = spans["name"].iloc[path["span"][named]].astype(str).to_numpy()
    return path


def shares(path: pd.DataFrame, stage_of: dict[int, int] | None = None) -> dict[str, object]:
    """Seconds of the path in each category, and how many spans, ranks and
    pipeline stages it passes through."""
    seconds = (path["end"] - path["start"]).groupby(path["category"]).sum()
    out: dict[str, object] = {f"{c}_s": float(seconds.get(c, 0.0)) for c in CATEGORIES}
    out["length_s"] = float((path["end"] - path["start"]).sum())
    out["spans"] = int((path["span"] >= 0).sum())
    ranks = sorted(set(path.loc[path["span"] >= 0, "rank"].tolist()))
    out["ranks"] = len(ranks)
    if stage_of:
        out["stages"] = len({stage_of.get(r, 0) for r in ranks})
    return out
