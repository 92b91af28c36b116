"""Every parallelism strategy end to end, against Megatron's communication
pattern, the schedules' memory and bubbles, and ZeRO's memory formulas."""

import copy

import pytest

from simulator import run
from simulator.config.scenario import ScenarioError, from_dict
from workloads.memory import Recompute, activation_bytes_per_layer

GIB = 2**30
TINY = {
    "name": "tiny",
    "seed": 0,
    "cluster": {"preset": "dgx-a100", "nodes": 2, "compute_jitter": 0.0},
    "model": {"layers": 8, "hidden": 512, "heads": 8, "vocab": 4096},
    "training": {"seq_len": 512, "global_batch": 32, "micro_batch": 1},
    "parallelism": {},
}


def reference(scenario: dict) -> dict:
    """``scenario`` simulated rank by rank: the reference the speed-ups must equal."""
    return {**scenario, "simulation": {"symmetry": "full"}}


def tiny(**parallelism):
    scenario = copy.deepcopy(TINY)
    for key, value in parallelism.items():
        section, _, name = key.rpartition("__")
        (scenario[section] if section else scenario["parallelism"])[name] = value
    return scenario


def comms_of(result, group):
    comms = result.comms
    return comms[comms["group"].str.startswith(group)]


STRATEGIES = [
    dict(tp=2, dp=8), dict(tp=4, dp=4, sequence_parallel=True), dict(cp=2, dp=8),
    dict(cp=2, tp=2, dp=4, sequence_parallel=True), dict(pp=2, dp=8),
    dict(pp=4, dp=4, schedule="gpipe"), dict(pp=2, dp=8, schedule="interleaved",
                                              virtual_stages=2),
    dict(pp=2, dp=8, stage_layers=[3, 5]), dict(zero=1), dict(zero=2), dict(zero=3),
    dict(fsdp={"sharding": "full_shard"}), dict(fsdp={"sharding": "shard_grad_op"}),
    dict(fsdp={"sharding": "hybrid_shard", "prefetch": False}),
    dict(tp=2, pp=2, dp=4, zero=1, schedule="interleaved", virtual_stages=2,
         sequence_parallel=True),
    dict(tp=2, pp=2, dp=4, order="tp-pp-dp-cp"),
    dict(training__recompute="full", tp=2, dp=8), dict(training__recompute="selective",
                                                        training__flash_attention=False),
]


@pytest.mark.parametrize("parallelism", STRATEGIES, ids=[str(s) for s in STRATEGIES])
def test_every_strategy_runs_end_to_end(parallelism):
    result = run(tiny(**parallelism))
    s = result.summary
    assert s["gpus"] == 16 and s["iteration_time_s"] > 0 and 0 < s["mfu"] < 1
    parts = sum(s[k] for k in ("compute_s", "exposed_comm_s", "comm_wait_s", "bubble_s",
                               "idle_s"))
    assert parts == pytest.approx(s["iteration_time_s"])
    for _, rows in result.spans.groupby(["rank", "stream"]):
        rows = rows.sort_values("start")
        assert (rows["start"].to_numpy()[1:] >= rows["end"].to_numpy()[:-1] - 1e-12).all()


def test_tensor_parallel_all_reduces_two_forward_two_backward_per_layer():
    result = run(tiny(tp=2, dp=8))
    tp = comms_of(result, "tp")
    layers, micro = 8, 32 // 8
    big = tp[tp["bytes"] == 512 * 512 * 2]  # one micro-batch's activations, b*s*h*2 bytes
    per_group = len(big) / 8  # 8 tensor-parallel groups
    assert (big["collective"] == "all_reduce").all()
    assert per_group == micro * (layers * 4 + 1)  # + the embedding's all-reduce


def test_sequence_parallel_uses_all_gather_and_reduce_scatter():
    result = run(tiny(tp=2, dp=8, sequence_parallel=True))
    tp = comms_of(result, "tp")
    big = tp[tp["bytes"] == 512 * 512 * 2]
    counts = big["collective"].value_counts() / 8
    micro, layers = 4, 8
    assert counts["all_gather"] == micro * (layers * 4 + 2)  # + logits AG fwd, embedding AG bwd
    assert counts["reduce_scatter"] == micro * (layers * 4 + 2)


