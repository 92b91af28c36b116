"""Mixture of experts: presets against their published sizes, FLOPs against the
closed form, the expert-parallel groups, the layout checks, and MoE layers end
to end (token all-to-alls, expert gradients over their replicas, memory, the
symmetry-reduced run equal to a full simulation)."""

from dataclasses import replace

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.config.scenario import from_dict
from tests.test_symmetry import assert_same_run
from workloads import kernels as K
from workloads.layout import Layout
from workloads.models import MODELS
from workloads.program import build_program, make_context, static_memory
from workloads.strategies import expert

MOE = {"layers": 4, "hidden": 256, "heads": 4, "kv_heads": 4, "ffn_hidden": 512,
       "vocab": 1024, "mlp": "swiglu", "tied_embeddings": False, "experts": 8, "top_k": 2,
       "expert_ffn_hidden": 128, "routing": "balanced"}


def exchanges(comms):
    """The token exchanges of a run's communication log (not the counts before them,
    ``expert.counts``)."""
    return comms[(comms["group"] == "ep") & comms["name"].isin([expert.DISPATCH,
                                                                 expert.COMBINE])]


def scenario(**parallelism) -> dict:
    return {"name": "moe-tiny", "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": 2},
            "model": dict(MOE), "training": {"seq_len": 128, "global_batch": 32,
                                             "micro_batch": 1},
            "parallelism": {"tp": 1, "pp": 1, "ep": 4, **parallelism}}


@pytest.mark.parametrize(("name", "published"), [
    ("mixtral-8x7b", 46.7e9),  # Jiang et al. 2024: 47B (46.7B) total
    ("mixtral-8x22b", 141e9),  # Mistral AI: 141B total
    ("qwen1.5-moe-a2.7b", 14.3e9),  # Qwen team: 14.3B total
    ("deepseek-v3-like", 671e9),  # DeepSeek-AI 2024: 671B total (MLA as MHA here)
    ("gpt-oss-120b", 116.8e9),  # OpenAI 2025 model card: 116.8B total
    ("qwen3-30b-a3b", 30.5e9),  # Qwen team 2025: 30.5B total
])
def test_presets_have_their_published_parameter_counts(name, published):
    assert K.parameter_count(MODELS[name], 4096) == pytest.approx(published, rel=0.01)


def test_moe_flops_count_each_tokens_top_k_experts():
    """Mixtral 8x7B: 6 FLOPs per token per active matmul parameter (attention,
    router, two of eight experts, logits) plus the attention scores, 12 s h per
    layer per token."""
    m, s = MODELS["mixtral-8x7b"], 4096
    attention = m.hidden * (m.hidden + 2 * m.kv_heads * m.head_dim) + m.hidden * m.hidden
    experts = m.top_k * 3 * m.hidden * m.expert_ffn
    active = m.layers * (attention + experts + m.hidden * m.experts) + m.vocab * m.hidden
    expected = 6 * s * active + 12 * s * s * m.hidden * m.layers
    assert K.model_flops(m, 1, s) == pytest.approx(expected, rel=1e-12)


def test_expert_groups_partition_a_stages_ranks():
    """tp 2 x dp 8, ep 4: each expert-parallel group is 4 consecutive ranks of the
    stage (Megatron-Core's order with etp 1), each expert-data-parallel group the
    4 ranks holding the same experts; together they cover every rank once."""
    raw = scenario(tp=2, dp=8, sequence_parallel=True, ep=4)
    raw["cluster"]["nodes"] = 2
    s = from_dict(raw)
    ctx = make_context(s.model, s.training, s.parallel)
    groups = expert.groups(ctx, Layout({"tp": 2, "cp": 1, "dp": 8, "pp": 1}))
    assert groups["ep"][:2] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert groups["edp"][0] == (0, 4, 8, 12)
    for dim in ("ep", "edp"):
        members = sorted(r for g in groups[dim] for r in g)
        assert members == list(range(16)) and all(len(g) == 4 for g in groups[dim])
    assert expert.expert_data_parallel(s.parallel) == 4


