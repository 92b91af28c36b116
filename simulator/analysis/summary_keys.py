"""Every key of a run's summary (``summary.json``) and what it means: the
generated reference's summary page reads them (``cli.reference``), and
``tests/test_reference.py`` fails on a summary key without one.

Each row names one key or several that come together (as written in the
page, in backticks) and says what they hold.
"""

from __future__ import annotations

import re

ROWS: tuple[tuple[str, str], ...] = (
    ('`iteration_time_s`',
     'end of the last span of the iteration'),
    ('`tokens_per_s`',
     'global batch × sequence length / iteration time'),
    ('`model_tflops_per_gpu`',
     'model FLOPs (72·B·L·s·h²·(1 + s/6h + V/12hL) for GPT, no recompute; in a MoE model '
     "the experts' FLOPs of the token copies kept, not of those dropped at capacity) / "
     'iteration time / GPUs, in TFLOP/s'),
    ('`mfu`',
     "`model_tflops_per_gpu` / the GPU's dense BF16 peak (FP16's at fp16), whatever the "
     "precision. Model FLOPs count attention's full s² score matrix while causal kernels "
     'compute about half of it, so where attention dominates (contexts of millions of '
     'tokens) MFU approaches or passes 100 %'),
    ('`precision`, `mfu_lowp`, `lowp_overhead_s`',
     'low precision only: the format; `model_tflops_per_gpu` / its dense peak (sources '
     "quote FP8 MFU either way: NVIDIA's and Megatron-Bridge's tables against BF16's peak, "
     "some papers against FP8's); the seconds the critical rank spends in casts "
     "(quantizing operands and gradients), where the format's speed-up is lost. With "
     "`jobs:`, in each low-precision job's entry, and at the top level only where every "
     "training job has the same precision"),
    ('`compute_s_by_kind`',
     "the critical rank's compute split into `gemm` (any precision), `attention`, `casts` "
     'and `other` (norms, activations, loss, optimizer)'),
    ('`gpus`',
     'GPUs simulated'),
    ('`critical_rank`',
     'the rank that finishes last; the five figures below are its own'),
    ('`compute_s`',
     'time its compute stream is busy'),
    ('`overlapped_comm_s`',
     'communication time hidden under compute'),
    ('`exposed_comm_s`',
     'communication time not hidden under compute'),
    ('`comm_wait_s`',
     'time it waits in a collective for peers and does nothing else'),
    ('`bubble_s`',
     'idle time before its last compute op, including waiting for a pipeline neighbour '
     '(the pipeline bubble)'),
    ('`idle_s`',
     'the rest: compute + exposed + waiting + bubble + idle = iteration time'),
    ('`comm_busy_s`, `comm_wait_total_s`',
     'all communication time, and all waiting time, overlapped or not'),
    ('`critical_path`',
     'the chain of spans that sets the iteration time (walked back from the last span; at '
     'a wait it moves to the rank that arrived last or sent the message): seconds of it in '
     '`compute_s`, `communication_s`, `waiting_s`, `bubble_s`, `idle_s` (these add up to '
     '`length_s` = the iteration time), and the `spans`, `ranks` and pipeline `stages` it '
     'passes through'),
    ('`peak_memory_gib`',
     'max over ranks of parameters + gradients + optimizer states + activations, gathered '
     'parameters and buffers at their peak'),
    ('`memory_gib`, `peak_memory_rank`',
     'that peak by category, and the rank that has it'),
    ('`peak_memory_gib_by_stage`, `activation_gib_by_stage`',
     'the peak, and the activations at it, of each pipeline stage'),
    ('`compute_s_by_stage`',
     "the busiest rank's compute time in each pipeline stage (the slowest stage sets the "
     "pipeline's pace)"),
    ('`gpu_memory_gib`, `oom`, `oom_rank`, `oom_excess_gib`',
     "the GPU's memory; whether the peak exceeds it, on which rank and by how much (the "
     'run still completes)'),
    ('`host_peak_memory_gib`, `host_memory_gib`, `host_memory_capacity_gib`, `oom_memory`',
     'with offloading only (`training.activation_offload_layers`, `optimizer_offload`): '
     'the host memory a GPU uses at its peak (max over ranks), by category '
     '(`host_activations`, `host_optimizer_states`), the host memory per GPU '
     '(`cluster.host_memory`), and which memory ran out when `oom` (`gpu` first, else '
     "`host`: then `oom_rank` and `oom_excess_gib` are the host's)"),
    ('`nvlink_domains`, `groups_across_domains`',
     'where an NVLink domain spans servers (`cluster.nvlink_domain`, the NVL72 presets) or '
     'some tensor-, context- or expert-parallel group leaves its domain: a line for the '
     "run's output, and `{dimension: [groups that span several domains, groups]}` (their "
     'calls take the scale-out network)'),
    ('`micro_batches`, `parameters`, `buckets`',
     'micro-batches per pipeline, trainable parameters, gradient buckets (of the first '
     'stage)'),
    ('`hardware_flops`',
     'FLOPs the GPUs execute per iteration, recompute included'),
    ('`moe_routing`, `moe_rank_imbalance`, `moe_expert_imbalance`, `moe_dropped_fraction`, '
     '`moe_a2a_s`, `moe_a2a_hidden_s`, `moe_imbalance_s`',
     'models with experts only: the routing distribution; the mean over MoE layers and '
     "micro-batches of the busiest expert-parallel rank's token copies over the mean "
     "rank's, and of the busiest expert's over the mean expert's; the share of copies "
     "dropped at capacity; the seconds the last rank's token exchanges (dispatches and "
     'combines) are in flight, and the part of them under its own compute (what '
     "`moe_overlap: 1f1b` hides; about 0 without it); the seconds the last rank's expert "
     "kernels and token all-to-alls take beyond the mean rank's kept load (a span of d "
     "seconds at load factor f, the busiest rank's copies over the mean rank's kept ones, "
     'costs d (1 − 1/f); never negative), within 1 % of what a Zipf-skewed Mixtral run '
     'loses against balanced routing. The seven come together or not at all; with several '
     "training jobs, in each job's entry"),
    ('`stragglers`, `straggler_count`, `slowest_gpu_factor`; `throttled`, `throttled_count`; '
     '`faults`',
     'with `cluster.slow`, `gpu_speed_spread`, `throttle` or `fabric.faults` only: the '
     'slowest GPUs (rank, factor), how many are slower than the table and the largest '
     'factor; the throttled ranks and their schedules ([time, factor] from then on); the '
     'faults, each with its part, state and start'),
    ('`jobs`',
     'with `jobs:` only, one entry per job: `name`, `kind`, `nodes`, `gpus`, `first_rank` '
     "(its ranks in the run are consecutive from there); a training job's "
     '`iteration_time_s`, `alone_s` (the same job alone on the same nodes), `slowdown` '
     '(their ratio), `tokens_per_s`, `mfu`, `critical_rank`, `peak_memory_gib`, `oom`, '
     '`critical_path` (as below, over its own ranks), its `precision`, `mfu_lowp` and '
     '`lowp_overhead_s` at low precision, and its notes (`micro_batches`, ...); '
     "background traffic's `offered_gb_s`, `delivered_gb_s` (bytes delivered per stream "
     'over the time it ran), `messages`, `message_time_s` and `until_s`. The top-level '
     "keys are then those of the training jobs' GPUs together: the iteration time is the "
     "slowest job's, throughput and MFU count every training job's tokens and FLOPs over "
     "it; the notes (`micro_batches`, ..., the MoE keys) are the only training job's "
     "beside background traffic, and with several training jobs in each job's entry only"),
    ('`blame`',
     'what set the iteration time beyond the ideal, largest first (up to 8): `kind` '
     '(`straggler`, `link` or `job`), `cause` (a rank, a link `a -> b`, another job, or '
     '`other calls` past the 16 kinds of call analysed), `seconds` on the critical path '
     "beyond the ideal, `detail` (a link's fault state and its worst load while the path's "
     'calls crossed it); empty when every span on the path took within 1 % of its ideal'),
    ('`host_stall_s`',
     "compute-stream time the critical rank's kernels wait for the host to launch them "
     '(`training.kernel_launch`, module overheads, graph launches, host syncs; in `compute_s`)'),
    ('`overlap_slowdown`, `overlap_slowdown_s`',
     'how compute slowed by overlapped NCCL kernels was solved ("x1.189 while NCCL runs; 3 '
     'passes, exact (a fixed point)" or "settled: the last pass moved the iteration time '
     'by 0.13%"), and the compute time it adds on the critical rank (in `compute_s`)'),
    ('`compute_model`',
     'what timed the kernels: "roofline", or "roofline corrected by the kernel table FILE '
     '(rows, launch floor taken off)"; then the GEMMs\' model ("GEMMs by tile model (SMs, '
     'tiles, efficiency inside a tile)" or the size curve) and attention\'s ("KERNEL '
     'attention by shape from GPU\'s rows (sources)", noting when the run\'s sequences left '
     'the published grid, or "attention at a constant efficiency"); under low precision '
     "also the format's peak, its efficiency relative to BF16's and the casts' share of "
     'the streaming bandwidth; then the host\'s mechanisms ("host: L us a kernel launch", '
     'the framework\'s module overheads, the CUDA graph scope, the host syncs: '
     '`compute.host_costs`) and, where kernels waited for their launches, "host-bound: N % '
     'of the critical rank\'s kernel time"'),
    ('`token_exchange`',
     "how the critical rank's MoE token exchanges are timed: the flex dispatcher's "
     'DeepEP or HybridEP dispatch and combine at their published achieved bandwidths '
     "(shares of the hop's line rate, with their sources and SM budgets), NCCL's all-to-all "
     "as n-1 point-to-point transfers under NCCL's p2p protocol rule; only in a run with either"),
    ('`simulated_ranks`',
     'ranks simulated (fewer than `gpus` when symmetry lets one process stand for several)'),
    ('`simulation`, `simulation_exact`',
     'what was simulated and why, e.g. "2 of 16 ranks simulated, exact by symmetry (one '
     'process per class of ranks with one program, verified in lockstep as it ran)" or '
     '"all 16 ranks: compute jitter breaks symmetry (...)", or "1 of 64 ranks simulated, '
     'not exact: compute jitter approximated (...)"; whether the result equals a full '
     "simulation's"),
    ('`events`',
     'SimPy events processed'),
    ('`network_recomputes`',
     'times the max-min fair bandwidth shares were recomputed'),
    ('`calls_alone`, `steps_replayed`, `pipeline_steps`',
     'what the exact speed-ups did on the simulated ranks: calls settled at their isolated '
     'time because no other traffic can share their links (tensor-parallel calls, and '
     'context-parallel ones inside a server, except those a data-parallel reduction may '
     "overlap), pipeline steps replayed from their kind's template, and the pipeline steps "
     'there are'),
    ('`wall_s`, `job_runs`',
     'wall-clock seconds to build, simulate and summarise (not the exports); with several '
     'jobs, of every run (`job_runs`: each training job alone, then all together)'),
)


def described() -> set[str]:
    """Every summary key a row names.

    >>> {"iteration_time_s", "mfu"} <= described()
    True
    """
    return {key for keys, _ in ROWS for key in re.findall(r"`([a-z_0-9]+)`", keys)}
