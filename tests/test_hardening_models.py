"""Model kinds, attention and Hugging Face configs under hostile input (issue 55,
items 2, 9, 11, 12 and part of 18): sliding windows on every kind of layer, one
rule for FP8 attention, one declaration of which keys each model kind takes, a
Hugging Face config through the checks inline keys have, and a fuzz test of
configs through the CLI."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.cli import main
from simulator.compute.model import ComputeModel
from simulator.config.scenario import from_dict
from tests.test_hardening import one_error

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "scripts/scenarios/quickstart.yaml")

DENSE = {"name": "dense-window", "seed": 0,
         "cluster": {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 1},
         "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1024,
                   "mlp": "swiglu"},
         "training": {"seq_len": 4096, "global_batch": 1, "micro_batch": 1},
         "parallelism": {"dp": 1}}


def scenario(base: dict = DENSE, **model) -> dict:
    raw = copy.deepcopy(base)
    raw["model"].update(model)
    return raw


def iteration(raw: dict) -> float:
    return run(raw).summary["iteration_time_s"]


# -- item 2: sliding windows on every kind of layer ----------------------------------

@pytest.mark.parametrize(("model", "window"), [
    ({}, {}),  # every layer dense
    ({"experts": 4, "top_k": 2, "first_dense_layers": 1}, {}),  # dense layers, then MoE
    ({}, {"sliding_window_pattern": 2}),  # dense, full attention every other layer
])
def test_sliding_windows_run_on_every_kind_of_layer(model, window):
    full = iteration(scenario(**model))
    windowed = iteration(scenario(sliding_window=128, **window, **model))
    assert windowed < full
    assert iteration(scenario(sliding_window=4096, **window, **model)) == pytest.approx(full)


MISTRAL_7B = {  # mistralai/Mistral-7B-v0.1's config.json
    "architectures": ["MistralForCausalLM"], "bos_token_id": 1, "eos_token_id": 2,
    "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 32768, "model_type": "mistral",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8,
    "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "sliding_window": 4096,
    "tie_word_embeddings": False, "torch_dtype": "bfloat16",
    "transformers_version": "4.34.0.dev0", "use_cache": True, "vocab_size": 32000}


def _hf(tmp_path, config: dict, name: str = "config.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return str(path)


def test_mistral_7b_config_runs_with_its_window(tmp_path):
    raw = copy.deepcopy(DENSE)
    raw["model"] = {"hf_config": _hf(tmp_path, MISTRAL_7B), "layers": 1}
    raw["training"]["seq_len"] = 8192
    windowed = iteration(raw)
    raw["model"]["sliding_window"] = 8192
    assert windowed < iteration(raw)


def test_a_window_on_the_quick_start_runs(tmp_path, capsys):
    code = main(["run", QUICKSTART, "--set", "model.sliding_window=128", "--set",
                 "model.layers=2", "--json", "--out", str(tmp_path / "r")])
    assert code == 0, capsys.readouterr().err


# -- item 9: FP8 attention only where the kernel has an FP8 path ---------------------

def _fp8(preset: str = "dgx-h100", **training) -> dict:
    raw = copy.deepcopy(DENSE)
    raw["cluster"]["preset"] = preset
    raw["training"].update(precision="fp8", fp8_attention=True, **training)
    return raw


NO_FP8_PATH = "training.fp8_attention: True needs fused attention with an FP8 path"


@pytest.mark.parametrize(("preset", "training", "kernel"), [
    ("dgx-h100", {"attention_kernel": "flash2"}, "flash2"),
    ("dgx-h100", {"attention_kernel": "triton"}, "triton"),
    ("dgx-h100", {"attention_kernel": "unfused"}, "unfused"),
    ("dgx-h100", {"flash_attention": False}, "unfused"),
    ("dgx-b200", {"attention_kernel": "flash2"}, "flash2"),
    ("dgx-b200", {"attention_kernel": "unfused"}, "unfused"),
    ("dgx-b200", {"flash_attention": False}, "unfused"),
])
def test_fp8_attention_needs_a_kernel_with_an_fp8_path(preset, training, kernel):
    with pytest.raises(ScenarioError) as error:
        from_dict(_fp8(preset, **training))
    gpu = from_dict(_fp8(preset)).gpu.name
    assert str(error.value) == (f"{NO_FP8_PATH} (training.attention_kernel: cudnn or flash3), "
                                f"not {kernel} on {gpu}")


@pytest.mark.parametrize(("preset", "training"), [
    ("dgx-h100", {}), ("dgx-h100", {"attention_kernel": "cudnn"}),
    ("dgx-h100", {"attention_kernel": "flash3"}), ("dgx-b200", {}),
    ("dgx-h100", {"attention_kernel": "auto"}),
])
def test_fp8_attention_runs_on_the_kernels_that_have_it(preset, training):
    assert from_dict(_fp8(preset, **training)).training.fp8_attention


def test_fp8_attention_under_another_framework_runs_transformer_engines_kernel():
    """PyTorch's auto kernel on Hopper is FlashAttention-2, which has no FP8 path:
    FP8 attention is Transformer Engine's, on cuDNN's kernel."""
    raw = _fp8()
    raw["parallelism"]["framework"] = "torchtitan"
    s = from_dict(raw)
    assert ComputeModel.for_training(s.gpu, s.training, "torchtitan").attention.kernel == "cudnn"
    s = from_dict({**raw, "training": {**raw["training"], "fp8_attention": False}})
    assert ComputeModel.for_training(s.gpu, s.training, "torchtitan").attention.kernel == "flash2"


# -- item 11: one declaration of the keys each kind of model takes -------------------

@pytest.mark.parametrize(("model", "message"), [
    ({"kv_lora_rank": 256}, "model.kv_lora_rank: 256 needs multi-head latent attention "
                            "(model.attention: mla)"),
    ({"q_lora_rank": 64}, "model.q_lora_rank: 64 needs multi-head latent attention"),
    ({"qk_nope_head_dim": 32}, "model.qk_nope_head_dim: 32 needs multi-head latent"),
    ({"qk_rope_head_dim": 32}, "model.qk_rope_head_dim: 32 needs multi-head latent"),
    ({"v_head_dim": 32}, "model.v_head_dim: 32 needs multi-head latent"),
    ({"attention": "mla", "head_size": 64}, "model.head_size: 64 needs standard attention "
                                            "(model.attention: standard)"),
    ({"attention": "mla", "kv_heads": 2}, "model.kv_heads: 2 needs standard attention"),
    ({"sliding_window_pattern": 2}, "model.sliding_window_pattern: 2 needs sliding-window "
                                    "attention (model.sliding_window)"),
    ({"top_k": 2}, "model.top_k: 2 needs a model with experts (model.experts > 0): a dense "
                   "model has no router"),
])
def test_keys_a_kind_of_model_does_not_use_are_refused(model, message):
    with pytest.raises(ScenarioError) as error:
        from_dict(scenario(**model))
    assert str(error.value).startswith(message), error.value


def test_keys_of_the_kind_given_are_taken():
    mla = from_dict(scenario(attention="mla", kv_lora_rank=128, q_lora_rank=64,
                             qk_nope_head_dim=32, qk_rope_head_dim=16, v_head_dim=32)).model
    assert (mla.kv_lora_rank, mla.q_lora_rank, mla.head_dim) == (128, 64, 48)
    assert from_dict(scenario(head_size=32, kv_heads=2)).model.head_dim == 32
    windowed = from_dict(scenario(sliding_window=64, sliding_window_pattern=2)).model
    assert windowed.is_sliding_layer(0) and not windowed.is_sliding_layer(1)


def test_the_kinds_declare_every_key_one_kind_alone_takes():
    """Every key that one kind of model alone uses is declared with its kind
    (``workloads.models.KINDS``), and each is a ModelSpec setting."""
    from simulator.base.fields import schema_of
    from workloads.models import KINDS, ModelSpec
    keys = [key for kind in KINDS for key in kind.keys]
    assert len(keys) == len(set(keys)) and set(keys) <= set(schema_of(ModelSpec))
    assert {"kv_lora_rank", "head_size", "top_k", "sliding_window_pattern"} <= set(keys)