@pytest.mark.parametrize(("parallelism", "model", "match"), [
    (dict(ep=3, dp=16), {}, r"model.experts \(8\) must be divisible by parallelism.ep \(3\)"),
    (dict(tp=2, dp=8, ep=2), {}, "parallelism.sequence_parallel must be true"),
    (dict(etp=3, ep=1, dp=16), {}, r"model.expert_ffn_hidden \(128\) must be divisible by "
                                    r"parallelism.etp \(3\)"),
    (dict(ep=2, dp=16), {"experts": 0}, r"model.top_k: 2 needs a model with experts"),
    (dict(ep=4, dp=16, fsdp={"sharding": "hybrid_shard"}), {},
     "parallelism.fsdp.sharding: hybrid_shard is not modelled with experts"),
    (dict(ep=4, dp=16, fsdp={"no_sync": True}), {},
     "fsdp.no_sync: true .* needs fsdp.reshard_after_forward: false"),
    (dict(ep=4, dp=16, framework="deepspeed"), {},
     "parallelism.framework: 'deepspeed' with experts is not modelled"),
    (dict(ep=4, dp=16), {"top_k": 9}, r"model.top_k \(9\) must be at most"),
])
def test_bad_expert_layouts_name_the_key(parallelism, model, match):
    raw = scenario(**parallelism)
    raw["model"].update(model)
    with pytest.raises(ScenarioError, match=match):
        from_dict(raw)


def test_a_moe_layer_exchanges_tokens_and_reduces_experts_over_their_replicas():
    result = run(scenario(dp=16, ep=4, zero=1))
    comms = result.comms
    a2a = exchanges(comms)
    # every rank routes its 128 tokens' 2 copies of 256 bf16 elements, both ways
    assert set(a2a["bytes"]) == {128 * 2 * 256 * 2}
    assert set(a2a["collective"]) == {"all_to_all"}
    micro = 32 // 16
    assert len(a2a) == 4 * micro * 2 * 2 * 4  # layers x micro-batches x 2 calls x F/B x groups
    edp = comms[comms["group"] == "edp"]
    local_experts = 8 // 4 * 3 * 256 * 128  # per layer: 2 local experts of 3 matrices
    # 4 layers x 4 replica groups: fp32 gradients reduce-scattered (Megatron's default
    # with bf16), then bf16 parameters all-gathered
    assert edp["bytes"].sum() == pytest.approx(4 * 4 * local_experts * (4 + 2), rel=1e-9)


def test_expert_states_are_sharded_over_their_replicas():
    s = from_dict(scenario(dp=16, ep=4, zero=1))
    ctx = make_context(s.model, s.training, s.parallel)
    states = static_memory(ctx, 0)
    experts = 4 * 2 * 3 * 256 * 128  # 4 layers of 2 local experts
    everything = K.parameter_count(s.model, 128)
    dense = everything - 4 * 8 * 3 * 256 * 128
    assert states["parameters"] == pytest.approx(2 * (dense + experts))
    assert states["optimizer_states"] == pytest.approx(12 * (dense / 16 + experts / 4))


def test_the_moe_layers_activations_replace_the_dense_mlps():
    """One MoE layer keeps the attention block's 15 s b h (of Korthikanti's 34) plus
    its routed copies' expert inputs, GEMM outputs and activations, and the router's
    fp32 probabilities."""
    s = from_dict(scenario(dp=16, ep=4))
    ctx = make_context(s.model, s.training, s.parallel)
    from workloads.stage_memory import layer_memory
    t, h, f = 128, 256, 128
    expected = t * h * 15 + 2 * t * 2 * (h + 2 * f + f) + 4 * t * 8
    assert layer_memory(ctx, 0)[0] == pytest.approx(expected + 0.0)


@pytest.mark.parametrize("parallelism", [dict(dp=16, ep=4, zero=1),
                                         dict(tp=2, dp=4, pp=2, ep=8, sequence_parallel=True),
                                         dict(dp=8, pp=2, ep=2, schedule="interleaved",
                                              virtual_stages=2)])
