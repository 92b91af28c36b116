"""Read a Hugging Face ``config.json`` into a ModelSpec.

Understands the Llama/Mistral/Qwen family keys (``num_hidden_layers``,
``hidden_size``, ``num_attention_heads``, ``num_key_value_heads``,
``intermediate_size``, ``vocab_size``, ``hidden_act``, ``tie_word_embeddings``)
and the GPT-2 family keys (``n_layer``, ``n_embd``, ``n_head``, ``n_inner``,
``activation_function``). A gated activation (silu/swish, as in Llama) gives a
SwiGLU MLP, Gemma's (``model_type: gemma*``, ``hidden_activation``
``gelu_pytorch_tanh``) a GeGLU one of the same shapes; anything else a plain
GELU-style MLP. Mixture-of-experts keys:
Mixtral's ``num_local_experts`` (its experts as wide as ``intermediate_size``),
Qwen-MoE's ``num_experts``, ``moe_intermediate_size``,
``shared_expert_intermediate_size`` and ``decoder_sparse_step``, DeepSeek's
``n_routed_experts``, ``n_shared_experts``, ``first_k_dense_replace``,
``moe_layer_freq`` and ``scoring_func``; ``num_experts_per_tok`` for all.
Multi-head latent attention from ``q_lora_rank``, ``kv_lora_rank``,
``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim`` (DeepSeek, Kimi),
with ``num_nextn_predict_layers`` multi-token-prediction depths.
Every value it reads is checked (a size a positive integer, a flag true or false,
names of one value agreeing), then by the checks the same key has inline
(``ModelSpec``'s settings: at most ``MAX_EXPERTS`` experts, ...), each error
naming the config's key; the scenario's ``model`` checks then apply to the
result as to any model.
"""

from __future__ import annotations

import json
from enum import Enum
from pathlib import Path

from simulator.base.fields import ScenarioError, schema_of
from simulator.base.user_files import read_text
from workloads.models import Mlp, ModelSpec

_KEYS = {
    "layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden": ("hidden_size", "n_embd", "d_model"),
    "heads": ("num_attention_heads", "n_head"),
    "vocab": ("vocab_size",),
}


SCHEMA = schema_of(ModelSpec)
_FROM = {  # each ModelSpec key: the config keys it is read from, for the errors
    **_KEYS, "kv_heads": ("num_key_value_heads",), "ffn_hidden": ("intermediate_size", "n_inner"),
    "experts": ("num_local_experts", "num_experts", "n_routed_experts"),
    "expert_ffn_hidden": ("moe_intermediate_size",),
    "shared_experts": ("shared_expert_intermediate_size", "n_shared_experts"),
    "top_k": ("num_experts_per_tok",), "moe_layer_freq": ("moe_layer_freq", "decoder_sparse_step"),
    "first_dense_layers": ("first_k_dense_replace",), "router": ("scoring_func",),
    "head_size": ("head_dim",), "sliding_window_pattern": ("layer_types", "sliding_window_pattern"),
    "mtp_layers": ("num_nextn_predict_layers",), "tied_embeddings": ("tie_word_embeddings",),
    "mlp": ("hidden_activation", "hidden_act", "activation_function"),
}


class HfConfigError(ValueError):
    """A config.json the reader cannot use; the message names the key."""


def _first(config: dict, names: tuple[str, ...], path: str) -> int:
    """The first of ``names`` given: a positive integer (``_optional``), required."""
    value = _optional(config, names, path)
    if value is None:
        raise HfConfigError(f"{path}: needs a positive integer {' or '.join(names)}")
    return value


def _optional(config: dict, names: tuple[str, ...], path: str) -> int | None:
    """The first of ``names`` that is given (not null): a positive integer, or an
    error naming the key and its value; None when none is given. Names given
    together must agree (Mixtral's ``num_local_experts`` and DeepSeek's
    ``n_routed_experts`` are one count)."""
    given = [(name, config[name]) for name in names if config.get(name) is not None]
    for (a, first), (b, other) in zip(given, given[1:], strict=False):
        if first != other or type(first) is not type(other):
            raise HfConfigError(f"{path}: {a}: {first!r} and {b}: {other!r} disagree; "
                                "give one")
    for name, value in given[:1]:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise HfConfigError(f"{path}: {name}: {value!r} must be a positive integer")
        return value
    return None


