"""Transformer specifications and presets.

GPT-3 shapes are from Brown et al. 2020, Table 2.1, with the vocabulary padded
to 51200 as Megatron-LM pads GPT-2's 50257 (the 1.3B model uses 16 heads of 128,
the shape Megatron and the issue use, since 24 heads do not divide 2048).
Llama shapes are from the models' published config.json files.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class Mlp(Enum):
    GELU = "gelu"  # two matrices h->f->h, with biases (GPT)
    SWIGLU = "swiglu"  # gate and up h->f, down f->h, no biases (Llama)


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn_hidden: int
    vocab: int
    mlp: Mlp = Mlp.GELU
    tied_embeddings: bool = True
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
            llama("llama3-8b", 32, 4096, 32, 8, 14336, 128256),
        )
    }
)
