"""Files a run writes: summary.json, spans.csv, comms.csv/.parquet, the
analysis tables and a Chrome/Perfetto trace.

The Chrome trace-event format (``trace.json``) opens in Perfetto and
chrome://tracing: one process per server, one thread per (GPU, stream),
complete ("X") events in microseconds with the span's details as args (bytes,
phase, micro-batch, layer; for communication also the group, collective,
algorithm and protocol of its call; for a host-bound kernel ``host_wait_us``,
the leading part of its slice spent waiting for the host's launch), flow
arrows ("s"/"t"/"f") linking the ranks of each collective call and each
message, and counters ("C") for memory over time and link traffic per server.
Everything is written in a fixed order with fixed float formatting, so the
same run gives the same bytes (``wall_s`` is the one key of summary.json that
is a measurement of this machine, and it is left out of the trace and CSVs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.base.ir import STREAMS

STREAM_ORDER = {stream: n for n, stream in enumerate(STREAMS)}  # thread order per rank
GIB = 2.0**30


def write_summary(summary: dict, path: Path) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")


def write_spans(spans: pd.DataFrame, path: Path) -> None:
    spans.to_csv(path, index=False, float_format="%.12g")


PARQUET_CHUNK = 1_000_000  # rows converted to Arrow and written at a time


def write_table(frame: pd.DataFrame, path: Path) -> None:
    """CSV or Parquet by suffix (Parquet keeps dtypes and loads fast). A large
    table goes to Parquet a chunk of rows at a time (one row group each), so
    only a chunk is ever held twice in memory."""
    if path.suffix != ".parquet":
        frame.to_csv(path, index=False, float_format="%.12g")
    elif len(frame) <= PARQUET_CHUNK:
        frame.to_parquet(path, index=False)
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        first = pa.Table.from_pandas(frame.iloc[:PARQUET_CHUNK], preserve_index=False)
        with pq.ParquetWriter(path, first.schema) as writer:
            writer.write_table(first)
            for at in range(PARQUET_CHUNK, len(frame), PARQUET_CHUNK):
                writer.write_table(pa.Table.from_pandas(
                    frame.iloc[at:at + PARQUET_CHUNK], preserve_index=False,
                    schema=first.schema))


def _tid(rank: int, stream: str) -> int:
    return int(rank) * 16 + STREAM_ORDER.get(stream, len(STREAM_ORDER))


def _call_args(comms: pd.DataFrame | None, spans: pd.DataFrame) -> dict[int, dict]:
    """The args of every log row that ``spans`` name (only those: a large run's log
    has millions of rows and a trace shows a few ranks)."""
    if comms is None or "call" not in spans.columns:
        return {}
    rows = np.unique(spans["call"].to_numpy())
    rows = rows[(rows >= 0) & (rows < len(comms))]
    named = comms.iloc[rows]
    return {int(row): {"group": f"{g}[{i}]", "collective": c, "algorithm": a, "protocol": p,
                       "channels": int(ch)} for row, g, i, c, a, p, ch in zip(
        rows.tolist(), named["group"], named["group_index"], named["collective"],
        named["algorithm"], named["protocol"], named["channels"], strict=True)}


def _slices(spans: pd.DataFrame, calls: dict[int, dict]) -> list[str]:
    """One complete ("X") event per span, as JSON text (a large run's trace has
    hundreds of thousands: formatting them directly is several times faster
    than building dicts for ``json.dumps``), args naming its rank, stream,
    phase, micro-batch, layer, bytes and, for communication, its call's group
    and algorithm; a host-bound kernel's ``host_wait_us``."""
    text = _JsonStrings()
    extra = {row: "".join(f",{json.dumps(k)}:{json.dumps(v)}" for k, v in args.items())
             for row, args in calls.items()}
    start = (spans["start"].to_numpy(float) * 1e6).tolist()
    dur = ((spans["end"].to_numpy(float) - spans["start"].to_numpy(float)) * 1e6).tolist()
    call = spans["call"].tolist() if "call" in spans.columns and calls else [-1] * len(spans)
    late = _launch_waits(spans)
    columns = [spans[c].tolist() for c in ("rank", "node", "stream", "kind", "name", "phase",
                                           "microbatch", "layer", "bytes")]
    return [
        f'{{"ph":"X","pid":{int(node)},"tid":{_tid(rank, stream)},"name":{text(name)},'
        f'"cat":{text(kind)},"ts":{round(ts, 6)!r},"dur":{round(d, 6)!r},"args":{{'
        f'"rank":{int(rank)},"stream":{text(stream)},"phase":{text(phase)},'
        f'"microbatch":{int(mb)},"layer":{int(layer)},"bytes":{float(nbytes)!r}'
        f'{extra.get(int(c), "") if c >= 0 else ""}{w}}}}}'
        for (rank, node, stream, kind, name, phase, mb, layer, nbytes), ts, d, c, w in zip(
            zip(*columns, strict=True), start, dur, call, late, strict=True)]


