"""Transformer specifications and presets.

GPT-3 shapes are from Brown et al. 2020, Table 2.1, with the vocabulary padded
to 51200 as Megatron-LM pads GPT-2's 50257 (the 1.3B model uses 16 heads of 128,
the shape Megatron and the issue use, since 24 heads do not divide 2048).
The ``megatron-*`` models are the ten rows of Narayanan et al., SC21, Table 1
(vocabulary 51200). Llama 2 / 3 and GPT-NeoX-20B shapes are from the models'
published config.json files (Touvron et al. 2023; Meta 2024; Black et al. 2022).

Megatron pads the vocabulary so each tensor-parallel rank gets an equal,
aligned share: up to a multiple of 128 x tp (``padded_vocab``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from enum import Enum
from types import MappingProxyType

from simulator.base.fields import boolean, choice, integer, member, number, setting


class Mlp(Enum):
    GELU = "gelu"  # two matrices h->f->h, with biases (GPT)
    SWIGLU = "swiglu"  # gate and up h->f, down f->h, no biases (Llama)
    GEGLU = "geglu"  # SwiGLU's shapes with a GELU gate (Gemma)

    @property
    def gated(self) -> bool:
        """Whether a gate beside the up-projection doubles its width (SwiGLU, GeGLU)."""
        return self is not Mlp.GELU


MAX_EXPERTS = 65_536


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer; the ``setting`` fields can be given in a
    scenario's ``model`` section (over a preset, or all of them inline)."""

    name: str
    layers: int = setting(integer(1))  # transformer layers
    hidden: int = setting(integer(1))  # the hidden size (model width)
    heads: int = setting(integer(1))  # attention (query) heads
    kv_heads: int = setting(integer(1))  # key/value heads (fewer: grouped-query attention)
    ffn_hidden: int = setting(integer(1))  # the MLP's inner width
    vocab: int = setting(integer(1))  # vocabulary size (padded to a multiple of 128 x tp)
    mlp: Mlp = setting(member(Mlp), Mlp.GELU)  # the MLP: gelu (GPT), swiglu (Llama), geglu (Gemma)
    tied_embeddings: bool = setting(boolean, True)  # output layer shares the embedding
    learned_positions: bool = True  # GPT: learned position table; Llama: rotary
    # Mixture of experts (Megatron-Core's MoE layer; 0 experts: a dense model)
    # routed experts in each MoE layer (at most MAX_EXPERTS: published models route over
    # 8 to 384; every draw keeps a count per expert and micro-batch)
    experts: int = setting(integer(0, MAX_EXPERTS), 0)
    top_k: int = setting(integer(1), 2)  # experts each token is routed to
    expert_ffn_hidden: int | None = setting(integer(1), None)  # one expert's width
    shared_experts: int = setting(integer(0), 0)  # experts every token also passes
    moe_layer_freq: int = setting(integer(1), 1)  # layer i is MoE when i % freq == 0
    first_dense_layers: int = setting(integer(0), 0)  # DeepSeek's first_k_dense_replace
    capacity_factor: float | None = setting(number(0.01), None)  # None: dropless
    router: str = setting(choice(["softmax", "sigmoid"]), "softmax")  # score function
    # the load-balancing loss over the router's probabilities (Megatron-Core's default
    # --moe-router-load-balancing-type aux_loss; false: none, or aux-loss-free biases)
    router_aux_loss: bool = setting(boolean, True)
    # how tokens spread over the experts (``workloads.routing``), seeded by the scenario;
    # measured: trained routers' expert loads (Wang et al. 2024), by router_aux_loss
    routing: str = setting(choice(["measured", "uniform", "balanced", "round_robin", "zipf",
                                   "histogram"]), "measured")
    routing_skew: float = setting(number(0.0), 1.0)  # zipf: popularity ~ 1 / rank^skew
    # histogram: each expert's share of the tokens, one row for every MoE layer or one per
    # MoE layer in order (read from model.routing_histogram by the scenario loader)
    routing_weights: tuple[tuple[float, ...], ...] | None = None
    # attention's shape where it is not hidden / heads wide (Qwen3, GPT-OSS: HF head_dim)
    head_size: int | None = setting(integer(1), None)
    # sliding-window attention: each query sees the last ``sliding_window`` tokens; every
    # ``sliding_window_pattern``-th layer keeps full attention (0: none does)
    sliding_window: int | None = setting(integer(1), None)
    sliding_window_pattern: int = setting(integer(0), 0)  # every n-th layer full (0: none)
    # multi-head latent attention (DeepSeek-AI 2024, DeepSeek-V2 Sec. 2.1; kernels:
    # ``workloads.kernels.mla_kernels``): queries and keys/values through low-rank
    # latents, the HF config's names; standard: grouped-query attention
    attention: str = setting(choice(["standard", "mla"]), "standard")
    q_lora_rank: int | None = setting(integer(1), None)  # None: queries projected directly
    kv_lora_rank: int = setting(integer(1), 512)  # MLA: the keys' and values' latent
    qk_nope_head_dim: int = setting(integer(1), 128)  # MLA: a head's non-rotary width
    qk_rope_head_dim: int = setting(integer(1), 64)  # MLA: a head's rotary width
    v_head_dim: int = setting(integer(1), 128)  # MLA: a value head's width
    # multi-token prediction depths (DeepSeek-V3 Sec. 2.2; HF num_nextn_predict_layers):
    # each a projection, a layer of the last layer's kind and the shared output head,
    # on the last pipeline stage (``workloads.kernels.mtp_kernels``)
    mtp_layers: int = setting(integer(0), 0)

    @property
    def mla(self) -> bool:
        return self.attention == "mla"

    @property
    def head_dim(self) -> int:
        """A query's and key's width (MLA: its no-position and rotary parts)."""
        if self.mla:
            return self.qk_nope_head_dim + self.qk_rope_head_dim
        return self.head_size or self.hidden // self.heads

    @property
    def value_dim(self) -> int:
        """A value's (and an attention output's) width per head."""
        return self.v_head_dim if self.mla else self.head_dim

    @property
    def kv_width(self) -> int:
        """Keys' and values' width per token: what context parallelism exchanges."""
        if self.mla:
            return self.heads * (self.head_dim + self.v_head_dim)
        return 2 * self.kv_heads * self.head_dim

    @property
    def attention_width(self) -> int:
        """Heads x value size: the attention output's (the output projection's input) width."""
        return self.heads * self.value_dim

    def is_sliding_layer(self, layer: int | None) -> bool:
        """Whether ``layer`` attends over a sliding window (HF ``layer_types``:
        sliding, but every ``sliding_window_pattern``-th layer full)."""
        if self.sliding_window is None or layer is None:
            return False
        pattern = self.sliding_window_pattern
        return not (pattern and (layer + 1) % pattern == 0)

    def layer_kind(self, layer: int | None) -> tuple[bool, bool]:
        """(MoE, sliding-window): what sets a layer's kernels."""
        return self.is_moe_layer(layer), self.is_sliding_layer(layer)

    @property
    def bias(self) -> bool:
        return self.mlp is Mlp.GELU

    @property
    def expert_ffn(self) -> int:
        """One expert's hidden width (``ffn_hidden`` unless set)."""
        return self.expert_ffn_hidden or self.ffn_hidden

    @property
    def first_moe_layer(self) -> int | None:
        """The first layer with routed experts (None in a dense model)."""
        return next((n for n in range(self.layers) if self.is_moe_layer(n)), None)

    def is_moe_layer(self, layer: int | None) -> bool:
        """Whether transformer layer ``layer`` (0-based) has routed experts:
        after the first dense layers, every ``moe_layer_freq``-th layer
        (Megatron-Core's ``moe_layer_freq``).

        >>> MODELS["deepseek-v3-like"].is_moe_layer(2), MODELS["deepseek-v3-like"].is_moe_layer(3)
        (False, True)
        """
        return (self.experts > 0 and layer is not None and layer >= self.first_dense_layers
                and layer % self.moe_layer_freq == 0)