def test_moe_runs_by_symmetry_equal_a_full_simulation(parallelism):
    raw = scenario(**parallelism)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))


def test_a_dense_model_keeps_its_program():
    """No expert keys: the same ops as before experts existed (no ep group)."""
    from simulator.config.model import MOE_ONLY
    raw = scenario(dp=16)
    raw["parallelism"].pop("ep")
    raw["model"] = {k: v for k, v in raw["model"].items()
                    if k not in (*MOE_ONLY, "experts", "expert_ffn_hidden")}
    s = from_dict(raw)
    program = build_program(s.model, s.training, s.parallel)
    assert "ep" not in program.groups and "edp" not in program.groups


def test_routing_draws_are_seeded_and_skew_raises_the_imbalance():
    from workloads.models import ModelSpec
    from workloads.routing import draw
    base = ModelSpec("m", 4, 256, 4, 4, 512, 1024, experts=64, top_k=8, routing="uniform")
    uniform = draw(base, 8, 4096 * 8, 16, seed=3)
    again, other = draw(base, 8, 4096 * 8, 16, seed=3), draw(base, 8, 4096 * 8, 16, seed=4)
    assert all((a == b).all() for a, b in zip(uniform.scale.values(), again.scale.values(),
                                              strict=True))
    assert any((a != b).any() for a, b in zip(uniform.scale.values(), other.scale.values(),
                                              strict=True))
    skewed = draw(replace(base, routing="zipf", routing_skew=1.2), 8, 4096 * 8, 16, seed=3)
    assert 1.0 < uniform.imbalance < 1.05 < skewed.imbalance
    assert skewed.expert_imbalance > skewed.imbalance  # ranks average several experts
    balanced = draw(replace(base, routing="balanced"), 8, 4096 * 8, 16, seed=3)
    assert balanced.imbalance == 1.0 and not balanced.varies and uniform.varies
    capped = draw(replace(base, routing="zipf", routing_skew=1.2, capacity_factor=1.0), 8,
                  4096 * 8, 16, seed=3)
    assert capped.dropped > 0.1 and max(v.max() for v in capped.scale.values()) <= 1.0


def test_an_imbalanced_moe_layer_runs_at_its_most_loaded_ranks_pace():
    """Zipf routing: slower than balanced, the all-to-alls larger where a rank
    receives more than it sends, the summary says what routing came to, and the
    symmetry-reduced run still equals a full simulation."""
    raw = scenario(dp=16, ep=4)
    balanced = run(raw)
    raw["model"].update(routing="zipf", routing_skew=1.5)
    skewed = run(raw)
    assert skewed.summary["iteration_time_s"] > balanced.summary["iteration_time_s"]
    assert skewed.summary["moe_rank_imbalance"] > 1.1
    assert balanced.summary["moe_rank_imbalance"] == 1.0
    a2a = exchanges(skewed.comms)
    assert a2a["bytes"].min() >= 128 * 2 * 256 * 2 < a2a["bytes"].max()
    assert_same_run(skewed, run({**raw, "simulation": {"symmetry": "full"}}))


