"""Expert parallelism (Megatron-Core's MoE, Shazeer et al. 2017; Lepikhin et al.
2021, GShard): its groups, its layout checks, and the token all-to-alls of a
MoE layer.

A MoE layer's experts are split over ``ep`` ranks. Megatron-Core carves the
expert layout out of a stage's tp x cp x dp ranks, in the same rank order with
``etp`` (expert tensor parallelism) in tensor parallelism's place: a rank's
index among its stage's ranks, ``i = tp_i + tp (cp_i + cp dp_i)`` (the
default order), gives its expert-parallel rank ``(i // etp) % ep`` and its
expert-data-parallel rank ``i // (etp ep)``. The ``ep`` group holds the ranks
that exchange tokens; the ``edp`` group (tp x cp x dp / (etp x ep) ranks) the
replicas of one set of experts, over which their gradients are reduced (the
dense parameters still over ``dp``).

In a MoE layer each rank routes its own tokens (sequence-parallel: 1/tp of
them, as Megatron-Core requires sequence parallelism with tensor
parallelism), sends each token's ``top_k`` copies to the ranks holding their
experts (all-to-all *dispatch*), runs its local experts, and sends the results
back (all-to-all *combine*); the backward mirrors both. The all-to-alls run on
the ``ep`` stream and block the kernels after them; a balanced all-to-all
moves ``tokens x top_k x hidden`` elements per rank (``workloads.routing`` sizes
it by the loads drawn). With ``moe_token_dispatcher_type: allgather`` the
dispatch is an all-gather of the EP group's tokens and the combine a
reduce-scatter of the outputs (``exchange``).
"""

from __future__ import annotations

import numpy as np

from simulator.base.ir import Collective
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError
from workloads.training import ParallelSpec, TrainingSpec

DISPATCH, COMBINE = "dispatch", "combine"  # markers in a MoE layer's kernel sequence
GATHER, SCATTER = "etp_gather", "etp_scatter"  # expert tensor parallelism's (etp > 1)
KIND = Collective.ALL_TO_ALL  # the dispatcher's exchange (alltoall)


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Experts split evenly over the expert-parallel ranks, which a stage's ranks hold."""
    ep, etp = parallel.ep, parallel.etp
    if model.experts == 0:
        if ep > 1 or etp > 1:
            raise LayoutError(f"parallelism.ep ({ep}) and etp ({etp}) need a model with "
                              "experts (model.experts > 0)")
        return
    if model.top_k > model.experts:
        raise LayoutError(f"model.top_k ({model.top_k}) must be at most model.experts "
                          f"({model.experts})")
    if model.experts % ep:
        raise LayoutError(f"model.experts ({model.experts}) must be divisible by "
                          f"parallelism.ep ({ep})")
    if model.expert_ffn % etp:
        raise LayoutError(f"model.expert_ffn_hidden ({model.expert_ffn}) must be divisible by "
                          f"parallelism.etp ({etp})")
    ranks = parallel.tp * parallel.cp * parallel.dp
    if ranks % (etp * ep):
        raise LayoutError(f"parallelism.ep ({ep}) x etp ({etp}) must divide a stage's "
                          f"tp x cp x dp = {ranks} ranks")
    if parallel.tp > 1 and not parallel.sequence_parallel:
        raise LayoutError("parallelism.sequence_parallel must be true with tp > 1 in a model "
                          "with experts (Megatron-Core requires it for MoE layers)")
    if parallel.framework.value == "deepspeed":
        raise LayoutError("parallelism.framework: 'deepspeed' with experts is not modelled "
                          "yet; allowed: megatron, pytorch, torchtitan")


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The ``ep`` and ``edp`` groups of a model with experts (none without)."""
    if ctx.model.experts == 0:
        return {}
    parallel = ctx.parallel
    etp, ep = parallel.etp, parallel.ep
    inner = [d for d in layout.order if d != "pp"]
    ep_groups: dict[tuple, list[int]] = {}
    edp_groups: dict[tuple, list[int]] = {}
    etp_groups: dict[tuple, list[int]] = {}
    for rank in range(layout.world):
        coords = layout.coords(rank)
        index = 0
        for d in reversed(inner):
            index = index * layout.sizes[d] + coords[d]
        e_tp, e_p, e_dp = index % etp, (index // etp) % ep, index // (etp * ep)
        ep_groups.setdefault((coords["pp"], e_tp, e_dp), []).append(rank)
        edp_groups.setdefault((coords["pp"], e_tp, e_p), []).append(rank)
        if etp > 1:
            etp_groups.setdefault((coords["pp"], e_p, e_dp), []).append(rank)
    out = {"ep": tuple(sorted(tuple(sorted(g)) for g in ep_groups.values())),
           "edp": tuple(sorted(tuple(sorted(g)) for g in edp_groups.values()))}
    if etp > 1:
        out["etp"] = tuple(sorted(tuple(sorted(g)) for g in etp_groups.values()))
    return out


def expert_data_parallel(parallel: ParallelSpec) -> int:
    """Replicas of one rank's experts: the ``edp`` group's size."""
    return parallel.tp * parallel.cp * parallel.dp // (parallel.etp * parallel.ep)


def sequence(kernels: list, etp: int = 1) -> list:
    """A MoE layer's sequence with the all-to-alls: dispatch before the experts'
    first GEMM, combine after their last; with ``etp`` > 1 the received tokens are
    all-gathered over the expert-tensor-parallel group after the dispatch and the
    outputs reduce-scattered before the combine (Megatron-Core's dispatcher with
    expert tensor parallelism: each rank holds 1/etp of every local expert)."""
    out: list = []
    first = next(k for k in kernels if isinstance(k, K.Kernel) and K.is_expert(k))
    for kernel in kernels:
        if kernel is first:  # experts_fc1, or its cast under low precision
            out += [DISPATCH, GATHER] if etp > 1 else [DISPATCH]
        out.append(kernel)
        if isinstance(kernel, K.Kernel) and kernel.name == "experts_fc2":
            out += [SCATTER, COMBINE] if etp > 1 else [COMBINE]
    return out


def all_to_all_bytes(ctx: Context) -> float:
    """Bytes one rank's dispatch (or combine) sends: its tokens' routed copies."""
    sh, m = ctx.shard, ctx.model
    return sh.tokens // sh.norm_split * m.top_k * m.hidden * sh.dtype_bytes


def group_of(step: str) -> str:
    """The group a MoE layer's exchange ``step`` runs on."""
    return "etp" if step in (GATHER, SCATTER) else "ep"


