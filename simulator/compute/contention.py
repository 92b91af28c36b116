"""Compute slowed by NCCL kernels running beside it on the same GPU.

An NCCL kernel holds some of the GPU's SMs (one thread block per channel) and
streams through its HBM for as long as it runs, waiting for its peers
included; a kernel of another stream that runs meanwhile gets the rest.
Lee et al., "Characterizing Compute-Communication Overlap in GPU-Accelerated
Distributed Deep Learning" (arXiv 2507.03114, 2025), measured transformer
compute overlapped with collectives on four A100s and H100s at 18.9 % slower
on average (40 % at most) than alone. A GPU's ``overlap_slowdown`` is that
factor: while at least one NCCL kernel runs on a GPU, its compute progresses
at ``1 / overlap_slowdown`` of its speed (several NCCL kernels at once count
as one: their channels share the SMs NCCL is given). Transformer Engine's
userbuffers exchanges run on copy engines and do not count.

The slow-down depends on where compute and communication fall, and moves
them: the runner solves it as a fixed point (``simulator.runner.contention``):
run, stretch each compute op by the NCCL time it overlapped (``stretched``, over
that time joined by ``analysis.timeline.merge``), run again with those
durations, until no duration changes.
"""

from __future__ import annotations

import numpy as np

from simulator.base.ir import COPY_ENGINE_EXCHANGE

COMM_KINDS = ("comm", "wait")  # spans during which an NCCL kernel occupies the GPU
NOT_NCCL = (COPY_ENGINE_EXCHANGE,)  # communication spans that take no SMs


def stretched(starts: np.ndarray, work: np.ndarray, begins: np.ndarray, ends: np.ndarray,
              factor: float) -> np.ndarray:
    """Durations of ops that start at ``starts`` and need ``work`` seconds alone,
    on a GPU where NCCL runs in the disjoint sorted intervals [begins, ends) and
    slows compute by ``factor`` meanwhile. An op that overlaps no interval keeps
    its ``work`` exactly.

    Progress W(t) = t - (1 - 1/factor) * (NCCL time before t) is piecewise
    linear and increasing; an op ends where W has grown by its work.
    """
    starts, work = np.asarray(starts, dtype=float), np.asarray(work, dtype=float)
    out = work.copy()
    if factor == 1.0 or not len(begins) or not len(starts):
        return out
    edges = np.column_stack((begins, ends)).ravel()
    covered = np.concatenate(([0.0], np.cumsum(ends - begins)))
    covered_at = np.column_stack((covered[:-1], covered[1:])).ravel()  # at each edge
    low = min(edges[0], starts.min()) - 1.0
    high = max(edges[-1], starts.max()) + float(work.sum()) * factor + 1.0
    times = np.concatenate(([low], edges, [high]))
    progress = times - (1.0 - 1.0 / factor) * np.concatenate(([0.0], covered_at,
                                                              [covered[-1]]))
    ends_alone = starts + work
    # an op overlaps an interval when the first interval ending after its start begins
    # before its end (alone; overlapping only makes it longer)
    first = np.searchsorted(ends, starts, side="right")
    hit = (first < len(begins)) & (work > 0)
    hit[hit] = begins[first[hit]] < ends_alone[hit]
    if hit.any():
        done = np.interp(starts[hit], times, progress) + work[hit]
        out[hit] = np.interp(done, progress, times) - starts[hit]
    return out