@pytest.mark.parametrize(("preset", "config"), [
    ("mixtral-8x7b", {"model_type": "mixtral", "num_hidden_layers": 32, "hidden_size": 4096,
                      "num_attention_heads": 32, "num_key_value_heads": 8,
                      "intermediate_size": 14336, "vocab_size": 32000, "hidden_act": "silu",
                      "tie_word_embeddings": False, "num_local_experts": 8,
                      "num_experts_per_tok": 2}),
    ("qwen1.5-moe-a2.7b", {"model_type": "qwen2_moe", "num_hidden_layers": 24,
                           "hidden_size": 2048, "num_attention_heads": 16,
                           "num_key_value_heads": 16, "intermediate_size": 5632,
                           "vocab_size": 151936, "hidden_act": "silu",
                           "tie_word_embeddings": False, "num_experts": 60,
                           "num_experts_per_tok": 4, "moe_intermediate_size": 1408,
                           "shared_expert_intermediate_size": 5632,
                           "decoder_sparse_step": 1}),
    ("deepseek-v3-like", {"model_type": "deepseek_v3", "num_hidden_layers": 61,
                          "hidden_size": 7168, "num_attention_heads": 128,
                          "num_key_value_heads": 128, "intermediate_size": 18432,
                          "vocab_size": 129280, "hidden_act": "silu",
                          "tie_word_embeddings": False, "n_routed_experts": 256,
                          "n_shared_experts": 1, "num_experts_per_tok": 8,
                          "moe_intermediate_size": 2048, "first_k_dense_replace": 3,
                          "moe_layer_freq": 1, "scoring_func": "sigmoid"}),
    ("gpt-oss-120b", {"model_type": "gpt_oss", "num_hidden_layers": 36, "hidden_size": 2880,
                      "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 64,
                      "intermediate_size": 2880, "vocab_size": 201088, "hidden_act": "silu",
                      "tie_word_embeddings": False, "num_local_experts": 128,
                      "num_experts_per_tok": 4, "sliding_window": 128,
                      "layer_types": ["sliding_attention", "full_attention"] * 18}),
    ("qwen3-30b-a3b", {"model_type": "qwen3_moe", "num_hidden_layers": 48, "hidden_size": 2048,
                       "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                       "intermediate_size": 6144, "vocab_size": 151936, "hidden_act": "silu",
                       "tie_word_embeddings": False, "num_experts": 128,
                       "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                       "decoder_sparse_step": 1, "sliding_window": None,
                       "use_sliding_window": False}),
])
def test_hf_configs_of_moe_models_give_the_presets(tmp_path, preset, config):
    """The published config.json keys (values as in the models' files), head_dim and
    sliding windows (GPT-OSS's layer_types; Qwen3's use_sliding_window false) too."""
    import json

    from workloads.hf_config import model_from_hf
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    model = model_from_hf(path)
    assert replace(model, name=preset) == MODELS[preset]


def test_the_allgather_dispatcher_gathers_the_groups_tokens_and_scatters_the_outputs():
    """Megatron-Core's allgather dispatcher: per MoE layer and micro-batch an
    all-gather and a reduce-scatter of the EP group's 4 x 128 tokens, forward and
    backward; the same expert compute as all-to-all."""
    raw = scenario(dp=16, ep=4, moe_token_dispatcher_type="allgather")
    result = run(raw)
    ep = exchanges(result.comms)
    assert set(ep["bytes"]) == {4 * 128 * 256 * 2}
    counts = {k: v for k, v in ep["collective"].value_counts().items() if v}
    assert counts == {"all_gather": 4 * 2 * 2 * 4, "reduce_scatter": 4 * 2 * 2 * 4}
    assert_same_run(result, run({**raw, "simulation": {"symmetry": "full"}}))


def test_a_measured_histogram_sets_each_experts_share(tmp_path):
    """routing: histogram reads one weight per expert; a hot expert on one EP rank
    makes that rank the busiest by about its share; bad files name the key."""
    histogram = tmp_path / "loads.csv"
    histogram.write_text("# tokens per expert, measured\n8, 1, 1, 1, 1, 1, 1, 1\n")
    raw = scenario(dp=16, ep=4)
    raw["model"].update(routing="histogram", routing_histogram=str(histogram))
    result = run(raw)
    # rank 0 holds experts 0-1: 9 of 15 shares against 15 / 4 on average
    assert result.summary["moe_rank_imbalance"] == pytest.approx(9 / 15 * 4, rel=0.05)
    histogram.write_text("1, 2, 3\n")
    with pytest.raises(ScenarioError, match=r"model.routing_histogram: .* line 1: must hold "
                                            r"one non-negative number per expert \(8\)"):
        from_dict(raw)
    raw["model"].pop("routing_histogram")
    with pytest.raises(ScenarioError, match="model.routing: 'histogram' needs "
                                            "model.routing_histogram"):
        from_dict(raw)


