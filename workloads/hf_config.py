"""Read a Hugging Face ``config.json`` into a ModelSpec.

Understands the Llama/Mistral/Qwen family keys (``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``hidden_act``, ``tie_word_embeddings``)
and the GPT-2 family keys (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``,
``activation_function``). A gated activation (silu/swish, as in Llama) gives a
SwiGLU MLP; anything else a plain GELU-style MLP.
"""

from __future__ import annotations

import json
from pathlib import Path

from workloads.models import Mlp, ModelSpec

_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


class HfConfigError(ValueError):
    """A config.json the reader cannot use; the message names the key."""


def _first(config: dict, names: tuple[str, ...], path: str) -> int:
    for name in names:
        value = config.get(name)
        if isinstance(value, int) and value > 0:
            return value
    raise HfConfigError(f"{path}: needs a positive integer {' or '.join(names)}")


def model_from_hf(path: str | Path) -> ModelSpec:
    """The transformer a Hugging Face config describes."""
    file = Path(path)
    try:
        config = json.loads(file.read_text())
    except OSError:
        raise HfConfigError(f"{path}: cannot read the file") from None
    except json.JSONDecodeError as error:
        raise HfConfigError(f"{path}: not JSON (line {error.lineno})") from None
    if not isinstance(config, dict):
        raise HfConfigError(f"{path}: must be a JSON object")
    shape = {k: _first(config, names, str(path)) for k, names in _KEYS.items()}
    activation = str(config.get("hidden_act", config.get("activation_function", "gelu")))
    gated = activation in ("silu", "swish", "swiglu")
    ffn = config.get("intermediate_size") or config.get("n_inner") or 4 * shape["hidden"]
    return ModelSpec(
        name=str(config.get("_name_or_path") or config.get("model_type") or file.parent.name),
        layers=shape["layers"], hidden=shape["hidden"], heads=shape["heads"],
        kv_heads=int(config.get("num_key_value_heads") or shape["heads"]),
        ffn_hidden=int(ffn), vocab=shape["vocab"],
        mlp=Mlp.SWIGLU if gated else Mlp.GELU,
        tied_embeddings=bool(config.get("tie_word_embeddings", not gated)),
        learned_positions=config.get("model_type") in ("gpt2", "gpt_bigcode", "opt"),
    )
