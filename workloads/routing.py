"""Token routing in MoE layers: how many token copies each expert, and each
expert-parallel rank, receives in every micro-batch, drawn from a seeded
distribution (``model.routing``):

- ``measured`` (the default): each expert's popularity as trained routers'
  are, drawn per layer (a gamma distribution of mean 1 and coefficient of
  variation ``LOAD_CV``), the counts multinomial around it. The spread is the
  one that gives, over 64 routed experts, the max-over-mean expert load that
  Wang et al. 2024 (arXiv:2408.15664, "Auxiliary-Loss-Free Load Balancing",
  Table 2: MaxVio_global over the validation set of DeepSeekMoE models of 1B
  and 3B parameters, 64 routed experts) measured: 0.72 and 0.52 with the
  auxiliary loss (mean 0.62), 0.04 with loss-free balancing's biases
  (``router_aux_loss: false``, as DeepSeek-V3). A rank holding L experts sums
  L independent popularities, so its load spreads about 1 / sqrt(L) as much as
  one expert's;
- ``balanced``: every expert gets the same share (an ideal router; a token's
  experts independent of where they live, as Megatron-Core's forced load
  balancing draws them);
- ``round_robin``: every expert the same share, token i's experts side by side:
  i k ... i k + k - 1 modulo the experts (NeMo AutoModel's ``FakeBalancedGate``),
  so a token's copies mostly share a rank;
- ``uniform``: each copy goes to an expert drawn uniformly at random, so the
  counts are multinomial (the fluctuation of a router with no preference);
- ``zipf``: expert popularity falls as 1 / rank^``routing_skew``, the ranking
  shuffled per layer (a skewed router, as measured routers are: Fedus et al.
  2022 and Jiang et al. 2024 report uneven expert loads);
- ``histogram``: each expert's share from a measured histogram
  (``model.routing_histogram``: one row of weights for every MoE layer, or
  one row per MoE layer), the counts multinomial around it.

With ``capacity_factor`` C an expert keeps at most ceil(C copies / experts)
copies and drops the rest (counted; dropped copies are neither sent nor
computed, and the model FLOPs count the kept ones); without it routing is
dropless.

What the program uses: each expert-parallel rank's load is the sum over its
local experts. The combine all-to-all makes every member of an EP group wait
for the most loaded one, so a stage's program runs each MoE layer's experts at
that rank's load (``scale``: its copies over the balanced share) and sizes its
all-to-alls by the larger of what a rank sends (the mean rank's kept copies)
and what the most loaded receives (``exchange``). Every EP group of a stage
sees the same draw (the router's statistics are modelled, not its tokens), so
the ranks of a stage keep one program; the iteration time is exact for the
draw, and every rank's expert kernels show the most loaded rank's time (the
others would compute less and wait at the combine).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from workloads.models import ModelSpec

# coefficient of variation of the experts' popularity (``measured``): the gamma spread whose
# expected max over 64 experts is the MaxVio_global of Wang et al. 2024 Table 2 (above):
# 0.62 (the auxiliary loss: 0.72 at 1B, 0.52 at 3B) -> 0.23; 0.04 (loss-free) -> 0.017
# (figures quoted from memory of Table 2, the paper not re-read: check them against it)
LOAD_CV = {True: 0.23, False: 0.017}  # by router_aux_loss
ROUTING_SEED = 17  # separates routing draws from other seeded streams (jitter)
GRAIN = 128  # factors rounded to 1/128 of the balanced share (within 0.4 %): calls of
# nearly one size share their lowering and network shape, which a 64-rank
# all-to-all (4,032 flows) takes milliseconds to build


@dataclass(frozen=True)
class Routing:
    """Per (layer, micro-batch) factors, and what the draws came to."""

    scale: dict[int, np.ndarray]  # MoE layer -> per micro-batch: most loaded rank / balanced
    exchange: dict[int, np.ndarray]  # MoE layer -> per micro-batch: all-to-all size factor
    imbalance: float  # mean over passes of the most loaded rank's copies / the mean rank's
    expert_imbalance: float  # mean over passes of the busiest expert's copies / the mean
    dropped: float  # fraction of copies dropped at capacity
    varies: bool  # whether micro-batches differ (anything but balanced, undropped routing)
    ranks_per_token: float = 1.0  # EP ranks holding a token's experts, on average
    # NVLink domains of the EP group holding a token's experts, on average (DeepEP's
    # RDMA hop sends a token once to each: ``ranks_per_token`` over the domains)
    domains_per_token: float = 1.0
    # MoE layer -> per micro-batch: the mean rank's kept copies / balanced (1 dropless)
    kept: dict[int, np.ndarray] | None = None
    # MoE layer -> per micro-batch, per local expert: the most loaded rank's copies of
    # each of its experts over the even share (its grouped GEMMs' rows, expert by
    # expert); None: every expert its even share
    spread: dict[int, tuple[tuple[float, ...], ...]] | None = None

    def over_mean(self) -> tuple[dict, dict]:
        """(expert kernels', exchanges') factors over the mean rank's kept load, at
        least 1: what the busiest rank's load costs beyond an even split of the
        tokens kept (``scale`` and ``exchange`` are over the balanced share of all
        copies, which capacity-dropped tokens no longer fill)."""
        def over(factors: dict) -> dict:
            return {layer: np.maximum(np.asarray(f, dtype=float) / self._kept(layer), 1.0)
                    for layer, f in factors.items()}
        return over(self.scale), over(self.exchange)

    def _kept(self, layer: int) -> np.ndarray | float:
        return 1.0 if self.kept is None else self.kept[layer]


def ranks_per_token(model: ModelSpec, ep: int) -> float:
    """The mean number of EP ranks (of ``ep``, each holding experts / ep
    consecutive experts) that hold one of a token's ``top_k`` experts: what a
    dispatcher that sends a token once per rank (DeepEP) moves, per token.
    ``round_robin`` routing: its exact mean over a period of tokens; otherwise the
    experts are taken as drawn without regard to where they live, so a rank
    holds none of them with probability C(E - E/ep, k) / C(E, k) (hypergeometric).

    >>> from dataclasses import replace
    >>> from workloads.models import MODELS
    >>> qwen = MODELS["qwen3-30b-a3b"]  # 128 experts, top 8
    >>> ranks_per_token(replace(qwen, routing="round_robin"), 8)
    1.0
    >>> round(ranks_per_token(qwen, 8), 3)
    5.339
    """
    e, k = model.experts, model.top_k
    if model.routing == "round_robin":
        local = e // ep
        return sum(len({(i * k + j) % e // local for j in range(k)}) for i in range(e)) / e
    return ep * (1.0 - math.comb(e - e // ep, k) / math.comb(e, k))


def expert_shares(model: ModelSpec, rng: np.random.Generator, moe_index: int = 0
                  ) -> np.ndarray:
    """The probability of each expert in the ``moe_index``-th MoE layer."""
    if model.routing == "histogram" and model.routing_weights:
        row = np.asarray(model.routing_weights[moe_index % len(model.routing_weights)])
        return row / row.sum()
    if model.routing == "measured":
        cv = LOAD_CV[model.router_aux_loss]
        weights = rng.gamma(1.0 / cv**2, cv**2, model.experts)
        return weights / weights.sum()
    if model.routing != "zipf":
        return np.full(model.experts, 1.0 / model.experts)
    with np.errstate(over="ignore"):  # a large skew: rank^skew is inf, its weight 0 (rank 1
        weights = 1.0 / np.arange(1, model.experts + 1) ** model.routing_skew  # keeps 1)
    return rng.permutation(weights / weights.sum())


def draw(model: ModelSpec, ep: int, copies: int, micro_batches: int, seed: int,
         domains: int = 1) -> Routing:
    """Loads of every MoE layer and micro-batch: ``copies`` token copies per rank
    (its tokens x top_k), an EP group of ``ep`` ranks over ``domains`` NVLink
    domains (each holding the experts of its consecutive ranks)."""
    total, experts = copies * ep, model.experts
    cap = math.ceil(model.capacity_factor * total / experts) if model.capacity_factor else None
    scale, exchange, kept, spread, ranks_max, experts_max, dropped = {}, {}, {}, {}, [], [], 0.0
    layers = [n for n in range(model.layers) if model.is_moe_layer(n)]
    for index, layer in enumerate(layers):
        rng = np.random.default_rng([seed, ROUTING_SEED, layer])
        if model.routing in ("balanced", "round_robin"):
            counts = np.full((micro_batches, experts), total / experts)
        else:
            counts = rng.multinomial(total, expert_shares(model, rng, index),
                                     size=micro_batches).astype(float)
        if cap is not None:
            dropped += float(np.maximum(counts - cap, 0).sum())
            counts = np.minimum(counts, cap)
        local = counts.reshape(micro_batches, ep, experts // ep)
        loads = local.sum(axis=2)
        busiest = local[np.arange(micro_batches), loads.argmax(axis=1)]
        spread[layer] = tuple(map(tuple, (np.round(busiest / (copies / local.shape[2]) * GRAIN)
                                          / GRAIN).tolist()))
        scale[layer] = np.round(loads.max(axis=1) / copies * GRAIN) / GRAIN
        kept[layer] = loads.mean(axis=1) / copies  # (1: nothing dropped)
        exchange[layer] = np.maximum(scale[layer], np.round(kept[layer] * GRAIN) / GRAIN)
        ranks_max.append(loads.max(axis=1) / loads.mean(axis=1))
        experts_max.append(counts.max(axis=1) / counts.mean(axis=1))
    passes = len(scale) * micro_batches
    return Routing(scale, exchange, float(np.mean(ranks_max)) if ranks_max else 1.0,
                   float(np.mean(experts_max)) if experts_max else 1.0,
                   dropped / (total * passes) if passes else 0.0,
                   any(np.ptp(v) > 0 or v[0] != 1.0 for v in scale.values()),
                   ranks_per_token(model, ep), ranks_per_token(model, domains), kept,
                   spread if model.routing not in ("balanced", "round_robin") else None)