def _flag(config: dict, name: str, default: bool, path: str) -> bool:
    value = config.get(name, default)
    if not isinstance(value, bool):
        raise HfConfigError(f"{path}: {name}: {value!r} must be true or false")
    return value


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object, refusing a key given twice (``json`` keeps the last silently)."""
    out: dict = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"{key}: given twice")
        out[key] = value
    return out


def _no_constant(name: str) -> float:
    """JSON's non-standard NaN and Infinity, refused: no model size is one."""
    raise ValueError(f"{name} is not a number a model size can be")


def model_from_hf(path: str | Path) -> ModelSpec:
    """The transformer a Hugging Face config describes."""
    file = Path(path)
    try:
        text = read_text(file, "Hugging Face config")
    except ScenarioError as error:
        raise HfConfigError(str(error)) from None
    try:
        config = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except json.JSONDecodeError as error:
        raise HfConfigError(f"{path}: not JSON (line {error.lineno})") from None
    except ValueError as error:  # a key given twice, NaN or Infinity
        raise HfConfigError(f"{path}: {error}") from None
    if not isinstance(config, dict):
        raise HfConfigError(f"{path}: must be a JSON object")
    where = str(path)
    shape = {k: _first(config, names, where) for k, names in _KEYS.items()}
    mlp = _mlp(config, where)
    ffn = _optional(config, ("intermediate_size", "n_inner"), where) or 4 * shape["hidden"]
    values = {
        **shape, "kv_heads": _optional(config, ("num_key_value_heads",), where) or shape["heads"],
        "ffn_hidden": ffn, "mlp": mlp,
        # the classes' defaults: Llama's family unties, GPT-2's and Gemma's tie
        "tied_embeddings": _flag(config, "tie_word_embeddings", mlp is not Mlp.SWIGLU, where),
        **_experts(config, ffn, where), **_attention(config, shape["layers"], where),
        **_mtp(config, where)}
    model_type = _text(config, "model_type", where)
    name = config.get("_name_or_path") or model_type or file.parent.name
    return ModelSpec(name=str(name), **_checked(values, config, where),
                     learned_positions=model_type in ("gpt2", "gpt_bigcode", "opt"))


def _checked(values: dict, config: dict, where: str) -> dict:
    """``values`` through the checks the same keys have inline (``ModelSpec``'s
    settings: bounds, types), an error naming the config key each came from."""
    for key, value in values.items():
        if value is None:  # not given (MLA's queries without a latent)
            continue
        name = next((n for n in _FROM.get(key, (key,)) if config.get(n) is not None), key)
        try:
            SCHEMA[key][0](f"{where}: {name}", value.value if isinstance(value, Enum) else value)
        except ScenarioError as error:
            raise HfConfigError(str(error)) from None
    return values


def _mlp(config: dict, where: str) -> Mlp:
    """The MLP: a gated activation (silu/swish, as in Llama) gives SwiGLU; Gemma's
    models (``model_type: gemma*``, GELU-tanh) GeGLU, the same shapes with a
    GELU gate; anything else a plain GELU-style MLP."""
    names = ("hidden_activation", "hidden_act", "activation_function")
    activation = next((config[n] for n in names if config.get(n) is not None), "gelu")
    if not isinstance(activation, str):
        name = next(n for n in names if config.get(n) is not None)
        raise HfConfigError(f"{where}: {name}: {activation!r} must be a string")
    if activation in ("silu", "swish", "swiglu"):
        return Mlp.SWIGLU
    gemma = (_text(config, "model_type", where) or "").startswith("gemma")
    return Mlp.GEGLU if gemma or activation == "geglu" else Mlp.GELU