@dataclass(frozen=True)
class Kind:
    """A kind of model and the ``ModelSpec`` keys only it uses: the scenario
    refuses one of them given to a model of another kind (``config.model``)
    instead of ignoring it. ``needs``: the kind, the key that makes it, and
    why the others have no use for its keys."""

    needs: str
    keys: tuple[str, ...]
    of: Callable[[ModelSpec], bool]


MOE_ONLY = ("top_k", "expert_ffn_hidden", "shared_experts", "moe_layer_freq",
            "first_dense_layers", "capacity_factor", "router", "router_aux_loss", "routing",
            "routing_skew")
MLA_ONLY = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim",
            "v_head_dim")
KINDS = (
    Kind("a model with experts (model.experts > 0): a dense model has no router", MOE_ONLY,
         lambda m: m.experts > 0),
    Kind("multi-head latent attention (model.attention: mla): standard attention projects "
         "its queries, keys and values without latents", MLA_ONLY, lambda m: m.mla),
    Kind("standard attention (model.attention: standard): multi-head latent attention's "
         "heads are qk_nope_head_dim + qk_rope_head_dim wide, its keys and values one per "
         "head from the latent", ("head_size", "kv_heads"), lambda m: not m.mla),
    Kind("sliding-window attention (model.sliding_window): without a window every layer "
         "attends to the whole sequence", ("sliding_window_pattern",),
         lambda m: m.sliding_window is not None),
)


def gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, 51200)


def llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
          vocab: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, ffn, vocab, Mlp.SWIGLU,
                     tied_embeddings=False, learned_positions=False)


def moe(base: ModelSpec, experts: int, top_k: int, expert_ffn: int, shared: int = 0,
        **keys) -> ModelSpec:
    """A mixture-of-experts model: ``base``'s attention and dense layers, with
    ``experts`` routed experts of width ``expert_ffn`` (top ``top_k``) and
    ``shared`` shared experts in its MoE layers."""
    return replace(base, experts=experts, top_k=top_k, expert_ffn_hidden=expert_ffn,
                   shared_experts=shared, **keys)


def megatron(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, 51200)


def padded_vocab(vocab: int, tp: int, divisible_by: int = 128) -> int:
    """Megatron's padded vocabulary size.

    >>> padded_vocab(50257, 1), padded_vocab(50257, 8), padded_vocab(32000, 8)
    (50304, 51200, 32768)
    """
    multiple = divisible_by * tp
    return -(-vocab // multiple) * multiple


MODELS: Mapping[str, ModelSpec] = MappingProxyType(
    {
        m.name: m
        for m in (
            gpt3("gpt3-125m", 12, 768, 12),
            gpt3("gpt3-350m", 24, 1024, 16),
            gpt3("gpt3-760m", 24, 1536, 16),
            gpt3("gpt3-1.3b", 24, 2048, 16),
            gpt3("gpt3-2.7b", 32, 2560, 32),
            gpt3("gpt3-6.7b", 32, 4096, 32),
            gpt3("gpt3-13b", 40, 5120, 40),
            gpt3("gpt3-175b", 96, 12288, 96),
            llama("llama2-7b", 32, 4096, 32, 32, 11008, 32000),
            llama("llama2-13b", 40, 5120, 40, 40, 13824, 32000),
            llama("llama2-70b", 80, 8192, 64, 8, 28672, 32000),
            llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
            llama("llama3-70b", 80, 8192, 64, 8, 28672, 128256),
            llama("llama3-405b", 126, 16384, 128, 8, 53248, 128256),
            ModelSpec("gpt-neox-20b", 44, 6144, 64, 64, 24576, 50432, Mlp.GELU,
                      tied_embeddings=False, learned_positions=False),
            megatron("megatron-1.7b", 24, 2304, 24),
            megatron("megatron-3.6b", 30, 3072, 32),
            megatron("megatron-7.5b", 36, 4096, 32),
            megatron("megatron-18.4b", 40, 6144, 48),
            megatron("megatron-39.1b", 48, 8192, 64),
            megatron("megatron-76.1b", 60, 10240, 80),
            megatron("megatron-145.6b", 80, 12288, 96),
            megatron("megatron-310.1b", 96, 16384, 128),
            megatron("megatron-529.6b", 105, 20480, 128),
            megatron("megatron-1t", 128, 25600, 160),
            # Mixtral 8x7B and 8x22B (Jiang et al. 2024; config.json: 8 experts, top 2)
            moe(llama("mixtral-8x7b", 32, 4096, 32, 8, 14336, 32000), 8, 2, 14336),
            moe(llama("mixtral-8x22b", 56, 6144, 48, 8, 16384, 32768), 8, 2, 16384),
            # Qwen1.5-MoE-A2.7B (config.json: 60 experts of 1408, top 4, one shared
            # expert of 5632 = 4 x 1408)
            moe(llama("qwen1.5-moe-a2.7b", 24, 2048, 16, 16, 5632, 151936), 60, 4, 1408, 4),
            # DeepSeek-V3's shape (DeepSeek-AI 2024, config.json): 61 layers of 7168, the
            # first 3 dense (ffn 18432), then 256 routed experts of 2048 (top 8, sigmoid
            # router) and 1 shared; its attention standard with 128 heads (the benchmarks'
            # model; ``deepseek-v3`` below has multi-head latent attention)
            moe(llama("deepseek-v3-like", 61, 7168, 128, 128, 18432, 129280), 256, 8, 2048, 1,
                first_dense_layers=3, router="sigmoid"),
            # DeepSeek-V3 as published (config.json): the same with multi-head latent
            # attention (query latent 1536, key-value latent 512, heads' no-position
            # 128 and rotary 64 query/key parts, values 128): 671 B parameters, 37 B
            # active (DeepSeek-AI 2024, arXiv 2412.19437); router without auxiliary
            # loss (bias-based balancing); its multi-token-prediction module is
            # model.mtp_layers: 1 (the config's num_nextn_predict_layers)
            moe(llama("deepseek-v3", 61, 7168, 128, 128, 18432, 129280), 256, 8, 2048, 1,
                first_dense_layers=3, router="sigmoid", router_aux_loss=False,
                attention="mla", q_lora_rank=1536),
            # Kimi K2 (Moonshot AI 2025, config.json): DeepSeek-V3's architecture with
            # 64 heads, 384 experts (top 8), one dense layer, vocabulary 163,840:
            # 1.026 T parameters and 32.9 B active counted from these shapes (its report,
            # arXiv 2507.20534: 1.04 T and 32 B)
            moe(llama("kimi-k2", 61, 7168, 64, 64, 18432, 163840), 384, 8, 2048, 1,
                first_dense_layers=1, router="sigmoid", router_aux_loss=False,
                attention="mla", q_lora_rank=1536),
            # GPT-OSS-120B (OpenAI 2025, config.json): 36 layers of 2880, 64 heads of 64
            # (8 KV), sliding windows of 128 tokens on every other layer, 128 experts of
            # 2880 (top 4); attention sinks and biases left out (well under 0.1 % of FLOPs)
            moe(llama("gpt-oss-120b", 36, 2880, 64, 8, 2880, 201088), 128, 4, 2880,
                head_size=64, sliding_window=128, sliding_window_pattern=2),
            # Qwen3-30B-A3B (Qwen team 2025, config.json): 48 layers of 2048, 32 heads of
            # 128 (4 KV), 128 experts of 768 (top 8), no shared expert
            moe(llama("qwen3-30b-a3b", 48, 2048, 32, 4, 6144, 151936), 128, 8, 768,
                head_size=128),
            # Qwen3-235B-A22B (Qwen team 2025, config.json): 94 layers of 4096, 64 heads
            # of 128 (4 KV), 128 experts of 1536 (top 8), no shared expert
            moe(llama("qwen3-235b-a22b", 94, 4096, 64, 4, 12288, 151936), 128, 8, 1536,
                head_size=128),
        )
    }
)
