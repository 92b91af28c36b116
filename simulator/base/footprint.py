"""How much memory a run will need, estimated before it starts, so that a
scenario too large for the machine is refused at once with the figure instead
of failing with a MemoryError minutes (or hours) later: the layout when the
scenario is loaded (before its schedule is built), the fabric before its
graph is built, the simulated ranks' ops once the method is chosen.

The estimate counts the two things that grow with a scenario: the fabric graph
(per GPU: its NetworkX nodes and edges, routes and the fabric's indices) and
the simulated ranks' ops (per op: its spans, its end time, its share of the
communication log and of the outputs' tables). The bytes per item are measured,
not modelled: CPython 3.11 on the development machine, DGX A100 fabrics of
2,048 and 8,192 GPUs (4.99 and 5.31 KB per GPU) and data-parallel runs of
1.15 M and 4.6 M ops (544 and 467 B per op at the run's peak); a pipelined
1,536-rank validation case (63 M ops) peaks below 400 B per op. The figures
used are lower bounds (200 B per op), so only a run that certainly cannot fit
in the machine's whole memory is refused.
"""

from __future__ import annotations

import os

from simulator.base.fields import ScenarioError
from simulator.base.ir import Program

GRAPH_BYTES_PER_GPU = 6_000  # measured 4,990-5,310 B (see above)
BYTES_PER_OP = 200  # at least: below every measurement (see above), so only what
# certainly cannot fit is refused
MIN_OPS_PER_LAYER = 8  # ops per layer and micro-batch, at least: measured 11.7 for a
# data-parallel GPT without tensor parallelism (forward, backward, gradient buckets)


def machine_memory() -> int | None:
    """This machine's physical memory in bytes, or None where it cannot be read."""
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def check_fabric(gpus: int, field: str, value: object, memory: int | None = None) -> None:
    """Refuse a fabric whose graph alone would not fit in the machine's memory."""
    need = gpus * GRAPH_BYTES_PER_GPU
    _refuse_over(need, memory, field, value, f"the fabric graph of {gpus:,} GPUs",
                 "simulate fewer GPUs")


def check_layout(layers: int, microbatches: int, memory: int | None = None) -> None:
    """Refuse, before the program is built, a layout whose pipeline alone (one rank
    per stage, ``microbatches`` through ``layers``) could not fit in memory: a
    global batch of 2**40 would otherwise spend hours building its ops."""
    ops = layers * microbatches * MIN_OPS_PER_LAYER
    _refuse_over(ops * BYTES_PER_OP, memory, "training.global_batch", None,
                 f"{microbatches:,} micro-batches x {layers:,} layers (at least {ops:,} ops)",
                 "give a smaller global batch or a larger micro-batch")


def check_run(program: Program, simulated: list[int] | None, memory: int | None = None
              ) -> None:
    """Refuse a run whose simulated ranks' ops would not fit in memory
    (``simulated``: the ranks that run; None: every rank)."""
    ranks = range(program.ranks) if simulated is None else simulated
    ops = sum(len(program.ops[r]) for r in ranks)
    what = (f"{len(ranks):,} simulated ranks x {ops // max(1, len(ranks)):,} ops "
            f"({ops:,} ops)")
    _refuse_over(ops * BYTES_PER_OP, memory, "cluster.nodes", None, what,
                 "simulate fewer GPUs (or, with compute jitter, set simulation.jitter: "
                 "approximate to run one rank per class)")


def check_ops(ops: int, field: str, what: str, advice: str, memory: int | None = None
              ) -> None:
    """Refuse, before they are built, ``ops`` ops that could not fit in memory."""
    _refuse_over(ops * BYTES_PER_OP, memory, field, None, f"{what} (at least {ops:,} ops)",
                 advice)


def _refuse_over(need: int, memory: int | None, field: str, value: object, what: str,
                 advice: str) -> None:
    memory = machine_memory() if memory is None else memory
    if memory is None or need <= memory:
        return
    shown = "" if value is None else f"{value!r}: "
    raise ScenarioError(
        f"{field}: {shown}{what} need about {need / 2**30:,.1f} GiB, more than this "
        f"machine's {memory / 2**30:,.1f} GiB; {advice}")