def _text(config: dict, name: str, where: str) -> str | None:
    """A string key (None when absent)."""
    value = config.get(name)
    if value is not None and not isinstance(value, str):
        raise HfConfigError(f"{where}: {name}: {value!r} must be a string")
    return value


def _mla(config: dict, where: str) -> dict:
    """Multi-head latent attention (DeepSeek-V2/V3, Kimi K2: ``kv_lora_rank``
    given): its latent ranks and head parts under the config's names."""
    if config.get("kv_lora_rank") is None:
        return {}
    out = {"attention": "mla", "q_lora_rank": _optional(config, ("q_lora_rank",), where)}
    for key in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        out[key] = _first(config, (key,), where)
    return out


def _mtp(config: dict, where: str) -> dict:
    """Multi-token-prediction depths: ``num_nextn_predict_layers`` (DeepSeek-V3: 1;
    Kimi K2: 0)."""
    depths = _count(config, "num_nextn_predict_layers", where, "an integer >= 0")
    return {"mtp_layers": depths} if depths else {}


def _attention(config: dict, layers: int, where: str) -> dict:
    """Attention keys beyond the sizes: ``head_dim`` where it is not hidden / heads,
    and sliding windows (``sliding_window`` unless ``use_sliding_window`` is false;
    which layers keep full attention from ``layer_types`` or Gemma's
    ``sliding_window_pattern``)."""
    out = _mla(config, where)
    head = None if out else _optional(config, ("head_dim",), where)
    if head is not None and head * _first(config, ("num_attention_heads", "n_head"), where) \
            != config.get("hidden_size"):
        out["head_size"] = head
    window = _optional(config, ("sliding_window",), where)
    if window is None or not _flag(config, "use_sliding_window", True, where):
        return out
    out["sliding_window"] = window
    types = config.get("layer_types")
    if isinstance(types, list) and types:
        full = [n for n, kind in enumerate(types) if kind == "full_attention"]
        pattern = full[0] + 1 if full else 0
        if len(types) != layers or any((kind == "full_attention") != bool(
                pattern and (n + 1) % pattern == 0) for n, kind in enumerate(types)):
            raise HfConfigError(f"{where}: layer_types: full attention must come every k-th "
                                "layer (k = the first full layer's position); other patterns "
                                "are not modelled")
        out["sliding_window_pattern"] = pattern
    else:
        out["sliding_window_pattern"] = _count(config, "sliding_window_pattern", where)
    return out


def _experts(config: dict, ffn: int, where: str) -> dict:
    """The ModelSpec's mixture-of-experts keys a config gives ({} for a dense model)."""
    experts = _optional(config, ("num_local_experts", "num_experts", "n_routed_experts"), where)
    if experts is None:
        return {}
    width = _optional(config, ("moe_intermediate_size",), where) or ffn
    shared = _count(config, "n_shared_experts", where)  # 0: none
    shared_width = _optional(config, ("shared_expert_intermediate_size",), where)
    if shared_width:
        if shared_width % width:
            raise HfConfigError(f"{where}: shared_expert_intermediate_size: {shared_width} must "
                                f"be a multiple of moe_intermediate_size ({width})")
        shared = shared_width // width
    scoring = config.get("scoring_func", "softmax")
    if scoring not in ("softmax", "sigmoid"):
        raise HfConfigError(f"{where}: scoring_func: {scoring!r} is not one of: softmax, sigmoid")
    return {"experts": experts, "expert_ffn_hidden": width, "shared_experts": shared,
            "top_k": _first(config, ("num_experts_per_tok",), where),
            "moe_layer_freq": _optional(config, ("moe_layer_freq", "decoder_sparse_step"),
                                        where) or 1,
            "first_dense_layers": _count(config, "first_k_dense_replace", where),
            "router": scoring}


def _count(config: dict, name: str, where: str, what: str = "a non-negative integer") -> int:
    """A non-negative integer key (0 when absent or null; false is no integer)."""
    value = config.get(name)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise HfConfigError(f"{where}: {name}: {value!r} must be {what}")
    return value