def test_context_parallel_rotates_kv_in_a_ring():
    result = run(tiny(cp=4, dp=4))
    cp = comms_of(result, "cp")
    assert set(cp["collective"]) == {"ring_exchange"}
    # per layer and micro-batch: cp-1 exchanges forward, cp-1 backward, per cp group
    assert len(cp) / 4 == 8 * 8 * 2 * 3


def test_pipeline_sends_one_activation_and_one_gradient_per_micro_batch_and_boundary():
    result = run(tiny(pp=4, dp=4))
    pp = comms_of(result, "pp.")
    micro = 32 // 4
    assert len(pp) == 4 * 3 * micro * 2  # 4 pipelines x 3 boundaries x m x (f + b)
    assert set(pp["collective"]) == {"send_recv"}
    assert (pp["bytes"] == 512 * 512 * 2).all()


def activations_per_micro_batch(layers):
    return layers * activation_bytes_per_layer(512, 1, 512, 8, recompute=Recompute.SELECTIVE)


@pytest.mark.parametrize(("schedule", "in_flight"), [("1f1b", 4), ("gpipe", 8)])
def test_first_stage_holds_the_schedules_micro_batches_in_flight(schedule, in_flight):
    result = run(tiny(pp=4, dp=4, schedule=schedule))
    by_stage = result.summary["activation_gib_by_stage"]
    assert by_stage[0] * GIB == pytest.approx(in_flight * activations_per_micro_batch(2))


def test_engine_bubble_matches_the_closed_form_when_communication_is_free():
    # Equal stages whose compute dwarfs NCCL's fixed latencies: a wide model with a
    # small vocabulary (so the embedding and logits barely unbalance the stages).
    scenario = tiny(pp=4, dp=4)
    scenario["model"] = {"layers": 16, "hidden": 2048, "heads": 16, "vocab": 1024}
    scenario["training"].update(seq_len=2048, global_batch=64)  # m = 16 per pipeline
    scenario["cluster"].update(nvlink_bandwidth="1000 TB/s", nic_bandwidth="1000 TB/s",
                               pcie_bandwidth="1000 TB/s", link_latency="0 us",
                               nvlink_latency="0 us")
    result = run(scenario)
    spans = result.spans[result.spans["rank"] == 0]
    compute = spans[(spans["kind"] == "compute") & (spans["phase"] != "optimizer")]
    busy = (compute["end"] - compute["start"]).sum()
    span = compute["end"].max() - compute["start"].min()
    p, m = 4, 16
    # The last stage also runs the logits and loss (about 2 % more work per
    # micro-batch once causal attention does half the pairs), and that slowest stage
    # paces 1F1B's steady state: a 6-7 % larger bubble than (p-1)/(m+p-1).
    assert (span - busy) / span == pytest.approx((p - 1) / (m + p - 1), rel=0.08)
    assert (span - busy) / span > (p - 1) / (m + p - 1)  # never smaller than the ideal


@pytest.mark.parametrize(("framework", "zero", "expected"), [
    # ZeRO paper: 16 bytes per parameter, bf16 gradients
    ("deepspeed", 0, 16), ("deepspeed", 1, 4 + 12 / 16), ("deepspeed", 2, 2 + 14 / 16),
    ("deepspeed", 3, 16 / 16),
    # Megatron-Core with bf16: fp32 gradients (main_grad), 18 and 6 + 12/d bytes
    ("megatron", 0, 18), ("megatron", 1, 6 + 12 / 16), ("megatron", 3, 18 / 16)])
def test_zero_model_states_per_rank(framework, zero, expected):
    summary = run(tiny(zero=zero, framework=framework)).summary
    states = sum(summary["memory_gib"][k] for k in ("parameters", "gradients",
                                                    "optimizer_states"))
    assert states * GIB == pytest.approx(expected * summary["parameters"])
    assert summary["memory_gib"]["communication_buffers"] == pytest.approx(64 / 1024)


def test_fsdp_prefetch_overlaps_parameter_gathers():
    on = run(tiny(fsdp={"prefetch": True})).summary
    off = run(tiny(fsdp={"prefetch": False})).summary
    assert on["overlapped_comm_s"] > off["overlapped_comm_s"]
    assert on["iteration_time_s"] <= off["iteration_time_s"]


def test_full_recompute_costs_a_forward_and_saves_memory():
    none = run(tiny(tp=2, dp=8)).summary
    full = run(tiny(tp=2, dp=8, training__recompute="full")).summary
    assert full["compute_s"] > none["compute_s"] * 1.2
    assert full["memory_gib"]["activations"] < none["memory_gib"]["activations"]


