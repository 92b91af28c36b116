"""The communication profile of a run: what each parallelism dimension sends.

From the communication log (one row per collective call or point-to-point
message; see ``simulator.runner.simulate``): per dimension and operation the number of
calls, the volume, message sizes (smallest, median, largest), time in flight
and time the first member waited; and message-size histograms in powers of two
(the bins papers use for "many small messages").

``bytes`` is the payload of the call as the program states it (a collective's
buffer size per rank, a message's size), not the wire bytes an algorithm moves.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from simulator.base.units import format_bytes


def profile(comms: pd.DataFrame) -> pd.DataFrame:
    """One row per (dimension, collective): calls, volume, sizes, time, waiting,
    the NCCL algorithms that ran them (``nvls 65``: NVLS inside one NVLink domain;
    ``ring``, ``tree`` across servers' NICs) and the algorithm bandwidth of the
    median call (its bytes over its time in flight, as nccl-tests' algbw): why
    one fabric's calls take longer than another's."""
    frame = comms.assign(dimension=comms["dimension"].astype(str),
                         duration=comms["end"] - comms["start"],
                         algorithm=comms["algorithm"].astype(str))
    frame["algbw"] = (frame["bytes"] / frame["duration"]).where(frame["duration"] > 0)
    grouped = frame.groupby(["dimension", "collective"], sort=True)
    table = grouped.agg(calls=("bytes", "size"), bytes_total=("bytes", "sum"),
                        bytes_min=("bytes", "min"), bytes_median=("bytes", "median"),
                        bytes_max=("bytes", "max"), busy_s=("duration", "sum"),
                        wait_s=("wait", "sum"), algbw_median=("algbw", "median"),
                        algorithms=("algorithm", _counted)).reset_index()
    return table


def _counted(names: pd.Series) -> str:
    """``nvls 60, ring 5``: each value and how often, the most frequent first."""
    counts = names.value_counts(sort=False)
    order = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} {count}" for name, count in order)


def size_bin(size: np.ndarray) -> np.ndarray:
    """The power-of-two bin of each size: floor(log2(bytes)), 0 for under 2 B.

    >>> size_bin(np.array([1.0, 3.0, 4096.0, 5000.0])).tolist()
    [0, 1, 12, 12]
    """
    return np.floor(np.log2(np.maximum(size, 1.0))).astype(int)


def histogram(comms: pd.DataFrame) -> pd.DataFrame:
    """Calls and volume per (dimension, power-of-two size bin)."""
    frame = comms.assign(dimension=comms["dimension"].astype(str),
                         bin=size_bin(comms["bytes"].to_numpy(float)))
    table = frame.groupby(["dimension", "bin"], sort=True).agg(
        calls=("bytes", "size"), bytes_total=("bytes", "sum")).reset_index()
    table.insert(2, "from_bytes", 2.0 ** table["bin"])
    return table.drop(columns="bin")


def format_profile(table: pd.DataFrame) -> str:
    """The profile as an aligned text table."""
    header = (f"{'dimension':<10} {'operation':<16} {'calls':>9} {'volume':>12} "
              f"{'min':>11} {'median':>11} {'max':>11} {'busy':>10} {'waited':>10} "
              f"{'algbw':>11}  algorithms")
    lines = [header, "-" * len(header)]
    for row in table.itertuples(index=False):
        algbw = (f"{row.algbw_median / 1e9:>6.1f} GB/s" if np.isfinite(row.algbw_median)
                 else f"{'-':>11}")
        lines.append(f"{row.dimension:<10} {row.collective:<16} {row.calls:>9,} "
                     f"{format_bytes(row.bytes_total):>12} {format_bytes(row.bytes_min):>11} "
                     f"{format_bytes(row.bytes_median):>11} {format_bytes(row.bytes_max):>11} "
                     f"{row.busy_s:>9.4f}s {row.wait_s:>9.4f}s {algbw}  {row.algorithms}")
    return "\n".join(lines)


def format_histogram(table: pd.DataFrame) -> str:
    """Calls per size bin and dimension as a text table."""
    pivot = table.pivot_table(index="from_bytes", columns="dimension", values="calls",
                              aggfunc="sum", fill_value=0).sort_index()
    lines = [f"{'size from':>12} " + " ".join(f"{d:>9}" for d in pivot.columns)]
    for size, row in pivot.iterrows():
        lines.append(f"{format_bytes(size):>12} " + " ".join(f"{int(v):>9,}" for v in row))
    return "\n".join(lines)