def _launch_waits(spans: pd.DataFrame) -> list[str]:
    """Each slice's ``host_wait_us`` arg as JSON text: its wait for its launch
    (spans' ``host_wait_s``), only where it waited."""
    if "host_wait_s" not in spans.columns:
        return [""] * len(spans)
    return [f',"host_wait_us":{round(w * 1e6, 6)!r}' if w > 0 else ""
            for w in spans["host_wait_s"].to_numpy(float).tolist()]


class _JsonStrings(dict):
    """str -> its JSON literal, each worked out once."""

    def __call__(self, value: str) -> str:
        out = self.get(value)
        if out is None:
            out = self[value] = json.dumps(str(value))
        return out


def _flows(spans: pd.DataFrame) -> list[dict]:
    """Arrows linking the communication spans of one call, rank by rank: a start
    ("s") on the lowest rank, steps ("t"), a finish ("f") on the highest; calls
    with one span get none."""
    if "call" not in spans.columns:
        return []
    comm = spans[(spans["kind"] == "comm") & (spans["call"] >= 0)]
    comm = comm.sort_values(["call", "rank"], kind="stable")
    calls = comm["call"].to_numpy()
    if len(calls) == 0:
        return []
    first = np.r_[True, calls[1:] != calls[:-1]]
    last = np.r_[calls[1:] != calls[:-1], True]
    group = np.cumsum(first) - 1
    size = np.bincount(group)[group]
    columns = [comm[c].tolist() for c in ("name", "node", "rank", "stream", "start", "end")]
    events = []
    for call, is_first, is_last, n, (name, node, rank, stream, start, end) in zip(
            calls.tolist(), first.tolist(), last.tolist(), size.tolist(),
            zip(*columns, strict=True),
            strict=True):
        if n < 2:
            continue
        events.append({"ph": "s" if is_first else "f" if is_last else "t", "id": int(call),
                       "name": name, "cat": "call", "bp": "e", "pid": int(node),
                       "tid": _tid(rank, stream),
                       "ts": round((start + end) / 2 * 1e6, 6)})  # inside its slice
    return events


def _counters(counters: Mapping[tuple[int, str], tuple[np.ndarray, np.ndarray]]) -> list[str]:
    """``(pid, name) -> (times in s, values)`` as counter events (JSON text)."""
    events = []
    for (pid, name), (times, values) in counters.items():
        head = f'{{"ph":"C","pid":{int(pid)},"name":{json.dumps(name)},"ts":'
        events += [f'{head}{round(t * 1e6, 6)!r},"args":{{"value":{round(v, 9)!r}}}}}'
                   for t, v in zip(np.asarray(times, dtype=float).tolist(),
                                   np.asarray(values, dtype=float).tolist(), strict=True)]
    return events