def test_sliding_window_layers_attend_over_their_window_and_heads_keep_their_size():
    """GPT-OSS: 64 heads of 64 (wider than hidden / heads), full attention every
    other layer, 128 keys elsewhere: the attention core's FLOPs are 4 t w (heads x
    head size), the output projection reads heads x head size."""
    m, s = MODELS["gpt-oss-120b"], 4096
    full = K.layer_kernels(m, 1, s, 2, layer=1)
    window = K.layer_kernels(m, 1, s, 2, layer=0)
    attention = {k.name: k for k in full}["attention"]
    assert attention.flops == 4.0 * s * s * 64 * 64
    assert {k.name: k for k in window}["attention"].flops == 4.0 * s * 128 * 64 * 64
    assert {k.name: k for k in full}["proj"].shape == (s, 2880, 64 * 64)


@pytest.mark.parametrize(("training", "parallelism", "match"), [
    ({"flash_attention": False}, {"dp": 16}, "model.sliding_window needs training.flash_"),
    ({}, {"cp": 2, "dp": 8}, "model.sliding_window with parallelism.cp > 1 is not modelled"),
])
def test_sliding_windows_name_what_they_need(training, parallelism, match):
    raw = scenario(ep=4, **parallelism)
    raw["model"].update(sliding_window=64, sliding_window_pattern=2)
    raw["training"].update(training)
    with pytest.raises(ScenarioError, match=match):
        from_dict(raw)


def test_expert_tensor_parallelism_splits_each_expert_and_gathers_its_tokens():
    """etp 2 x ep 4 of 16 ranks: each rank holds half of each of its 2 experts,
    runs its etp pair's token copies (all-gathered after the dispatch,
    reduce-scattered before the combine, on the ep stream), with the same expert
    FLOPs per rank as etp 1; the run equals a full simulation."""
    raw = scenario(dp=16, ep=4, etp=2)
    s = from_dict(raw)
    ctx = make_context(s.model, s.training, s.parallel)
    groups = expert.groups(ctx, Layout({"tp": 1, "cp": 1, "dp": 16, "pp": 1}))
    assert groups["etp"][0] == (0, 1) and groups["ep"][0] == (0, 2, 4, 6)
    assert groups["edp"][0] == (0, 8)
    one = {k.name: k for k in K.moe_kernels(s.model, ctx.shard, 4, 1)}
    two = {k.name: k for k in K.moe_kernels(s.model, ctx.shard, 4, 2)}
    assert two["experts_fc1"].flops == one["experts_fc1"].flops
    assert two["experts_fc1"].params * 2 == one["experts_fc1"].params
    result = run(raw)
    etp = result.comms[result.comms["group"] == "etp"]
    assert set(etp["bytes"]) == {128 * 2 * 2 * 256 * 2}  # two ranks' copies
    assert {k for k, v in etp["collective"].value_counts().items() if v} == {
        "all_gather", "reduce_scatter"}
    assert_same_run(result, run({**raw, "simulation": {"symmetry": "full"}}))


def fsdp_scenario(**fsdp) -> dict:
    return scenario(dp=16, ep=4, framework="pytorch", fsdp=fsdp)


def test_fsdp_gathers_dense_parameters_over_dp_and_experts_over_their_replicas():
    """FSDP with experts (Megatron-FSDP, AutoModel's FSDP2): a MoE layer is two
    units, its dense parameters sharded over the 16 data-parallel ranks, its 2
    local experts over their 4 replicas; each gathered before the layer's forward
    and again before its backward, each reduce-scattered after every backward
    (FSDP without a pipeline syncs every micro-batch)."""
    raw = fsdp_scenario()
    result = run(raw)
    s = from_dict(raw)
    ctx = make_context(s.model, s.training, s.parallel)
    dense, experts = ctx.moe_params
    assert experts == 2 * 3 * 256 * 128
    comms, micro, layers = result.comms, 2, 4
    edp = comms[comms["group"] == "edp"]
    gathers = edp[edp["collective"] == "all_gather"]
    scatters = edp[edp["collective"] == "reduce_scatter"]
    assert set(gathers["bytes"]) == {2 * experts}
    assert set(scatters["bytes"]) == {2 * experts}  # bf16: PyTorch reduces in param dtype
    assert len(gathers) == layers * micro * 2 * 4  # forward and backward, 4 replica groups
    assert len(scatters) == layers * micro * 4
    dp = comms[(comms["group"] == "dp") & (comms["bytes"] == 2 * dense)
               & (comms["collective"] == "all_gather")]
    assert len(dp) == layers * micro * 2  # the other dp calls: the embedding and the head
    states = static_memory(ctx, 0)
    assert states["parameters"] == pytest.approx(
        2 * (K.parameter_count(s.model, 128) - 4 * 4 * experts) / 16 + 2 * 4 * experts / 4)
    assert_same_run(result, run({**raw, "simulation": {"symmetry": "full"}}))


