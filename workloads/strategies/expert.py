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

DeepEP (``flex``) moves a token once to each rank holding one of its experts.
Where an EP group spans several NVLink domains (servers, or NVL72 racks) its
normal kernels take two hops (DeepEP's README; the DeepSeek-V3 report, Sec.
3.2.2): a token goes over RDMA once to each domain holding its experts, to the
rank of the same local index there, which forwards it over NVLink to the ranks
that hold them; the combine mirrors it. ``hops`` gives both as all-to-alls that
run at once (DeepEP pipelines them in chunks: the slower sets the time), each
its backend's own kernel (``moe_flex_dispatcher_backend``: DeepEP or HybridEP,
``flex_kernel``) timed at its published achieved bandwidth, far below the
links' (``simulator.collectives.expert_exchange``), the RDMA one over the
``ep_rdma`` groups (one rank per domain) on its own stream, the NVLink one over
the ``ep_nvl`` groups (an EP group's ranks in one domain). The SMs DeepEP's
kernels hold (20-24 of an H100's 132) slow the compute beside them as NCCL's do
(``compute.contention``: 1.19x measured, 1.18-1.22x from that share). Left out:
its low-latency kernels (inference decoding) and DeepSeek-V3's node-limited
routing (at most 4 nodes a token: here domains are drawn as the experts are).
"""

from __future__ import annotations

import numpy as np

from simulator.base.ir import EP_RDMA_STREAM, EP_STREAM, RDMA_HOP, Collective
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.stage import Context, LayoutError
from workloads.strategies.dimension import POWERS, Bounds, Dimension, only_one
from workloads.training import ParallelSpec, TrainingSpec

DISPATCH, COMBINE = "dispatch", "combine"  # markers in a MoE layer's kernel sequence
GATHER, SCATTER = "etp_gather", "etp_scatter"  # expert tensor parallelism's (etp > 1)
KIND = Collective.ALL_TO_ALL  # the dispatcher's exchange (alltoall)
RDMA, NVL = "ep_rdma", "ep_nvl"  # DeepEP's two hops' groups (across domains, inside one)


def _expert_sizes(bounds: Bounds) -> list[int]:
    """Powers of two dividing the experts within the NVLink domain (at least a
    server's 8 GPUs); 1 for a model without experts."""
    return [e for e in POWERS if bounds.experts % e == 0 and e <= max(bounds.domain, 8)
            and e <= bounds.world] if bounds.experts else [1]


def _carved(sizes, bounds: Bounds) -> bool:
    """ep x etp divide a stage's tp x cp x dp ranks."""
    return (sizes["tp"] * sizes["cp"] * sizes["dp"]) % (sizes["ep"] * sizes["etp"]) == 0


DIMENSIONS = (Dimension("ep", EP_STREAM, "expert-parallel sizes (default: powers of two "
                        "dividing the experts, within the NVLink domain)", _expert_sizes,
                        _carved, carved=True),
              Dimension("etp", EP_STREAM, "expert tensor-parallel sizes (default 1)", only_one,
                        carved=True))


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
    if parallel.moe_flex_dispatcher_backend != "deepep" and \
            parallel.moe_token_dispatcher_type != "flex":
        raise LayoutError(f"parallelism.moe_flex_dispatcher_backend "
                          f"({parallel.moe_flex_dispatcher_backend!r}) applies to the flex "
                          f"dispatcher only; parallelism.moe_token_dispatcher_type is "
                          f"{parallel.moe_token_dispatcher_type!r} (allowed with it: 'flex')")
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
    count = domains(parallel)
    if count > 1:
        out.update(hop_groups(out["ep"], parallel.ranks_per_domain, count))
    return out


def domains(parallel: ParallelSpec) -> int:
    """NVLink domains an expert-parallel group spans where DeepEP takes two hops
    (``flex``; 1: one hop, over NVLink or as one all-to-all): its ep x etp
    consecutive ranks over whole domains of ``ranks_per_domain`` (a stage's ranks
    consecutive and in whole domains: ``order`` ends with pp; otherwise one hop)."""
    span, per = parallel.ep * parallel.etp, parallel.ranks_per_domain
    stage = parallel.tp * parallel.cp * parallel.dp
    if parallel.moe_token_dispatcher_type != "flex" or span <= per or span % per or \
            per % parallel.etp or stage % per or not parallel.order.endswith("pp"):
        return 1
    return span // per


def hop_groups(ep_groups: tuple, per_domain: int, count: int) -> dict[str, tuple]:
    """DeepEP's two hops' groups: each EP group's ranks in one domain (``ep_nvl``)
    and its ranks of one local index, one per domain (``ep_rdma``).

    >>> hop_groups(((0, 1, 2, 3), (4, 5, 6, 7)), 2, 2)
    {'ep_nvl': ((0, 1), (2, 3), (4, 5), (6, 7)), 'ep_rdma': ((0, 2), (1, 3), (4, 6), (5, 7))}
    """
    nvl, rdma = [], []
    for group in ep_groups:
        parts: dict[int, list[int]] = {}
        for rank in group:
            parts.setdefault(rank // per_domain, []).append(rank)
        if len(parts) != count or len({len(p) for p in parts.values()}) != 1:
            raise AssertionError(f"expert-parallel group {list(group)[:8]}... is not in "
                                 f"{count} whole domains of {per_domain} (domains())")
        members = [parts[d] for d in sorted(parts)]
        nvl += [tuple(m) for m in members]
        rdma += [tuple(m[j] for m in members) for j in range(len(members[0]))]
    return {NVL: tuple(sorted(nvl)), RDMA: tuple(sorted(rdma))}


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
        return flex_kernel(ctx.parallel, step, forward), \
            all_to_all_bytes(ctx) * load * ctx.routing.ranks_per_token / ctx.model.top_k
    sh = ctx.shard
    whole = ctx.parallel.ep * sh.tokens // sh.norm_split * ctx.model.hidden * sh.dtype_bytes
    gathers = (step == DISPATCH) == forward
    return (Collective.ALL_GATHER if gathers else Collective.REDUCE_SCATTER), whole



FLEX_KERNELS = {("deepep", DISPATCH): Collective.DEEPEP_DISPATCH,
                ("deepep", COMBINE): Collective.DEEPEP_COMBINE,
                ("hybridep", DISPATCH): Collective.HYBRIDEP_DISPATCH,
                ("hybridep", COMBINE): Collective.HYBRIDEP_COMBINE}


def flex_kernel(parallel: ParallelSpec, step: str, forward: bool) -> Collective:
    """The flex dispatcher's kernel for ``step``: its backend's dispatch or combine
    (``moe_flex_dispatcher_backend``), timed at its published rate
    (``simulator.collectives.expert_exchange``). A backward runs the other kernel:
    the dispatch's gradient is a combine and the combine's a dispatch
    (Megatron-Core ``fused_a2a.py``: ``FusedDispatch.backward`` calls the buffer's
    ``combine``, ``FusedCombine.backward`` its ``dispatch``)."""
    kernel = DISPATCH if (step == DISPATCH) == forward else COMBINE
    return FLEX_KERNELS[(parallel.moe_flex_dispatcher_backend, kernel)]


def hops(ctx: Context, step: str, forward: bool, load: float
         ) -> tuple[tuple[str, str, Collective, float, str], ...]:
    """(stream, group, collective, bytes, name) of each exchange a MoE layer's
    ``step`` runs at once: one (``exchange`` on the ``ep`` stream), or DeepEP's two
    hops across NVLink domains (``domains``): the NVLink hop moves what
    ``exchange`` gives (each token once per rank holding its experts: from the
    rank, or forwarded by its domain's relay), the RDMA hop each token once per
    domain holding its experts (``routing.domains_per_token``; the share for the
    rank's own domain stays in it, as NCCL's all-to-all keeps a rank's own).
    None over a group of one rank: Megatron-Core's all-to-all and gathers return
    their input at once for a group of size 1 (``tensor_parallel.mappings``)."""
    if (ctx.parallel.etp if group_of(step) == "etp" else ctx.parallel.ep) == 1:
        return ()
    kind, nbytes = exchange(ctx, step, forward, load)
    if step in (GATHER, SCATTER) or domains(ctx.parallel) == 1:
        return ((EP_STREAM, group_of(step), kind, nbytes, step),)
    per_token = all_to_all_bytes(ctx) * load / ctx.model.top_k
    return ((EP_RDMA_STREAM, RDMA, kind, per_token * ctx.routing.domains_per_token,
             f"{step}{RDMA_HOP}"), (EP_STREAM, NVL, kind, nbytes, step))


COUNTS = "token_counts"  # the alltoall dispatcher's gather of tokens per expert
COUNT_BYTES = 8  # int64: Megatron-Core's ``routing_map.sum(dim=0).long()``
DEEPEP_COUNT_BYTES = 4  # int32 counters of DeepEP's notify_dispatch (deep_ep/buffer.py)


def counts(ctx: Context, step: str, forward: bool) -> tuple[tuple[str, str, Collective,
                                                                 float, str], ...]:
    """(stream, group, collective, bytes, name) of the small exchanges that tell
    each rank how many tokens it will receive, before a forward's dispatch (the
    host then waits for them: ``compute.host``); none in a backward, whose
    all-to-alls reuse the forward's split sizes, nor over one rank.

    - ``alltoall`` (``MoEAlltoAllTokenDispatcher.preprocess``, Megatron-Core,
      ``megatron/core/transformer/moe/token_dispatcher.py``): each rank's
      ``num_local_tokens_per_expert`` (one int64 per expert) all-gathered over
      the EP group (``gather_from_sequence_parallel_region``), copied to the host
      for the all-to-all's ``input_splits``/``output_splits``;
    - ``flex`` (DeepEP's ``notify_dispatch``, inside its dispatch): each peer
      its local experts' counts and the rank's, int32: an all-to-all of
      ``(experts + ep) x 4`` bytes a rank;
    - ``allgather`` (``MoEAllGatherTokenDispatcher.token_dispatch``): the
      routing map (bool) and the probabilities (the activations' type) of the
      EP group's tokens, all-gathered before the tokens; the probabilities'
      gradient is reduce-scattered back in the backward.
    """
    ep, m, sh = ctx.parallel.ep, ctx.model, ctx.shard
    kind = ctx.parallel.moe_token_dispatcher_type
    if step != DISPATCH or ep == 1 or (not forward and kind != "allgather"):
        return ()
    if kind == "alltoall":
        return ((EP_STREAM, "ep", Collective.ALL_GATHER, ep * m.experts * COUNT_BYTES, COUNTS),)
    if kind == "flex":
        return ((EP_STREAM, "ep", Collective.ALL_TO_ALL,
                 (m.experts + ep) * DEEPEP_COUNT_BYTES, COUNTS),)
    scores = ep * (sh.tokens // sh.norm_split) * m.experts
    probs = (EP_STREAM, "ep", Collective.ALL_GATHER if forward else Collective.REDUCE_SCATTER,
             scores * sh.dtype_bytes, "routing_probs")
    return ((EP_STREAM, "ep", Collective.ALL_GATHER, float(scores), "routing_map"), probs) \
        if forward else (probs,)


def load_factors(ctx: Context) -> tuple[dict, dict]:
    """(expert kernels', token exchanges') factors per MoE layer and micro-batch
    of the busiest rank's load over the mean rank's kept load (at least 1): what
    imbalance costs (``analysis.summary.imbalance_cost``; the allgather
    dispatcher's exchanges are the group's whole tensor whatever the loads, 1)."""
    scale, exchange = ctx.routing.over_mean()
    if ctx.parallel.moe_token_dispatcher_type == "allgather":
        return scale, {layer: np.ones(len(f)) for layer, f in exchange.items()}
    return scale, exchange
