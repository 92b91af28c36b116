"""The run summary: throughput, efficiency, time breakdown and memory.

Keys (a contract, see the README): ``iteration_time_s`` (end of the last span),
``tokens_per_s``, ``model_tflops_per_gpu`` (model FLOPs without recompute, per
second per GPU), ``mfu`` (that over the GPU's dense BF16 peak, FP16's at fp16;
under low precision also ``precision``, ``mfu_lowp``, over the precision's dense
peak, and ``lowp_overhead_s``, the critical rank's time in casts),
``gpus``, the breakdown of the rank that finishes last (``compute_s``,
``exposed_comm_s``, ``overlapped_comm_s``, ``comm_wait_s``, ``bubble_s``, and
``idle_s``; see ``simulator.analysis.timeline``), ``compute_s_by_kind`` (its compute
in GEMMs, attention, casts and the rest), ``critical_path`` (seconds of the
chain of spans that sets the iteration time in each category, and the spans,
ranks and stages it passes; see ``simulator.analysis.critical_path``),
``peak_memory_gib`` (max over ranks), ``events`` and ``wall_s``; in a model
with experts the MoE keys, all together (``moe_keys``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from simulator.analysis import critical_path
from simulator.analysis.timeline import (
    PIPELINE_STREAM,
    breakdown,
    grouped_union_length,
    intersect,
    length,
    rank_intervals,
)
from simulator.base.ir import DGRAD, HOST_MEMORY, RDMA_HOP, WGRAD, Program

GIB = 2.0**30


def split_host(static: Mapping[str, float], events: Sequence[tuple[float, float, str]],
               host: bool = False) -> tuple[dict[str, float], list]:
    """The GPU's memory (or, with ``host``, host memory's: categories named
    ``host_...``, ``simulator.base.ir.HOST_MEMORY``) of one rank's static bytes
    and events."""
    return ({k: v for k, v in static.items() if k.startswith(HOST_MEMORY) == host},
            [e for e in events if e[2].startswith(HOST_MEMORY) == host])


def memory_timeline(static: Mapping[str, float], events: Sequence[tuple[float, float, str]]):
    """(times, total bytes after each event) of one rank's GPU memory, starting at
    time 0.

    At equal times frees are applied before allocations.
    """
    static, events = split_host(static, events)
    ordered = sorted(events, key=lambda e: (e[0], e[1]))
    base = sum(static.values())
    times = np.array([0.0] + [t for t, _, _ in ordered])
    totals = base + np.concatenate([[0.0], np.cumsum([d for _, d, _ in ordered])])
    return times, totals


def peak_memory(static: Mapping[str, float], events: Sequence[tuple[float, float, str]],
                host: bool = False):
    """(peak bytes, bytes by category at the peak) of one rank's GPU memory (with
    ``host``: of the host memory it uses)."""
    static, events = split_host(static, events, host)
    ordered = sorted(events, key=lambda e: (e[0], e[1]))
    categories = dict(static)
    current: dict[str, float] = {}
    best, best_at = sum(static.values()), dict(current)
    for _, delta, category in ordered:
        current[category] = current.get(category, 0.0) + delta
        total = sum(static.values()) + sum(current.values())
        if total > best:
            best, best_at = total, dict(current)
    if not host:
        categories.setdefault("activations", 0.0)
    for category, value in best_at.items():
        categories[category] = categories.get(category, 0.0) + max(0.0, value)
    return best, categories


def rank_breakdown(spans: pd.DataFrame, rank: int, iteration_time: float) -> dict[str, float]:
    """The time categories of ``rank``. A pipeline receive waiting for its
    neighbour stage is the pipeline bubble, so waits on the ``pp`` stream are left
    out of communication waiting and count as bubble."""
    rows = spans[spans["rank"] == rank]
    kind = rows["kind"].to_numpy().copy()
    kind[(kind == "wait") & (rows["stream"].to_numpy() == PIPELINE_STREAM)] = "pipeline_wait"
    start, end = rows["start"].to_numpy(), rows["end"].to_numpy()
    return breakdown(rank_intervals(kind, start, end, "compute"),
                     rank_intervals(kind, start, end, "comm"),
                     rank_intervals(kind, start, end, "wait"), iteration_time)


def summarize(spans: pd.DataFrame, program: Program, memory_events, peak_flops: float,
              gpu_memory: float, simulated: Sequence[int] | None = None,
              path: pd.DataFrame | None = None,
              host_memory: float = float("inf"),
              lowp: tuple[str, float] | None = None) -> dict[str, object]:
    """Summary of one simulated iteration (without ``events``/``wall_s``, added by run).

    ``simulated``: the ranks that ran (all, or the representatives when folded);
    ``path``: the critical path of ``spans``, when the caller has it already;
    ``lowp``: (low precision, its dense peak) of a low-precision run.
    """
    iteration = float(spans["end"].max())
    rank_end = spans.groupby("rank")["end"].max()
    critical = int(rank_end.idxmax())
    gpus = program.ranks
    ranks = list(range(gpus)) if simulated is None else list(simulated)
    peaks_of = {r: peak_memory(program.static_memory[r], memory_events[r]) for r in ranks}
    peak_rank = max(ranks, key=lambda r: (peaks_of[r][0], -r))
    peak_bytes, categories = peaks_of[peak_rank]
    peaks = [peaks_of[r] for r in ranks]
    all_stages = program.stage or (0,) * gpus
    stages = [all_stages[r] for r in ranks]
    model_flops_per_gpu = program.model_flops / iteration / gpus
    summary: dict[str, object] = {
        "iteration_time_s": iteration,
        "tokens_per_s": program.tokens / iteration,
        "model_tflops_per_gpu": model_flops_per_gpu / 1e12,
        "mfu": model_flops_per_gpu / peak_flops,
        "gpus": gpus,
        "critical_rank": critical,
    }
    by_kind = compute_by_kind(spans, critical)
    if lowp is not None:  # (the casts: where the format's speed-up is lost)
        precision, lowp_peak = lowp
        summary.update(precision=precision, mfu_lowp=model_flops_per_gpu / lowp_peak,
                       lowp_overhead_s=by_kind["casts"])
    summary.update(rank_breakdown(spans, critical, iteration))
    summary["compute_s_by_kind"] = by_kind
    stage_of = dict(enumerate(program.stage)) if program.stage else None
    if path is None:
        path = critical_path.critical_path(spans)
    summary["critical_path"] = critical_path.shares(path, stage_of)
    summary.update({
        "peak_memory_gib": peak_bytes / GIB,
        "peak_memory_rank": peak_rank,
        "memory_gib": {k: v / GIB for k, v in categories.items()},
        "peak_memory_gib_by_stage": _by_stage(stages, [p for p, _ in peaks]),
        "compute_s_by_stage": _compute_by_stage(spans, all_stages),
        "activation_gib_by_stage": _by_stage(stages, [c["activations"] for _, c in peaks]),
        "gpu_memory_gib": gpu_memory / GIB,
        "oom": peak_bytes > gpu_memory,
        "oom_rank": peak_rank if peak_bytes > gpu_memory else None,
        "oom_excess_gib": max(0.0, peak_bytes - gpu_memory) / GIB,
    })
    summary.update(host_keys(program, memory_events, ranks, host_memory, summary["oom"]))
    return summary


QUANTIZE_SUFFIX = "_quantize"  # a low-precision cast's span (workloads.kernels.quantize_kernel)
WEIGHT_GEMMS = ("qkv", "q_down", "q_up", "q_proj", "kv_down", "kv_up", "proj", "fc1", "fc2",
                "shared_fc1", "shared_fc2", "router", "logits", "experts_fc1", "experts_fc2")
# (a weight GEMM's backward may run in halves: delayed or zero-bubble weight gradients)
GEMM_NAMES = frozenset((*WEIGHT_GEMMS, "attn_scores", "attn_values",
                        *(name + half for name in WEIGHT_GEMMS for half in (DGRAD, WGRAD))))
ATTENTION_NAMES = frozenset(("attention",))


def compute_by_kind(spans: pd.DataFrame, rank: int) -> dict[str, float]:
    """Seconds ``rank`` computes in GEMMs (any precision), fused attention, casts
    (low precision's quantization) and everything else (norms, activations,
    the loss, the optimizer): where the time goes, and where a faster format
    stops helping."""
    rows = spans[(spans["rank"] == rank) & (spans["kind"] == "compute")]
    names = rows["name"].astype(str)
    seconds = (rows["end"] - rows["start"]).to_numpy()
    gemm = names.isin(GEMM_NAMES).to_numpy()
    attention = names.isin(ATTENTION_NAMES).to_numpy()
    casts = names.str.endswith(QUANTIZE_SUFFIX).to_numpy()
    return {"gemm": float(seconds[gemm].sum()), "attention": float(seconds[attention].sum()),
            "casts": float(seconds[casts].sum()),
            "other": float(seconds[~(gemm | attention | casts)].sum())}


def host_keys(program: Program, memory_events, ranks: Sequence[int], capacity: float,
              gpu_oom: bool) -> dict[str, object]:
    """Host memory's keys where some rank offloads: its peak over ranks (per GPU,
    as ``cluster.host_memory`` counts it), by category, and an OOM of host memory
    (``oom_memory``: which memory ran out; the GPU's first)."""
    peaks = {r: peak_memory(program.static_memory[r], memory_events[r], host=True)
             for r in ranks}
    rank = max(ranks, key=lambda r: (peaks[r][0], -r))
    peak, categories = peaks[rank]
    if peak <= 0:
        return {}
    out: dict[str, object] = {"host_peak_memory_gib": peak / GIB,
                              "host_memory_gib": {k: v / GIB for k, v in categories.items()},
                              "host_memory_capacity_gib": capacity / GIB}
    if gpu_oom:
        out["oom_memory"] = "gpu"
    elif peak > capacity:
        out.update(oom=True, oom_rank=rank, oom_excess_gib=(peak - capacity) / GIB,
                   oom_memory="host")
    return out


def _compute_by_stage(spans: pd.DataFrame, stage_of: Sequence[int]) -> list[float]:
    """The busiest rank's compute time in each pipeline stage (the slowest stage
    sets a pipeline's pace)."""
    compute = spans[spans["kind"] == "compute"]
    ranks = np.sort(compute["rank"].unique())
    busy = grouped_union_length(np.searchsorted(ranks, compute["rank"].to_numpy()),
                                compute["start"].to_numpy(float),
                                compute["end"].to_numpy(float), len(ranks))
    out: dict[int, float] = {}
    for rank, seconds in zip(ranks.tolist(), busy.tolist(), strict=True):
        out[stage_of[rank]] = max(out.get(stage_of[rank], 0.0), seconds)
    return [out[s] for s in sorted(out)]


def _by_stage(stages: Sequence[int], values: Sequence[float]) -> list[float]:
    """Max over the ranks of each pipeline stage, in GiB."""
    out: dict[int, float] = {}
    for stage, value in zip(stages, values, strict=True):
        out[stage] = max(out.get(stage, 0.0), value)
    return [out[s] / GIB for s in sorted(out)]


MOVES = ("dispatch", "combine")  # a MoE layer's token moves, DeepEP's RDMA hop's too
EXCHANGES = (*MOVES, "etp_gather", "etp_scatter", *(move + RDMA_HOP for move in MOVES))
MOE_KEYS = ("moe_routing", "moe_rank_imbalance", "moe_expert_imbalance", "moe_dropped_fraction",
            "moe_a2a_s", "moe_a2a_hidden_s", "moe_imbalance_s")


def moe_keys(notes: Mapping, spans: pd.DataFrame, rank: int) -> dict[str, object]:
    """The summary's MoE keys of a program's ``notes`` (none for a dense model), all
    of them or none: what routing came to (``workloads.routing``) and what
    imbalance cost ``rank`` (``imbalance_cost``, on its spans in ``spans``)."""
    moe = notes.get("_moe")
    if moe is None:
        return {}
    out = {k: moe[k] for k in MOE_KEYS[:-3]}
    out["moe_a2a_s"], out["moe_a2a_hidden_s"] = exchanges_hidden(spans, rank)
    out["moe_imbalance_s"] = imbalance_cost(spans, rank, *moe["load_factors"])
    return out


def exchanges_hidden(spans: pd.DataFrame, rank: int) -> tuple[float, float]:
    """(seconds ``rank``'s token exchanges take, the part of them under its own
    compute): the time the dispatches and combines are in flight, as a union, and
    its intersection with the compute spans' union (what an all-to-all overlap,
    ``parallelism.moe_overlap``, hides)."""
    rows = spans[spans["rank"] == rank]
    kind = rows["kind"].to_numpy()
    moves = rows["name"].astype(str).isin(EXCHANGES).to_numpy() & (kind == "comm")
    start, end = rows["start"].to_numpy(dtype=float), rows["end"].to_numpy(dtype=float)
    exchanges = start[moves], end[moves]
    return length(exchanges), length(intersect(exchanges, rank_intervals(kind, start, end,
                                                                         "compute")))


def imbalance_cost(spans: pd.DataFrame, rank: int, scale: Mapping[int, np.ndarray],
                   exchange: Mapping[int, np.ndarray]) -> float:
    """Seconds ``rank``'s routed-expert kernels and token exchanges take beyond
    what they would at the mean rank's load: each runs at the busiest EP rank's
    load (``scale``, per MoE layer and micro-batch, over the balanced share) and
    each exchange is sized by the busiest receipt (``exchange``), so a span of d
    seconds at factor f costs d (1 - 1/f), taking a kernel's time as proportional
    to its tokens (an estimate: small kernels are not)."""
    rows = spans[spans["rank"] == rank]
    names = rows["name"].astype(str)
    total = 0.0
    for factors, chosen in ((scale, names.str.startswith("experts_")),
                            (exchange, names.isin(EXCHANGES) & (rows["kind"] == "comm"))):
        part = rows[chosen.to_numpy()]
        if part.empty:
            continue
        layers = sorted(factors)
        table = np.array([factors[layer] for layer in layers], dtype=float)  # layer x mb
        f = table[np.searchsorted(layers, part["layer"].to_numpy()),
                  part["microbatch"].to_numpy()]
        total += float(((part["end"] - part["start"]).to_numpy() * (1 - 1 / f)).sum())
    return total
