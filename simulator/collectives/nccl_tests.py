"""``clustersim collective``: an nccl-tests-style sweep of one collective.

Like ``all_reduce_perf -b 1M -e 8G -f 2``: for each size from ``min`` to ``max``
(multiplied by ``factor``) it times the collective alone on an idle fabric and
reports algbw = S / t and busbw = algbw x the operation's factor
(nccl-tests ``doc/PERFORMANCE.md``): 2(n-1)/n for all-reduce, (n-1)/n for
all-gather, reduce-scatter and all-to-all, 1 for broadcast, reduce and
send/recv. S is the nccl-tests "size" column. Every time comes out of the
simulation (flows on the fabric plus NCCL's latency model), never a formula
alone.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass

from simulator.base.ir import Collective
from simulator.collectives.expert_exchange import KINDS as EXPERT_EXCHANGES
from simulator.collectives.tuner import Collectives, isolated_run
from simulator.network.fabric import Fabric

DTYPES = {"int8": 1, "uint8": 1, "half": 2, "bfloat16": 2, "float": 4, "int32": 4,
          "double": 8, "int64": 8}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)\s*$", re.IGNORECASE)
_BINARY = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}


def bus_factor(kind: Collective, n: int) -> float:
    """nccl-tests' bus bandwidth factor for ``n`` ranks."""
    if kind is Collective.ALL_REDUCE:
        return 2.0 * (n - 1) / n
    if kind in (Collective.ALL_GATHER, Collective.REDUCE_SCATTER, Collective.ALL_TO_ALL,
                *EXPERT_EXCHANGES):
        return (n - 1) / n
    return 1.0


def parse_size(text: str) -> int:
    """nccl-tests sizes: a byte count with an optional K, M, G or T (powers of 1024).

    >>> parse_size("8G"), parse_size("1M"), parse_size("512")
    (8589934592, 1048576, 512)
    """
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size; write e.g. 512, 64K, 1M or 8G")
    return int(float(match[1]) * _BINARY[match[2].upper()])


MAX_SIZES = 1_000  # sizes one sweep may time (nccl-tests' own sweeps have tens)


def sizes(minimum: int, maximum: int, factor: float, element: int = 1) -> list[int]:
    """Sizes from ``minimum`` to ``maximum`` inclusive, each ``factor`` times the last;
    at least one ``element`` (bytes) each, at most ``MAX_SIZES`` of them.

    >>> sizes(1024, 8192, 2)
    [1024, 2048, 4096, 8192]
    """
    if minimum < element:
        raise ValueError(f"min-bytes {minimum} is less than one element ({element} B)")
    if maximum < minimum:
        raise ValueError(f"max-bytes {maximum} is less than min-bytes {minimum}")
    if not math.isfinite(factor) or factor <= 1:
        raise ValueError(f"factor {factor} must be a finite number > 1")
    count = math.floor(math.log(maximum / minimum) / math.log(factor) + 1e-9) + 1
    if count > MAX_SIZES:
        raise ValueError(f"factor {factor} from {minimum} to {maximum} B gives {count:,} sizes; "
                         f"at most {MAX_SIZES:,} (raise the factor or narrow the range)")
    out, size = [], float(minimum)
    while size <= maximum * (1 + 1e-12):
        out.append(int(round(size)))
        size *= factor
    return out


def parse_ranks(text: str, total: int, minimum: int = 2) -> list[int]:
    """Ranks from ``"0-7,64"``; each must be below ``total``, at least ``minimum``.

    >>> parse_ranks("0-3,8", 16)
    [0, 1, 2, 3, 8]
    """
    ranks: list[int] = []
    for part in text.split(","):
        first, _, last = part.strip().partition("-")
        try:
            lo, hi = int(first), int(last or first)
        except ValueError:
            raise ValueError(f"{part!r} is not a rank or a range like 0-7") from None
        if lo > hi:
            raise ValueError(f"{part!r}: the range starts after it ends")
        if not 0 <= lo <= hi < total:
            raise ValueError(f"{part!r} is outside ranks 0-{total - 1}")
        seen = set(ranks)
        ranks.extend(r for r in range(lo, hi + 1) if r not in seen)
    if len(ranks) < minimum:
        raise ValueError(f"give at least {minimum} ranks")
    return ranks


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    dtype: str
    time_us: float
    algbw: float  # GB/s
    busbw: float  # GB/s
    algorithm: str
    protocol: str
    events: int


def time_alone(fabric: Fabric, tuner: Collectives, kind: Collective, gpus: list[str],
               size: int) -> tuple[float, int, str, str]:
    """(seconds, SimPy events, algorithm, protocol) of one call on an idle fabric."""
    lowered = tuner(kind, gpus, size)
    seconds, events = isolated_run(fabric, lowered)
    return seconds, events, lowered.algorithm.value, lowered.protocol.value


def sweep(fabric: Fabric, tuner: Collectives, kind: Collective, gpus: list[str],
          byte_sizes: list[int], dtype: str, done: Callable[[], object] | None = None
          ) -> list[Row]:
    """One row per size (``done()`` is called after each: a progress bar)."""
    rows = []
    for size in byte_sizes:
        seconds, events, algorithm, protocol = time_alone(fabric, tuner, kind, gpus, size)
        algbw = size / seconds / 1e9
        rows.append(Row(size, size // DTYPES[dtype], dtype, seconds * 1e6, algbw,
                        algbw * bus_factor(kind, len(gpus)), algorithm, protocol, events))
        if done is not None:
            done()
    return rows


def format_table(rows: list[Row], header: list[str]) -> str:
    lines = [f"# {h}" for h in header]
    lines.append(f"#{'size':>12} {'count':>12} {'type':>9} {'time':>10} {'algbw':>8} "
                 f"{'busbw':>8}  {'algorithm':<9} {'protocol':<8}")
    lines.append(f"#{'(B)':>12} {'(elements)':>12} {'':>9} {'(us)':>10} {'(GB/s)':>8} "
                 f"{'(GB/s)':>8}")
    for r in rows:
        lines.append(f" {r.size:>12} {r.count:>12} {r.dtype:>9} {r.time_us:>10.2f} "
                     f"{r.algbw:>8.2f} {r.busbw:>8.2f}  {r.algorithm:<9} {r.protocol:<8}")
    average = sum(r.busbw for r in rows) / len(rows)
    lines.append(f"# Avg bus bandwidth    : {average:.3f}")
    return "\n".join(lines)


def run_sweep(fabric: Fabric, tuner: Collectives, kind: Collective, gpus: list[str],
              byte_sizes: list[int], dtype: str, done: Callable[[], object] | None = None
              ) -> tuple[list[Row], float]:
    """Rows and the wall seconds the sweep took."""
    start = time.perf_counter()
    rows = sweep(fabric, tuner, kind, gpus, byte_sizes, dtype, done)
    return rows, time.perf_counter() - start