def layer_detail(spans: pd.DataFrame) -> pd.DataFrame:
    """One span per layer pass and stream: the spans of one rank, stream, kind,
    phase, micro-batch and layer merged, from the first's start to the last's
    end (named ``layer <n>``; bytes and launch waits summed; the log row kept where
    it was one call). For traces of runs too large to show kernel by kernel; spans outside
    layers (layer -1: embedding, optimizer, gradient buckets) stay as they are.

    >>> s = pd.DataFrame({"rank": [0, 0, 0], "node": 0, "stream": "compute",
    ...     "kind": "compute", "name": ["qkv", "proj", "adam"], "start": [0.0, 1.0, 5.0],
    ...     "end": [1.0, 2.0, 6.0], "phase": ["forward", "forward", "optimizer"],
    ...     "microbatch": [0, 0, -1], "layer": [3, 3, -1], "bytes": 1.0, "call": -1})
    >>> layer_detail(s)[["name", "start", "end", "bytes"]].values.tolist()
    [['layer 3', 0.0, 2.0, 2.0], ['adam', 5.0, 6.0, 1.0]]
    """
    inside = spans["layer"].to_numpy() >= 0
    keys = ["rank", "node", "stream", "kind", "phase", "microbatch", "layer"]
    sums = {c: (c, "sum") for c in ("bytes", "host_wait_s") if c in spans.columns}
    merged = spans[inside].groupby(keys, observed=True, sort=False).agg(
        start=("start", "min"), end=("end", "max"), **sums,
        call=("call", "min"), calls=("call", "nunique")).reset_index()
    merged.loc[merged.pop("calls") > 1, "call"] = -1
    merged["name"] = "layer " + merged["layer"].astype(str)
    out = pd.concat([merged[list(spans.columns)], spans[~inside]], ignore_index=True)
    for column in ("stream", "kind", "phase"):
        out[column] = out[column].astype(str)
    return out.sort_values(["rank", "start", "end", "stream"], kind="stable",
                           ignore_index=True)


def chrome_trace(spans: pd.DataFrame, placement: list[str], comms: pd.DataFrame | None = None,
                 counters: Mapping | None = None, detail: str = "kernel") -> dict:
    """The trace-event JSON object for ``spans`` (see the module doc); ``detail``
    says what one slice is (``kernel``, or ``layer`` after ``layer_detail``)."""
    return json.loads(chrome_trace_text(spans, placement, comms, counters, detail))


def chrome_trace_text(spans: pd.DataFrame, placement: list[str],
                      comms: pd.DataFrame | None = None, counters: Mapping | None = None,
                      detail: str = "kernel") -> str:
    """``chrome_trace`` as compact JSON text, events in a fixed order."""
    events: list[dict] = []
    for node in sorted(spans["node"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(node), "tid": 0,
                       "args": {"name": f"node {node}"}})
    threads = spans[["node", "rank", "stream"]].drop_duplicates()
    for node, rank, stream in threads.itertuples(index=False):
        tid = _tid(rank, stream)
        events.append({"ph": "M", "name": "thread_name", "pid": int(node), "tid": tid,
                       "args": {"name": f"rank {rank} {placement[rank]} {stream}"}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": int(node), "tid": tid,
                       "args": {"sort_index": tid}})
    compact = {"separators": (",", ":")}
    lines = [json.dumps(e, **compact) for e in events]
    lines += _slices(spans, _call_args(comms, spans))
    lines += [json.dumps(e, **compact) for e in _flows(spans)]
    lines += _counters(counters or {})
    other = {"detail": detail, "ranks": sorted(int(r) for r in spans["rank"].unique())}
    return (f'{{"traceEvents":[{",".join(lines)}],"displayTimeUnit":"ms",'
            f'"otherData":{json.dumps(other, **compact)}}}')


def memory_counters(memory: Mapping[int, tuple], node_of_rank: list[int]) -> dict:
    """Memory timelines (rank -> (times, bytes)) as counters per server, in GiB."""
    return {(node_of_rank[rank], f"memory rank {rank} (GiB)"): (times, np.asarray(b) / GIB)
            for rank, (times, b) in sorted(memory.items())}


def write_chrome_trace(spans: pd.DataFrame, placement: list[str], path: Path,
                       comms: pd.DataFrame | None = None,
                       counters: Mapping | None = None, detail: str = "kernel") -> None:
    path.write_text(chrome_trace_text(spans, placement, comms, counters, detail))
