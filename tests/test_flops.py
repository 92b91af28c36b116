"""FLOPs and parameters against closed forms (Narayanan et al. SC21; Kaplan 6N)."""

import pytest

from simulator.base.ir import KernelClass
from workloads.kernels import (
    backward_flops,
    head_kernels,
    layer_kernels,
    megatron_model_flops,
    model_flops,
    parameter_count,
)
from workloads.models import MODELS


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("gpt3")])
def test_layer_flops_are_6n_per_token_plus_attention(name):
    model = MODELS[name]
    b, s, h = 2, 2048, model.hidden
    forward = sum(k.flops for k in layer_kernels(model, b, s, 2))
    layer_params = 12 * h * h  # weight matrices of one GPT layer
    per_token_train = 3 * forward / (b * s)
    assert per_token_train == pytest.approx(6 * layer_params + 12 * s * h)


@pytest.mark.parametrize("name", [n for n in MODELS if n.startswith("gpt3")])
def test_model_flops_match_megatron_closed_form(name):
    model = MODELS[name]
    assert model_flops(model, 512, 2048) == pytest.approx(
        megatron_model_flops(model, 512, 2048), rel=1e-12)


@pytest.mark.parametrize(("name", "billions"), [
    ("gpt3-125m", 0.125), ("gpt3-1.3b", 1.3), ("gpt3-6.7b", 6.7), ("gpt3-13b", 13.0),
    ("gpt3-175b", 175.0), ("llama2-7b", 6.74), ("llama3-8b", 8.03),
])
def test_parameter_counts(name, billions):
    assert parameter_count(MODELS[name], 2048) / 1e9 == pytest.approx(billions, rel=0.04)


def test_swiglu_and_gqa_shapes():
    model = MODELS["llama3-8b"]
    kernels = {k.name: k for k in layer_kernels(model, 1, 4096, 2)}
    assert kernels["qkv"].shape == (4096, 4096 + 2 * 8 * 128, 4096)
    assert kernels["fc1"].shape == (4096, 2 * 14336, 4096)
    assert kernels["fc2"].shape == (4096, 4096, 14336)


def test_backward_costs_twice_forward_and_attention_recomputes():
    kernels = {k.name: k for k in layer_kernels(MODELS["gpt3-1.3b"], 1, 2048, 2)}
    assert backward_flops(kernels["fc1"]) == 2 * kernels["fc1"].flops
    assert kernels["attention"].cls is KernelClass.ATTENTION
    assert backward_flops(kernels["attention"]) == 2.5 * kernels["attention"].flops


def test_tied_logits_own_no_parameters():
    gpt = {k.name: k for k in head_kernels(MODELS["gpt3-1.3b"], 1, 2048, 2)}
    llama = {k.name: k for k in head_kernels(MODELS["llama2-7b"], 1, 2048, 2)}
    assert gpt["logits"].params == 0
    assert llama["logits"].params == 32000 * 4096


def test_megatron_table1_models_have_their_parameter_counts():
    from workloads.models import padded_vocab

    published = {"megatron-1.7b": 1.7, "megatron-3.6b": 3.6, "megatron-7.5b": 7.5,
                 "megatron-18.4b": 18.4, "megatron-39.1b": 39.1, "megatron-76.1b": 76.1,
                 "megatron-145.6b": 145.6, "megatron-310.1b": 310.1, "megatron-529.6b": 529.6,
                 "megatron-1t": 1008.0}
    for name, billions in published.items():
        m = MODELS[name]
        # the paper's count: P = 12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))
        p = 12 * m.layers * m.hidden**2 * (1 + 13 / (12 * m.hidden) + (51200 + 2048) / (
            12 * m.layers * m.hidden))
        assert p / 1e9 == pytest.approx(billions, rel=0.03)  # the paper rounds its labels
        assert parameter_count(m, 2048) == pytest.approx(p, rel=1e-3)
    assert padded_vocab(51200, 8) == 51200


def test_hf_config(tmp_path):
    import json

    from workloads.hf_config import HfConfigError, model_from_hf

    llama = {"model_type": "llama", "num_hidden_layers": 32, "hidden_size": 4096,
             "num_attention_heads": 32, "num_key_value_heads": 8, "intermediate_size": 14336,
             "vocab_size": 128256, "hidden_act": "silu", "tie_word_embeddings": False}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(llama))
    m = model_from_hf(path)
    assert (m.layers, m.kv_heads, m.ffn_hidden, m.mlp.value) == (32, 8, 14336, "swiglu")
    assert parameter_count(m, 2048) == parameter_count(MODELS["llama3-8b"], 2048)
    gpt2 = {"model_type": "gpt2", "n_layer": 12, "n_embd": 768, "n_head": 12,
            "vocab_size": 50257, "activation_function": "gelu_new"}
    path.write_text(json.dumps(gpt2))
    m = model_from_hf(path)
    assert (m.ffn_hidden, m.mlp.value, m.tied_embeddings, m.learned_positions) == (
        3072, "gelu", True, True)
    path.write_text(json.dumps({"hidden_size": 8}))
    with pytest.raises(HfConfigError, match="needs a positive integer num_hidden_layers"):
        model_from_hf(path)
