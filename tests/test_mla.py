"""Multi-head latent attention (issue 41, item 1): parameters against the
published counts, the projections' and attention's FLOPs against closed forms,
tensor-parallel splits, activation memory with and without the up-projection
recompute, and the Hugging Face config import."""

import json
from dataclasses import replace

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.config.scenario import from_dict
from workloads import kernels as K
from workloads.hf_config import model_from_hf
from workloads.models import MODELS

V3 = MODELS["deepseek-v3"]


def active(model) -> float:
    """Parameters one token uses: all but the routed experts it is not sent to."""
    routed = sum(k.params for layer in range(model.layers)
                 for k in K.layer_kernels(model, 1, 16, layer=layer) if K.is_expert(k))
    return K.parameter_count(model, 16) - routed * (1 - model.top_k / model.experts)


@pytest.mark.parametrize("name, total, used, tolerance", [
    ("deepseek-v3", 671e9, 37e9, 0.015),  # DeepSeek-AI 2024 (arXiv 2412.19437)
    ("kimi-k2", 1.04e12, 32e9, 0.03),  # Moonshot AI 2025 (arXiv 2507.20534)
])
def test_parameters_match_the_published_counts(name, total, used, tolerance):
    model = MODELS[name]
    assert K.parameter_count(model, 16) == pytest.approx(total, rel=tolerance)
    assert active(model) == pytest.approx(used, rel=tolerance)


def test_projection_flops_are_the_closed_form():
    """Per token: 2 (h q' + q' H d_qk + h (c + r) + c H (d_nope + d_v) + H d_v h)."""
    h, q, c, r, heads = 7168, 1536, 512, 64, 128
    closed = 2 * (h * q + q * heads * 192 + h * (c + r) + c * heads * 256 + heads * 128 * h)
    kernels = K.layer_kernels(V3, 1, 1)
    gemms = {"q_down", "q_up", "kv_down", "kv_up", "proj"}
    assert sum(k.flops for k in kernels if k.name in gemms) == closed


def test_attention_flops_use_the_query_and_value_widths():
    """QK^T over 192-wide heads and AV over 128-wide: 2 b s^2 H (192 + 128)."""
    seq = 4096
    attention = next(k for k in K.layer_kernels(V3, 1, seq) if k.name == "attention")
    assert attention.flops == 2 * seq * seq * 128 * (192 + 128)
    assert attention.shape[3] == 192  # the head size the attention tables are read at


def test_tensor_parallel_splits_the_up_projections_only():
    whole = {k.name: k for k in K.layer_kernels(V3, K.Shard(1, 1024))}
    split = {k.name: k for k in K.layer_kernels(V3, K.Shard(1, 1024, tp=4))}
    for name in ("q_up", "kv_up", "proj", "attention"):
        assert split[name].flops == pytest.approx(whole[name].flops / 4)
    for name in ("q_down", "kv_down"):  # duplicated on every tensor-parallel rank
        assert split[name].flops == whole[name].flops


def scenario(model: str = "deepseek-v3", **training) -> dict:
    return {"name": "mla", "cluster": {"preset": "dgx-h100", "nodes": 1},
            "model": {"preset": model, "layers": 2, "experts": 0},
            "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1, **training},
            "parallelism": {"tp": 8, "pp": 1, "sequence_parallel": True}}


def test_memory_and_the_up_projection_recompute():
    """The up-projection recompute frees each head's query, key and value:
    2 bytes x tokens x H (2 x 192 + 128) / tp per layer, and re-runs them."""
    plain = run(scenario()).summary
    again = run(scenario(recompute_modules=["mla_up_proj"])).summary
    freed = (plain["memory_gib"]["activations"] - again["memory_gib"]["activations"]) * 2**30
    assert freed == pytest.approx(2 * 2 * 2048 * 128 * (2 * 192 + 128) / 8)
    assert again["iteration_time_s"] > plain["iteration_time_s"]
    like = run(scenario("deepseek-v3-like")).summary  # standard attention, 56-wide heads
    assert plain["memory_gib"]["activations"] > like["memory_gib"]["activations"]


def test_up_projection_recompute_needs_mla():
    with pytest.raises(ScenarioError, match="'mla_up_proj' needs model.attention: mla "
                                            r"\(it is standard\)"):
        from_dict(scenario("deepseek-v3-like", recompute_modules=["mla_up_proj"]))


def test_hf_config_import(tmp_path):
    """DeepSeek-V3's config.json keys give the preset's model."""
    config = {"model_type": "deepseek_v3", "num_hidden_layers": 61, "hidden_size": 7168,
              "num_attention_heads": 128, "num_key_value_heads": 128,
              "intermediate_size": 18432, "moe_intermediate_size": 2048,
              "n_routed_experts": 256, "n_shared_experts": 1, "num_experts_per_tok": 8,
              "first_k_dense_replace": 3, "moe_layer_freq": 1, "scoring_func": "sigmoid",
              "vocab_size": 129280, "hidden_act": "silu", "tie_word_embeddings": False,
              "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
              "qk_rope_head_dim": 64, "v_head_dim": 128, "num_nextn_predict_layers": 1}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = model_from_hf(path)
    assert model.mla and model.q_lora_rank == 1536 and model.head_dim == 192
    assert model.mtp_layers == 1
    assert K.parameter_count(replace(model, mtp_layers=0), 16) == K.parameter_count(V3, 16)
