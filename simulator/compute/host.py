"""Host-bound kernels: the GPU cannot run kernels faster than the host issues them.

PyTorch issues every kernel from the host (dispatch, then ``cudaLaunchKernel``):
``training.kernel_launch`` seconds each, plus the framework's Python module
code, none for kernels a CUDA graph replays (``compute.host_costs``: how many
seconds each kernel costs the host, per framework and graph scope). The host runs
ahead of the GPU while kernels are longer than that and falls behind while they
are shorter, so a run of short kernels (a small micro-batch, a high tensor
parallel degree, element-wise ops) leaves the GPU idle between them.

Within one pipeline step (``Program.steps``: one forward or backward of one
micro-batch through one chunk) the host and the GPU race from a common start:
kernel i is issued at ``r_i = r_{i-1} + h_i`` (``h_i``: its host seconds) and ends at
``g_i = max(g_{i-1}, r_i) + d_i``; its effective duration is ``g_i - g_{i-1}``.
The race
ignores the lead
the host gains while the GPU waits for communication, and starts each step
without lead, so it charges at most a few launches per step too many; steps
of one kind get the same durations, so they share one of the engine's replay
templates (``engine.passes``). A kernel's wait for its launch, ``max(0, r_i -
g_{i-1})``, is the leading part of its effective duration (``race_waits``,
``host_bound_waits``: carried per step kind as the durations are); the
outputs show it (``runner.host_waits``: spans' ``host_wait_s``).
Kernels outside steps (the optimizer's fused multi-tensor step) keep theirs,
but for the optimizer's first, which waits one launch for each of the host's
synchronisations before it (Megatron-Core's gradient norm, ``host_costs``).

A host synchronisation drops the host's lead: before issuing the kernel after
it the host waits for the GPU, ``r_{i-1} := max(r_{i-1}, g_{i-1})``, so that
kernel and the short ones after it wait for their launches until the host
gets ahead again. Megatron-Core's MoE dispatchers synchronise once in each
MoE layer's forward, before the experts (``host_syncs``): the alltoall one
waits for the token counts' copy to the host
(``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`` at its
``cuda_sync_point``, ``before_ep_alltoall`` with ep > 1, ``before_finish``
without), which the all-to-all's split sizes and the grouped GEMM's
``m_splits`` need; the allgather one copies its tokens per expert
(``.cpu()`` in ``dispatch_postprocess``); DeepEP's dispatch (flex) spins on the
host for its received counts. The backward's exchanges reuse the forward's
counts: no synchronisation. Where a CUDA graph replays the experts (drop-and-pad
MoE) there is no copy to wait for.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from simulator.base.ir import HOST_KERNELS, ROUTED_EXPERT, Op, OpKind, Phase
from simulator.compute.host_costs import HostPlan


def race(durations: np.ndarray, launches: np.ndarray, per_launch: float,
         syncs: np.ndarray | None = None) -> np.ndarray:
    """Effective durations of kernels run in order as the host issues them; before
    a kernel whose ``syncs`` is true the host first waits for the GPU.

    >>> race(np.array([1.0, 1.0, 10.0, 1.0]), np.array([1, 1, 1, 1]), 2.0).tolist()
    [3.0, 2.0, 11.0, 1.0]
    >>> race(np.array([1.0, 1.0, 10.0, 1.0]), np.array([1, 1, 1, 1]), 2.0,
    ...      np.array([False, False, False, True])).tolist()
    [3.0, 2.0, 11.0, 3.0]
    """
    return race_waits(durations, launches, per_launch, syncs)[0]


def race_waits(durations: np.ndarray, launches: np.ndarray, per_launch: float,
               syncs: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``race``'s effective durations and each kernel's wait for its launch, the
    leading part of its effective duration (``max(0, r_i - g_{i-1})``: exactly 0
    where the host was ahead).

    >>> race_waits(np.array([1.0, 1.0, 10.0, 1.0]), np.array([1, 1, 1, 1]), 2.0)[1].tolist()
    [2.0, 1.0, 1.0, 0.0]
    """
    waits = np.zeros(len(durations), bool) if syncs is None else syncs
    issued, end = 0.0, 0.0
    out, late = np.empty_like(durations), np.zeros_like(durations)
    for i, (d, n, wait) in enumerate(zip(durations.tolist(), (launches * per_launch).tolist(),
                                         waits.tolist(), strict=True)):
        issued = (max(issued, end) if wait else issued) + n
        start = max(end, issued)
        out[i] = start + d - end
        late[i] = start - end
        end = start + d
    return out, late


def host_syncs(ops: Sequence[Op], compute: Sequence[int]) -> np.ndarray:
    """Which of the kernels ``compute`` (indices into ``ops``, in order) the host
    waits for the GPU before issuing: a MoE layer's first routed-expert kernel of a
    forward (its dispatcher's copy of the token counts to the host)."""
    out = np.zeros(len(compute), bool)
    for n, i in enumerate(compute):
        op = ops[i]
        out[n] = op.phase is Phase.FORWARD and op.name.startswith(ROUTED_EXPERT) and not (
            n and ops[compute[n - 1]].name.startswith(ROUTED_EXPERT)
            and ops[compute[n - 1]].layer == op.layer)
    return out


def host_bound(ops: Sequence[Op], steps: Sequence[tuple], durations: np.ndarray,
               host: HostPlan | float) -> np.ndarray:
    """``durations`` with each step's compute kernels stretched where the host
    falls behind (the same for every step of one kind), and the optimizer's
    first kernel after the host's synchronisations (``host``: the job's
    ``HostPlan``, or seconds per launch for an eager PyTorch host)."""
    return host_bound_waits(ops, steps, durations, host)[0]


def host_bound_waits(ops: Sequence[Op], steps: Sequence[tuple], durations: np.ndarray,
                     host: HostPlan | float) -> tuple[np.ndarray, np.ndarray | None]:
    """``host_bound``'s durations and each op's wait for its launch (the leading
    part of its stretched duration; None where nothing waits), carried like the
    durations: the same for every step of one kind."""
    plan = host if isinstance(host, HostPlan) else HostPlan(float(host))
    if plan.idle or not steps:
        return durations, None
    out, late = durations.copy(), np.zeros(len(durations))
    done: dict[object, tuple[np.ndarray, np.ndarray]] = {}
    for first, end, key in steps:
        compute = [i for i in range(first, end) if ops[i].kind is OpKind.COMPUTE
                   and ops[i].kernel not in HOST_KERNELS]  # (copies: their own stream)
        if not compute:
            continue
        stretched = done.get(key)
        if stretched is None or len(stretched[0]) != len(compute):
            seconds, inside = plan.host_seconds(ops, compute)
            syncs = host_syncs(ops, compute) & ~inside
            stretched = done[key] = race_waits(durations[compute], seconds, 1.0, syncs)
        out[compute], late[compute] = stretched
    _after_syncs(ops, out, late, plan)
    return out, late


def _after_syncs(ops: Sequence[Op], durations: np.ndarray, late: np.ndarray,
                 plan: HostPlan) -> None:
    """The optimizer's first GPU kernel waits one launch per host synchronisation
    before it (``HostPlan.optimizer_syncs``: the host's lead is gone)."""
    if not plan.optimizer_syncs:
        return
    first = next((i for i, op in enumerate(ops) if op.phase is Phase.OPTIMIZER
                  and op.kind is OpKind.COMPUTE and op.kernel not in HOST_KERNELS), None)
    if first is not None:
        effective, wait = race_waits(durations[first:first + 1],
                                     np.array([plan.optimizer_syncs]), plan.kernel_launch)
        durations[first], late[first] = effective[0], wait[0]