def exchange(ctx: Context, step: str, forward: bool, load: float) -> tuple[Collective, float]:
    """The collective and its bytes for a MoE layer's ``step`` (dispatch or combine)
    in a forward or backward pass; ``load``: the all-to-all's size factor for this
    layer and micro-batch (``routing.Routing.exchange``).

    - ``alltoall``: each rank's routed copies, both ways;
    - ``flex`` (DeepEP): each token once to every rank holding one of its
      experts (``routing.ranks_per_token`` of its ``top_k`` copies), both ways;
    - ``allgather``: the dispatch all-gathers the EP group's tokens (every rank
      picks its experts' copies), the combine reduce-scatters the outputs back,
      each the group's whole tensor whatever the loads; the backward mirrors
      them (a gather's gradient is a reduce-scatter).
    """
    if step in (GATHER, SCATTER):  # the EP group's receipts of every etp rank
        gathers = (step == GATHER) == forward
        return (Collective.ALL_GATHER if gathers else Collective.REDUCE_SCATTER), \
            all_to_all_bytes(ctx) * load * ctx.parallel.etp
    if ctx.parallel.moe_token_dispatcher_type == "alltoall":
        return KIND, all_to_all_bytes(ctx) * load
    if ctx.parallel.moe_token_dispatcher_type == "flex":  # once per rank, not per expert
        return KIND, all_to_all_bytes(ctx) * load * ctx.routing.ranks_per_token / ctx.model.top_k
    sh = ctx.shard
    whole = ctx.parallel.ep * sh.tokens // sh.norm_split * ctx.model.hidden * sh.dtype_bytes
    gathers = (step == DISPATCH) == forward
    return (Collective.ALL_GATHER if gathers else Collective.REDUCE_SCATTER), whole



def load_factors(ctx: Context) -> tuple[dict, dict]:
    """(expert kernels', token exchanges') factors per MoE layer and micro-batch
    of the busiest rank's load over the mean rank's kept load (at least 1): what
    imbalance costs (``analysis.summary.imbalance_cost``; the allgather
    dispatcher's exchanges are the group's whole tensor whatever the loads, 1)."""
    scale, exchange = ctx.routing.over_mean()
    if ctx.parallel.moe_token_dispatcher_type == "allgather":
        return scale, {layer: np.ones(len(f)) for layer, f in exchange.items()}
    return scale, exchange
