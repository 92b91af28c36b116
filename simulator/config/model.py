"""The ``model`` section: a preset, a Hugging Face config.json, or every size
inline; each key checked by ``ModelSpec``'s settings."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from simulator.base.fields import ScenarioError, choice, fail, schema_of, section, setting, text
from simulator.base.user_files import read_text, user_path
from workloads.hf_config import HfConfigError, model_from_hf
from workloads.models import KINDS, MODELS, MOE_ONLY, Mlp, ModelSpec  # noqa: F401 - MOE_ONLY


@dataclass(frozen=True)
class ModelSection:
    """The ``model`` section's own keys, beside ``ModelSpec``'s settings (which
    override the preset's or the HF config's)."""

    preset: str | None = setting(choice(MODELS), None)  # a named model (clustersim presets)
    # a Hugging Face config.json (Llama, Mistral, Mixtral, Qwen, DeepSeek, GPT-OSS, ...)
    hf_config: str | None = setting(text, None)
    # routing: histogram's expert shares: a CSV of one row per MoE layer (or one for all)
    routing_histogram: str | None = setting(text, None)


SCHEMA = {
    **schema_of(ModelSection),
    **{key: (check, None) for key, (check, _) in schema_of(ModelSpec).items()},
}


def model_from(raw: object, base_dir: Path | None = None) -> ModelSpec:
    """Check a ``model:`` section and build its ModelSpec."""
    return _model(section("model", raw, SCHEMA), base_dir)


def _model(values: dict[str, Any], base_dir: Path | None = None) -> ModelSpec:
    inline = {k: v for k, v in values.items() if k not in ("preset", "hf_config",
                                                           "routing_histogram") and v is not None}
    if values["preset"] is not None and values["hf_config"] is not None:
        raise fail("model.hf_config", values["hf_config"], "cannot be combined with "
                                                            "model.preset; give one")
    if values["hf_config"] is not None:
        path = user_path(values["hf_config"], base_dir)
        try:
            base = dataclasses.asdict(model_from_hf(path))
        except HfConfigError as error:
            raise ScenarioError(f"model.hf_config: {error}") from None
    elif values["preset"] is not None:
        base = dataclasses.asdict(MODELS[values["preset"]])
    else:
        missing = [k for k in ("layers", "hidden", "heads", "vocab") if k not in inline]
        if missing:
            raise ScenarioError(f"model.{missing[0]}: missing; give model.preset "
                                f"(one of {', '.join(MODELS)}) or layers, hidden, heads, vocab")
        base = {"name": "custom", "ffn_hidden": 4 * inline["hidden"],
                "kv_heads": inline["heads"]}
    if "heads" in inline and "kv_heads" not in inline and base["kv_heads"] == base.get("heads"):
        base["kv_heads"] = inline["heads"]  # multi-head attention stays multi-head
    base.update(inline)
    base["mlp"] = Mlp(base.get("mlp", Mlp.GELU))
    _experts(base, inline, values["routing_histogram"])
    _histogram(base, values["routing_histogram"], base_dir)
    if base.get("head_size") is None and base["hidden"] % base["heads"]:
        raise fail("model.heads", base["heads"], f"must divide model.hidden ({base['hidden']}), "
                   "or give model.head_size")
    if base["heads"] % base["kv_heads"]:
        given = "" if "kv_heads" in inline else (
            f" (kv_heads {base['kv_heads']} comes from the {_origin(values)}; set model.kv_heads)")
        raise fail("model.kv_heads", base["kv_heads"],
                   f"must divide model.heads ({base['heads']}){given}")
    return ModelSpec(**base)


def _experts(base: dict[str, Any], inline: dict[str, Any], histogram: str | None) -> None:
    """Keys only another kind of model uses (``workloads.models.KINDS``) are
    refused; a router's histogram needs routed experts, and routed experts need
    a MoE layer."""
    spec = ModelSpec(**{**base, "routing_weights": None})
    for kind in KINDS:
        given = [k for k in kind.keys if k in inline]
        if given and not kind.of(spec):
            raise fail(f"model.{given[0]}", inline[given[0]], f"needs {kind.needs}")
    if not spec.experts:
        if histogram:
            raise fail("model.routing_histogram", histogram, f"needs {KINDS[0].needs}")
        return
    if not any(spec.is_moe_layer(n) for n in range(spec.layers)):
        raise fail("model.first_dense_layers", spec.first_dense_layers,
                   f"with moe_layer_freq {spec.moe_layer_freq} leaves no MoE layer among the "
                   f"{spec.layers} layers; give experts: 0 for a dense model")


def _histogram(base: dict[str, Any], written: str | None, base_dir: Path | None) -> None:
    """``model.routing_histogram`` read into ``routing_weights``: a text file of
    non-negative numbers, one row per MoE layer (or one row for all), one number
    per expert, separated by commas or spaces; it goes with ``routing: histogram``."""
    wants = base.get("routing") == "histogram"
    if written is None:
        if wants:
            raise fail("model.routing", "histogram", "needs model.routing_histogram: a file "
                                                     "of each expert's share of the tokens")
        return
    if not wants:
        raise fail("model.routing_histogram", written, "goes with model.routing: histogram")
    path = user_path(written, base_dir)
    rows = []
    for n, line in enumerate(read_text(path, "routing histogram").splitlines(), 1):
        cells = [c for c in line.replace(",", " ").split() if c]
        if not cells or cells[0].startswith("#"):
            continue
        try:
            row = tuple(float(c) for c in cells)
        except ValueError:
            raise fail("model.routing_histogram", written, f"line {n}: must hold numbers "
                       "only") from None
        experts = base.get("experts", 0)
        if len(row) != experts or any(not math.isfinite(v) or v < 0 for v in row) or \
                sum(row) <= 0:
            raise fail("model.routing_histogram", written, f"line {n}: must hold one "
                       f"non-negative number per expert ({experts}), not all zero")
        rows.append(row)
    if not rows:
        raise fail("model.routing_histogram", written, "holds no row of weights")
    spec = ModelSpec(**{**base, "routing_weights": None})
    layers = sum(spec.is_moe_layer(n) for n in range(spec.layers))
    if len(rows) not in (1, layers):
        raise fail("model.routing_histogram", written, f"holds {len(rows)} rows; give one row "
                   f"for every MoE layer or one per MoE layer ({layers})")
    base["routing_weights"] = tuple(rows)


def _origin(values: dict[str, Any]) -> str:
    """Where a model's unset keys come from, for errors."""
    if values["preset"] is not None:
        return f"preset {values['preset']}"
    return "Hugging Face config" if values["hf_config"] is not None else "default"
