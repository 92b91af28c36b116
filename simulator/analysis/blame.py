"""Blame: what set the iteration time beyond the ideal, ranked.

The critical path (``analysis.critical_path``) is the chain of spans whose
length is the iteration time. Each of its spans is measured against what it
would have taken on an ideal cluster, and the excess is charged to a cause:

- a **compute** span on a GPU slower than the kernel table (``cluster.slow``,
  ``gpu_speed_spread``, ``throttle``) took ``duration - work`` more than at full
  speed, where ``work`` is the kernel time at full speed (``pace``); charged
  to that rank (a straggler). A host-bound kernel's launch floor, which a slow
  GPU does not change, is counted as slowed too, so this is an upper bound;
- a **communication** span took ``duration - alone``, where ``alone`` is the
  same call alone on the healthy fabric (no faults, no other traffic); charged
  to the link of its routes that was the most loaded while it ran (bytes of
  every call crossing it over its capacity then, ``link_load``): a congested
  or degraded link. Where several jobs share the fabric, the excess is split
  over the jobs whose calls crossed that link then, by their share of its
  bytes: the other jobs' parts are charged to each as a **job**, the rank's
  own job's part to the link.

Waiting is not on the path where its cause is simulated (the path runs
through the late rank instead), so the causes above cover the excess. The
slowest rank of each collective call, the last to arrive, comes from the
spans too (``last_arrivals``): the member that waited least, with the time
every other member waited for it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from simulator.analysis.link_load import CALL_KEYS, Context, LinkLoad, link_load

MIN_EXCESS = 0.01  # a span within 1 % of its ideal is charged to nothing
TOP = 8  # causes kept in the summary
ANALYSED = 16  # kinds of call on the critical path whose links' loads are worked out


@dataclass
class Cause:
    """One thing the iteration waited for, and how long."""

    kind: str  # "straggler", "link" or "job"
    name: str  # "rank 5", "n1.nic0 -> leaf1", "other calls", a job's name
    seconds: float
    detail: str = ""

    def row(self) -> dict:
        return {"kind": self.kind, "cause": self.name, "seconds": self.seconds,
                "detail": self.detail}


def last_arrivals(spans: pd.DataFrame) -> pd.DataFrame:
    """Per collective call with waiting (rows of the communication log): the member
    that arrived last (waited least; ties: the lowest rank) and how long the
    others waited for it in all (rank-seconds)."""
    comm = spans[(spans["call"] >= 0) & spans["kind"].isin(["comm", "wait"])]
    if comm.empty:
        return pd.DataFrame(columns=["call", "rank", "members", "waited_s"])
    waited = np.where(comm["kind"].to_numpy() == "wait",
                      comm["end"].to_numpy() - comm["start"].to_numpy(), 0.0)
    per = pd.DataFrame({"call": comm["call"].to_numpy(), "rank": comm["rank"].to_numpy(),
                        "waited": waited}).groupby(["call", "rank"], sort=True).sum()
    per = per.reset_index()
    totals = per.groupby("call")["waited"].agg(["sum", "size"])
    late = per.sort_values(["call", "waited", "rank"]).drop_duplicates("call")
    out = pd.DataFrame({"call": late["call"].to_numpy(), "rank": late["rank"].to_numpy(),
                        "members": totals.loc[late["call"], "size"].to_numpy(),
                        "waited_s": totals.loc[late["call"], "sum"].to_numpy()})
    return out[out["waited_s"] > 0].reset_index(drop=True)


def ranks_to_blame(last: pd.DataFrame) -> pd.DataFrame:
    """Per rank: the calls it arrived last at and the rank-seconds others waited."""
    if last.empty:
        return pd.DataFrame(columns=["rank", "calls_last", "caused_wait_s"])
    out = last.groupby("rank").agg(calls_last=("call", "size"),
                                   caused_wait_s=("waited_s", "sum")).reset_index()
    return out.sort_values(["caused_wait_s", "rank"], ascending=[False, True],
                           ignore_index=True)


def path_causes(path: pd.DataFrame, spans: pd.DataFrame,
                work: Callable[[int, float, float], float] | None,
                alone: Callable[[int], tuple[float, Sequence[int]]],
                load: LinkLoad,
                capacity: Callable[[Sequence[int], float, float], np.ndarray],
                link_name: Callable[[int], str], link_state: Callable[[int], str],
                other_jobs: Callable[[int, int, float, float], dict[str, float]] | None = None
                ) -> list[Cause]:
    """The critical path's excess over the ideal, per cause, largest first.

    ``work(rank, start, end)``: full-speed seconds of compute a rank did in that
    time (None: every GPU at full speed); ``alone(call)``: the call's time alone
    on the healthy fabric and the links its routes crossed (none: not
    analysed); ``capacity(links, start, end)``: the bytes each could carry then
    (its bandwidth changes where parts fail during the run); ``other_jobs(link,
    rank, start, end)``: the jobs other than ``rank``'s that moved bytes over
    the link then, each with its share of them (None: one job)."""
    totals: dict[tuple[str, str], list] = {}  # (kind, name) -> [seconds, detail, worst]

    def charge(kind: str, name: str, seconds: float, detail: str, use: float = -1.0):
        entry = totals.setdefault((kind, name), [0.0, detail, -1.0])
        entry[0] += seconds
        entry[2] = max(entry[2], use)

    calls = spans["call"].to_numpy() if "call" in spans else None
    for row in path.itertuples(index=False):
        duration = row.end - row.start
        if duration <= 0:
            continue
        if row.category == "compute" and work is not None:
            excess = duration - work(int(row.rank), row.start, row.end)
            if excess > MIN_EXCESS * duration:
                charge("straggler", f"rank {int(row.rank)}", excess,
                       "compute slower than at full speed")
            continue
        call = int(calls[int(row.span)]) if (
            row.category == "communication" and calls is not None and row.span >= 0) else -1
        if call < 0:
            continue
        ideal, links = alone(call)
        excess = duration - ideal
        if excess <= MIN_EXCESS * duration:
            continue
        if not links:
            charge("link", "other calls", excess, "links not analysed (smaller losses)")
            continue
        carried = np.maximum(capacity(links, row.start, row.end), 1e-30)
        loaded = {link: load.bytes(link, row.start, row.end) / can
                  for link, can in zip(links, carried.tolist(), strict=True)}
        busiest = max(links, key=lambda link: (loaded[link], -link))
        shares = other_jobs(busiest, int(row.rank), row.start, row.end) if other_jobs else {}
        for job, share in shares.items():
            charge("job", job, excess * share, f"its calls on {link_name(busiest)}",
                   loaded[busiest])
        own = excess * (1.0 - sum(shares.values()))
        if own > 0:
            charge("link", link_name(busiest), own, link_state(busiest), loaded[busiest])
    causes = []
    for (kind, name), (seconds, detail, worst) in totals.items():
        if worst >= 0:
            load_text = "over its capacity" if worst > 10 else f"{100 * worst:.0f} % loaded"
            detail = f"{detail}; {load_text} at worst".lstrip("; ")
        causes.append(Cause(kind, name, seconds, detail))
    return sorted(causes, key=lambda c: (-c.seconds, c.kind, c.name))


def work_of(speed, clocks: dict | None):
    """A function (rank, start, end) -> full-speed seconds of compute its GPU did
    then (``analysis.blame``), or None when every GPU runs at full speed."""
    if speed is None and not clocks:
        return None
    clocks = clocks or {}

    def work(rank: int, start: float, end: float) -> float:
        clock = clocks.get(rank)
        done = end - start if clock is None else clock.work(start, end)
        return done / (1.0 if speed is None else float(speed[rank]))
    return work


def causes(spans: pd.DataFrame, comms: pd.DataFrame, path: pd.DataFrame,
           context: Context, analysed: int = ANALYSED) -> list:
    """The ranked causes of the critical path's excess (``analysis.blame``): link
    loads are worked out for the ``analysed`` kinds of call (same group, size and
    fabric state) that lost the most time on the path; the rest is charged to
    "other calls"."""
    on_path = path[(path["category"] == "communication") & (path["span"] >= 0)]
    calls = spans["call"].to_numpy()[on_path["span"].to_numpy(int)] if len(on_path) else []
    calls = np.asarray(calls, dtype=np.int64)
    distinct = np.unique(calls[calls >= 0])
    rows = comms.iloc[distinct]
    kind_of = {int(c): (call, int(st)) for c, call, st in zip(
        distinct.tolist(), rows[CALL_KEYS].itertuples(index=False, name=None),
        context.state_at(rows["start"].to_numpy()).tolist(), strict=True)}
    lost: dict[tuple, float] = {}
    for call, start, end in zip(calls.tolist(), on_path["start"].tolist(),
                                on_path["end"].tolist(), strict=True):
        if call >= 0:
            kind = kind_of[call]
            excess = end - start - context.alone_of(*kind)[0]
            if excess > MIN_EXCESS * (end - start):  # (what path_causes charges)
                lost[kind] = lost.get(kind, 0.0) + excess
    top = set(sorted(lost, key=lambda k: -lost[k])[:analysed])
    wanted = {link for kind in top for link in context.alone_of(*kind)[1]}
    load = link_load(comms, context, wanted) if wanted else LinkLoad({})
    other_jobs = _other_jobs(comms, context, wanted) if context.job_of and wanted else None
    fabric, healthy = context.states[0][1], context.healthy.fabric

    def alone(call: int) -> tuple[float, tuple[int, ...]]:
        ideal, links = context.alone_of(*kind_of[call])
        return ideal, links if kind_of[call] in top else ()

    def healthy_capacity(link: int) -> float:
        index = healthy.index.get(fabric.ends(link))
        return float(healthy.capacity[index]) if index is not None else 1.0

    def state_of(link: int) -> str:
        worst = min(float(f.capacity[link]) / healthy_capacity(link)
                    for _, f, _ in context.states)
        return ("" if worst >= 1.0 - 1e-9 else "down" if worst <= 0 else
                f"at {worst:.0%} of its bandwidth")

    def carried(links: Sequence[int], start: float, end: float) -> np.ndarray:
        return context.capacities(links, np.array([start]), np.array([end]))[:, 0]

    return path_causes(path, spans, context.work, alone, load, carried,
                       lambda link: " -> ".join(fabric.ends(link)), state_of, other_jobs)


def _other_jobs(comms: pd.DataFrame, context: Context, links: set[int]) -> Callable:
    """``other_jobs(link, rank, start, end)`` for ``analysis.blame.path_causes``:
    each job besides ``rank``'s that moved bytes over ``link`` then, with its
    share of the link's bytes."""
    owner = context.jobs_of(comms)
    loads = {job: link_load(comms[owner == job], context, links) for job in np.unique(owner)}

    def other_jobs(link: int, rank: int, start: float, end: float) -> dict[str, float]:
        moved = {job: load.bytes(link, start, end) for job, load in loads.items()}
        total = sum(moved.values())
        return {job: b / total for job, b in moved.items()
                if job != context.job_of[rank] and b > 0} if total > 0 else {}
    return other_jobs
