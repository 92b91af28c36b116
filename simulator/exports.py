"""Files a run writes: summary.json, spans.csv, comms.csv and a Chrome trace.

The Chrome trace-event format (``trace.json``) opens in Perfetto and
chrome://tracing: one process per server, one thread per (GPU, stream),
complete ("X") events in microseconds with the span's details as args.
Everything is written in a fixed order with fixed float formatting, so the same
run gives the same bytes (``wall_s`` is the one key of summary.json that is a
measurement of this machine, and it is left out of the trace and CSVs).
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

STREAM_ORDER = {"compute": 0, "dp": 1, "tp": 2, "cp": 3, "pp": 4}


def write_summary(summary: dict, path: Path) -> None:
    path.write_text(json.dumps(summary, indent=2, sort_keys=False) + "\n")


def write_spans(spans: pd.DataFrame, path: Path) -> None:
    spans.to_csv(path, index=False, float_format="%.12g")


def chrome_trace(spans: pd.DataFrame, placement: list[str]) -> dict:
    """The trace-event JSON object for ``spans``."""
    events: list[dict] = []
    threads: dict[tuple[int, int], str] = {}
    for node in sorted(spans["node"].unique()):
        events.append({"ph": "M", "name": "process_name", "pid": int(node), "tid": 0,
                       "args": {"name": f"node {node}"}})
    for row in spans.itertuples(index=False):
        stream_index = STREAM_ORDER.get(row.stream, len(STREAM_ORDER))
        tid = int(row.rank) * 16 + stream_index
        key = (int(row.node), tid)
        if key not in threads:
            threads[key] = f"rank {row.rank} {placement[row.rank]} {row.stream}"
        events.append({
            "ph": "X", "pid": int(row.node), "tid": tid, "name": row.name, "cat": row.kind,
            "ts": round(row.start * 1e6, 6), "dur": round((row.end - row.start) * 1e6, 6),
            "args": {"rank": int(row.rank), "stream": row.stream, "phase": row.phase,
                     "microbatch": int(row.microbatch), "layer": int(row.layer),
                     "bytes": float(row.bytes)},
        })
    for (pid, tid), name in threads.items():
        events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid,
                       "args": {"name": name}})
        events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                       "args": {"sort_index": tid}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def write_chrome_trace(spans: pd.DataFrame, placement: list[str], path: Path) -> None:
    path.write_text(json.dumps(chrome_trace(spans, placement), separators=(",", ":")))