def test_oom_names_the_rank_and_the_excess():
    scenario = tiny(pp=2, dp=8)
    scenario["model"] = {"preset": "gpt3-13b"}
    scenario["training"].update(seq_len=2048, global_batch=16)
    summary = run(scenario).summary
    assert summary["oom"] is True
    assert summary["oom_excess_gib"] == pytest.approx(summary["peak_memory_gib"] - 80)
    assert 0 <= summary["oom_rank"] < 16


@pytest.mark.parametrize(("parallelism", "message"), [
    (dict(tp=3, dp=5), "parallelism: tp x cp x pp = 3 x 1 x 1 = 3 must divide the GPU count 16"),
    (dict(tp=16, dp=1), r"model.heads \(8\) must be divisible by parallelism.tp \(16\)"),
    (dict(pp=16, dp=1), r"model.layers \(8\) must be divisible by parallelism.pp x "
                        r"virtual_stages \(16\)"),
    (dict(pp=2, dp=8, schedule="interleaved", virtual_stages=2, training__global_batch=24),
     r"parallelism.schedule: interleaved needs micro-batches \(3\) to be a multiple of "
     r"pipeline stages \(2\)"),
    (dict(pp=2, dp=8, stage_layers=[4, 3]), r"parallelism.stage_layers \[4, 3\] must have pp"),
    (dict(pp=2, dp=8, virtual_stages=2), "parallelism.schedule: virtual stages"),
    (dict(zero=1, fsdp={}), "parallelism.fsdp: .* cannot be combined with parallelism.zero"),
    (dict(order="tp-dp-pp"), "parallelism.order: order 'tp-dp-pp' must name tp, cp, dp and pp"),
    (dict(cp=16, dp=1, training__seq_len=520), r"training.seq_len \(520\) must be divisible by "
                                               r"parallelism.cp \(16\)"),
    (dict(zero=4), "parallelism.zero: 4 is not one of: 0, 1, 2, 3"),
])
def test_invalid_layouts_name_the_keys(parallelism, message):
    with pytest.raises(ScenarioError, match=f"^{message}"):
        from_dict(tiny(**parallelism))


def test_any_valid_large_combination_builds():
    from workloads.program import build_program

    scenario = from_dict({
        "cluster": {"preset": "dgx-a100", "nodes": 128},
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch": 1536},
        "parallelism": {"tp": 8, "pp": 8, "dp": 16, "schedule": "interleaved",
                        "virtual_stages": 2, "zero": 1},
    })
    program = build_program(scenario.model, scenario.training, scenario.parallel)
    assert program.ranks == 1024 and len(set(map(id, program.ops))) == 8


def test_pipeline_and_tensor_parallel_runs_are_deterministic():
    a, b = run(tiny(tp=2, pp=2, dp=4)), run(tiny(tp=2, pp=2, dp=4))
    assert a.spans.to_csv() == b.spans.to_csv()


@pytest.mark.parametrize("parallelism", [dict(tp=2, pp=2, dp=4), dict(pp=4, dp=4, zero=1),
                                         dict(tp=4, dp=4, sequence_parallel=True)])
def test_folded_ranks_give_the_same_timeline(parallelism):
    full = run(reference(tiny(**parallelism)))
    folded_scenario = tiny(**parallelism)
    folded_scenario["simulation"] = {"fold_ranks": True}
    folded = run(folded_scenario)
    assert folded.summary["simulated_ranks"] == parallelism.get("pp", 1)
    assert folded.summary["iteration_time_s"] == pytest.approx(
        full.summary["iteration_time_s"], rel=1e-9)
    keep = full.spans["rank"].isin(folded.spans["rank"].unique())
    a = full.spans[keep].reset_index(drop=True)
    b = folded.spans.reset_index(drop=True)
    assert len(a) == len(b)
    assert a["end"].to_numpy() == pytest.approx(b["end"].to_numpy(), rel=1e-9)
    for key in ("peak_memory_gib", "mfu", "compute_s", "exposed_comm_s"):
        assert folded.summary[key] == pytest.approx(full.summary[key], rel=1e-9)


def test_folding_refuses_jitter():
    scenario = tiny(tp=2, dp=8)
    scenario["cluster"]["compute_jitter"] = 0.1
    scenario["simulation"] = {"fold_ranks": True}
    with pytest.raises(ScenarioError, match="^simulation.fold_ranks: True needs cluster"):
        from_dict(scenario)


