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

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType

from simulator.base.fields import boolean, integer, member, setting


class Mlp(Enum):
    GELU = "gelu"  # two matrices h->f->h, with biases (GPT)
    SWIGLU = "swiglu"  # gate and up h->f, down f->h, no biases (Llama)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer; the ``setting`` fields can be given in a
    scenario's ``model`` section (over a preset, or all of them inline)."""

    name: str
    layers: int = setting(integer(1))
    hidden: int = setting(integer(1))
    heads: int = setting(integer(1))
    kv_heads: int = setting(integer(1))
    ffn_hidden: int = setting(integer(1))
    vocab: int = setting(integer(1))
    mlp: Mlp = setting(member(Mlp), Mlp.GELU)
    tied_embeddings: bool = setting(boolean, True)
    learned_positions: bool = True  # GPT: learned position table; Llama: rotary

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def bias(self) -> bool:
        return self.mlp is Mlp.GELU


def gpt3(name: str, layers: int, hidden: int, heads: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, heads, 4 * hidden, 51200)


def llama(name: str, layers: int, hidden: int, heads: int, kv_heads: int, ffn: int,
          vocab: int) -> ModelSpec:
    return ModelSpec(name, layers, hidden, heads, kv_heads, ffn, vocab, Mlp.SWIGLU,
                     tied_embeddings=False, learned_positions=False)


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
        )
    }
)
