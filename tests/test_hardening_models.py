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
from hypothesis import given
from hypothesis import strategies as st

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.cli import main
from simulator.compute.model import ComputeModel
from simulator.config.scenario import from_dict
from tests.test_hardening import _DELETE, FUZZ, VALUES, _bounded, _without_notes, one_error

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
    raw["training"].update({"precision": "fp8", "fp8_attention": True, **training})
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
    usable = "cudnn" if preset == "dgx-b200" else "cudnn or flash3"  # (flash3: Hopper only)
    assert str(error.value) == (f"{NO_FP8_PATH} (training.attention_kernel: {usable}), "
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


# -- item 12: a Hugging Face config through the checks inline keys have --------------

SMALL_HF = {"model_type": "llama", "num_hidden_layers": 2, "hidden_size": 256,
            "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 512,
            "vocab_size": 1024, "hidden_act": "silu", "tie_word_embeddings": False}
SMALL_MOE = {**SMALL_HF, "n_routed_experts": 8, "num_experts_per_tok": 2,
             "moe_intermediate_size": 128}


def _run_hf(tmp_path, config: dict, *sets: str) -> int:
    args = ["run", QUICKSTART, "--set", "model.preset=null", "--set",
            f"model.hf_config={_hf(tmp_path, config)}", "--set", "cluster.nodes=1",
            "--set", "cluster.gpus_per_node=1", "--set", "parallelism.dp=1",
            "--set", "training.global_batch=1", "--set", "training.seq_len=128",
            "--set", "cluster.compute_jitter=0", "--json", "--out", str(tmp_path / "r")]
    for assignment in sets:
        args += ["--set", assignment]
    return main(args)


@pytest.mark.parametrize(("config", "message"), [
    ({**SMALL_MOE, "n_routed_experts": 100_000},
     "n_routed_experts: 100000 must be an integer from 0 to 65,536"),
    ({**SMALL_MOE, "n_routed_experts": 10**9}, "n_routed_experts: 1000000000 must be an integer"),
    ({**SMALL_MOE, "num_local_experts": 4},
     "num_local_experts: 4 and n_routed_experts: 8 disagree; give one"),
    ({**SMALL_HF, "num_nextn_predict_layers": False},
     "num_nextn_predict_layers: False must be an integer >= 0"),
    ({**SMALL_MOE, "first_k_dense_replace": False},
     "first_k_dense_replace: False must be a non-negative integer"),
    ({**SMALL_HF, "num_hidden_layers": 2, "n_layer": 3},
     "num_hidden_layers: 2 and n_layer: 3 disagree; give one"),
    ({**SMALL_HF, "use_sliding_window": "no", "sliding_window": 64},
     "use_sliding_window: 'no' must be true or false"),
    ({**SMALL_HF, "model_type": ["gemma"]}, "model_type: ['gemma'] must be a string"),
])
def test_a_hf_config_is_checked_as_inline_keys_are(tmp_path, capsys, config, message):
    err = one_error(capsys, _run_hf(tmp_path, config))
    assert err.startswith("error: model.hf_config: ") and message in err, err


def test_no_shared_experts_is_zero_shared_experts(tmp_path, capsys):
    from workloads.hf_config import model_from_hf
    model = model_from_hf(_hf(tmp_path, {**SMALL_MOE, "n_shared_experts": 0}))
    assert model.experts == 8 and model.shared_experts == 0
    assert _run_hf(tmp_path, {**SMALL_MOE, "n_shared_experts": 0}) == 0, capsys.readouterr().err


GEMMA_2B = {  # google/gemma-2b's config.json
    "architectures": ["GemmaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 2, "eos_token_id": 1, "head_dim": 256, "hidden_act": "gelu",
    "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 2048,
    "initializer_range": 0.02, "intermediate_size": 16384, "max_position_embeddings": 8192,
    "model_type": "gemma", "num_attention_heads": 8, "num_hidden_layers": 18,
    "num_key_value_heads": 1, "pad_token_id": 0, "rms_norm_eps": 1e-06, "rope_scaling": None,
    "rope_theta": 10000.0, "torch_dtype": "bfloat16", "transformers_version": "4.38.0.dev0",
    "use_cache": True, "vocab_size": 256000}
GEMMA_7B = {**GEMMA_2B, "hidden_size": 3072, "num_attention_heads": 16,
            "num_hidden_layers": 28, "num_key_value_heads": 16, "intermediate_size": 24576}


@pytest.mark.parametrize(("config", "published"), [
    (GEMMA_2B, 2.51e9),  # Gemma Team 2024 (arXiv 2403.08295), Table 2: 2.51 B with embeddings
    (GEMMA_7B, 8.54e9),  # ... 8.54 B
    ({**GEMMA_2B, "hidden_act": "gelu_pytorch_tanh"}, 2.51e9),
    ({**{k: v for k, v in GEMMA_2B.items() if k != "hidden_activation"}}, 2.51e9),
])
def test_gemma_configs_read_a_gated_gelu_mlp(tmp_path, config, published):
    from workloads import kernels as K
    from workloads.hf_config import model_from_hf
    from workloads.models import Mlp
    model = model_from_hf(_hf(tmp_path, config))
    assert model.mlp is Mlp.GEGLU and model.tied_embeddings and not model.bias
    assert K.parameter_count(model, 2048) == pytest.approx(published, rel=0.005)


def test_a_gated_gelu_has_the_shapes_of_a_swiglu():
    from dataclasses import replace

    from workloads import kernels as K
    from workloads.models import MODELS, Mlp
    llama = MODELS["llama2-7b"]
    geglu = replace(llama, mlp=Mlp.GEGLU)
    assert [(k.name, k.flops, k.bytes, k.params) for k in K.layer_kernels(geglu, 1, 512)] == \
        [(k.name, k.flops, k.bytes, k.params) for k in K.layer_kernels(llama, 1, 512)]
    assert from_dict(scenario(mlp="geglu")).model.mlp is Mlp.GEGLU


HF_KEYS = ["num_hidden_layers", "n_layer", "num_layers", "hidden_size", "n_embd", "d_model",
           "num_attention_heads", "n_head", "vocab_size", "num_key_value_heads",
           "intermediate_size", "n_inner", "hidden_act", "hidden_activation",
           "activation_function", "tie_word_embeddings", "model_type", "_name_or_path",
           "num_local_experts", "num_experts", "n_routed_experts", "moe_intermediate_size",
           "n_shared_experts", "shared_expert_intermediate_size", "num_experts_per_tok",
           "moe_layer_freq", "decoder_sparse_step", "first_k_dense_replace", "scoring_func",
           "head_dim", "sliding_window", "use_sliding_window", "layer_types",
           "sliding_window_pattern", "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim",
           "qk_rope_head_dim", "v_head_dim", "num_nextn_predict_layers"]
HF_VALUES = st.one_of(
    VALUES, st.sampled_from(["gelu_pytorch_tanh", "silu", "gelu", "gemma", "gemma2", "llama",
                             "sigmoid", "softmax", "deepseek_v3", "mla"]),
    st.lists(st.sampled_from(["sliding_attention", "full_attention"]), max_size=3))
SMALL_MLA = {**SMALL_MOE, "kv_lora_rank": 64, "q_lora_rank": 32, "qk_nope_head_dim": 32,
             "qk_rope_head_dim": 16, "v_head_dim": 32, "num_nextn_predict_layers": 1}
SMALL_WINDOW = {**SMALL_HF, "sliding_window": 64,
                "layer_types": ["sliding_attention", "full_attention"]}


@FUZZ
@given(st.sampled_from([SMALL_HF, SMALL_MOE, SMALL_MLA, SMALL_WINDOW, GEMMA_2B]),
       st.lists(st.tuples(st.sampled_from(HF_KEYS), st.one_of(HF_VALUES, st.just(_DELETE))),
                min_size=1, max_size=4))
def test_fuzzed_hf_configs_end_in_a_result_or_one_line(tmp_path, capsys, base, edits):
    config = {**base, "num_hidden_layers": 2}  # (Gemma's shape, two layers of it)
    for key, value in edits:
        if value is _DELETE:
            config.pop(key, None)
        else:
            config[key] = value
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    code = _bounded(["run", QUICKSTART, "--set", "model.preset=null", "--set",
                     f"model.hf_config={path}", "--set", "cluster.nodes=1", "--set",
                     "cluster.gpus_per_node=1", "--set", "parallelism.dp=1", "--set",
                     "training.global_batch=1", "--set", "training.seq_len=128",
                     "--out", str(tmp_path / "out")])
    err = _without_notes(capsys.readouterr().err)
    assert code in (0, 2), (edits, err)
    assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)


# -- item 18, parts: FP8 parameter gathers, the combined 1F1B, MFU's attention ---------

def test_fp8_parameter_gathers_need_sharded_parameters():
    raw = _fp8(fp8_attention=False, fp8_param_gather=True, global_batch=2)
    raw["cluster"]["gpus_per_node"] = 2
    raw["parallelism"] = {"dp": 2, "zero": 0}
    with pytest.raises(ScenarioError) as error:
        from_dict(raw)
    assert str(error.value).startswith(
        "training.fp8_param_gather: True needs the distributed optimizer (parallelism.zero "
        ">= 1) or FSDP (parallelism.fsdp)"), error.value
    for parallelism in ({"dp": 2, "zero": 1}, {"dp": 2, "fsdp": {}}):
        raw["parallelism"] = parallelism
        assert from_dict(raw).training.fp8_param_gather


def test_the_combined_1f1b_needs_two_micro_batches_per_rank():
    raw = scenario(experts=4, top_k=2)
    raw["cluster"]["gpus_per_node"] = 2
    raw["training"]["seq_len"] = 128
    raw["parallelism"] = {"dp": 2, "ep": 2, "moe_overlap": "1f1b"}
    raw["training"]["global_batch"] = 2
    with pytest.raises(ScenarioError) as error:
        from_dict(raw)
    assert str(error.value).startswith("parallelism.moe_overlap: '1f1b' needs at least two "
                                       "micro-batches per rank"), error.value
    raw["training"]["global_batch"] = 4
    assert from_dict(raw).parallel.moe_overlap == "1f1b"


def test_mfu_says_its_attention_flops_are_the_full_square():
    from simulator.analysis.summary_keys import ROWS
    from workloads import kernels as K
    for text in (K.model_flops.__doc__, dict(ROWS)["`mfu`"]):
        assert "causal" in text and "s²" in " ".join(text.split()).replace("s^2", "s²"), text