@pytest.mark.parametrize("parallelism", [dict(tp=2, pp=2, dp=4), dict(tp=4, dp=4, zero=1),
                                         dict(tp=2, dp=8, fsdp={"sharding": "full_shard"}),
                                         dict(tp=2, pp=2, dp=4, sequence_parallel=True,
                                              schedule="interleaved", virtual_stages=2)])
def test_tensor_parallel_gangs_give_the_same_timeline_for_every_rank(parallelism):
    full = run(reference(tiny(**parallelism)))
    scenario = tiny(**parallelism)
    scenario["simulation"] = {"tensor_parallel_gangs": True}
    gang = run(scenario)
    assert gang.summary["simulated_ranks"] == 16 // parallelism["tp"]
    pd_cols = ["rank", "stream", "kind", "start", "end"]
    a, b = full.spans[pd_cols], gang.spans[pd_cols]
    assert len(a) == len(b) and (a["rank"].to_numpy() == b["rank"].to_numpy()).all()
    assert a["end"].to_numpy() == pytest.approx(b["end"].to_numpy(), rel=1e-9)
    assert len(gang.comms) == len(full.comms), "every group's collectives still run"
    assert _calls_of(gang) == _calls_of(full), "each span names its own rank's call"
    assert gang.summary["iteration_time_s"] == pytest.approx(full.summary["iteration_time_s"],
                                                             rel=1e-9)


def _calls_of(result) -> list[tuple]:
    """Each span's call as (group, group index, collective, start, end), rank by rank."""
    comms = result.comms
    keys = list(zip(comms["group"], comms["group_index"], comms["collective"],
                    comms["start"].round(12), comms["end"].round(12), strict=True))
    spans = result.spans.sort_values(["rank", "start", "end", "stream", "kind"], kind="stable")
    return [(rank, keys[call] if call >= 0 else None)
            for rank, call in zip(spans["rank"], spans["call"], strict=True)]


def test_layer_span_detail_keeps_the_timeline():
    kernel = run(reference(tiny(tp=2, pp=2, dp=4)))
    scenario = tiny(tp=2, pp=2, dp=4)
    scenario["simulation"] = {"span_detail": "layer"}
    layer = run(scenario)
    assert len(layer.spans) < len(kernel.spans) / 2
    for key in ("iteration_time_s", "compute_s", "exposed_comm_s", "bubble_s",
                "peak_memory_gib"):
        assert layer.summary[key] == pytest.approx(kernel.summary[key], rel=1e-9)


def test_exclusive_tensor_parallel_links_give_the_same_timeline():
    scenario = tiny(tp=8, dp=2)  # tp fills each server: nothing else uses its NVLink
    full = run(reference(scenario))
    scenario["simulation"] = {"tensor_parallel_gangs": True}
    gang = run(scenario)
    assert gang.summary["events"] < full.summary["events"] / 4
    a, b = full.spans, gang.spans
    assert len(a) == len(b)
    assert a["end"].to_numpy() == pytest.approx(b["end"].to_numpy(), rel=1e-9)
    assert gang.summary["iteration_time_s"] == pytest.approx(full.summary["iteration_time_s"],
                                                             rel=1e-9)


@pytest.mark.parametrize("sharding", [{"fsdp": {"sharding": "full_shard"}}, {"zero": 3}])
def test_prefetch_gathers_one_layer_ahead_whatever_the_bandwidth(sharding):
    """Fast links must not let the all-gathers run ahead of the compute (which
    held every layer's parameters at once): FSDP's prefetch issues the next
    layer's gather as the current layer starts, so the peak stays put."""
    peaks = {}
    for bandwidth in ("12.5 Gb/s", "400 Gb/s"):
        scenario = {"name": "prefetch", "cluster": {"preset": "dgx-a100", "nodes": 2,
                                                    "nic_bandwidth": bandwidth},
                    "model": {"preset": "gpt3-1.3b"},
                    "training": {"seq_len": 2048, "global_batch": 64, "micro_batch": 2},
                    "parallelism": {"dp": 16, **sharding},
                    "simulation": {"span_detail": "layer"}}
        peaks[bandwidth] = run(scenario).summary["peak_memory_gib"]
    layer = 2 * 12 * 2048**2 * (1 - 1 / 16) / GIB  # one layer's gathered bf16 parameters
    assert abs(peaks["400 Gb/s"] - peaks["12.5 Gb/s"]) <= layer