def test_fsdp_no_sync_gathers_once_and_reduces_after_the_last_micro_batch():
    """``fsdp.no_sync`` (AutoModel's deferred sync and resharding): each unit
    gathered by the first micro-batch's forward only, reduce-scattered after the
    last backward only, the gradients held unsharded meanwhile."""
    raw = fsdp_scenario(reshard_after_forward=False, no_sync=True)
    result = run(raw)
    spans = result.spans_of([0])
    for kind, micro_batch in (("all_gather", 0), ("reduce_scatter", 1)):
        calls = spans[(spans["stream"] == "dp") & (spans["name"] == kind)]
        assert len(calls) == 4 * 2 + 1  # 4 layers' dense and expert units, embedding/head
        assert set(calls["microbatch"]) == {micro_batch}
    s = from_dict(raw)
    ctx = make_context(s.model, s.training, s.parallel)
    gradients = static_memory(ctx, 0)["gradients"]
    local = ctx.moe_params[1]  # a layer's 2 local experts, of the 8
    assert gradients == pytest.approx(2 * (K.parameter_count(s.model, 128) - 4 * 4 * local
                                           + 4 * local))
    assert_same_run(result, run({**raw, "simulation": {"symmetry": "full"}}))


@pytest.mark.parametrize(("routing", "ranks"), [
    ("round_robin", 1.0),  # token i's experts 2i and 2i + 1 share a rank
    ("balanced", 4 * (1 - 15 / 28)),  # 2 of 8 experts: no hit on a rank of 2: C(6,2)/C(8,2)
])
def test_the_flex_dispatcher_sends_a_token_once_per_rank_holding_its_experts(routing, ranks):
    raw = scenario(dp=16, ep=4, moe_token_dispatcher_type="flex")
    raw["model"]["routing"] = routing
    ep = run(raw).comms
    ep = exchanges(ep)
    # DeepEP's own kernels (Megatron-Core's default backend), a forward's dispatch
    # and a backward's combine alike
    assert set(ep["collective"]) == {"deepep_dispatch", "deepep_combine"}
    assert ep["bytes"].iloc[0] == pytest.approx(128 * ranks * 256 * 2)


def test_the_summary_prices_the_imbalance_as_the_time_it_adds():
    """``moe_imbalance_s``: the expert kernels' and all-to-alls' time beyond the mean
    load, about what the run loses against balanced routing (Mixtral-shaped layers,
    whose expert GEMMs take time in proportion to their tokens)."""
    def one(routing):
        raw = {"name": "moe-skew", "seed": 0, "cluster": {"preset": "dgx-h100", "nodes": 2},
               "model": {"preset": "mixtral-8x7b", "layers": 4, "routing": routing,
                         "routing_skew": 0.6},
               "training": {"seq_len": 4096, "global_batch": 16, "micro_batch": 1,
                            "recompute": "full"},
               "parallelism": {"dp": 16, "ep": 8, "zero": 1}}
        return run(raw).summary
    skewed, balanced = one("zipf"), one("balanced")
    assert balanced["moe_imbalance_s"] == 0.0
    lost = skewed["iteration_time_s"] - balanced["iteration_time_s"]
    assert lost > 0.1 * balanced["iteration_time_s"]
    assert skewed["moe_imbalance_s"] == pytest.approx(lost, rel=0.05)
