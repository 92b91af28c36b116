"""Framework defaults for data-parallel gradients and parameters
(``workloads.frameworks``) and Megatron-Core's overlapped parameter all-gather,
end to end from a scenario."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import run
from simulator.config.scenario import ScenarioError, from_dict
from tests.test_parallelism import reference, tiny
from tests.test_symmetry import assert_same_run
from workloads.frameworks import (
    DEEPSPEED_BUCKET_ELEMENTS,
    PYTORCH_BUCKET_BYTES,
    Framework,
    default_bucket_bytes,
    resolve,
    reuse_plan,
)


@pytest.mark.parametrize(("framework", "precision", "fp32"), [
    ("megatron", "bf16", True), ("megatron", "fp16", False), ("deepspeed", "bf16", False),
    ("pytorch", "bf16", False), ("torchtitan", "bf16", True)])
def test_each_framework_reduces_gradients_in_its_default_precision(framework, precision,
                                                                   fp32):
    plan = resolve(Framework(framework), 2, precision, 8, True, None, None, None)
    assert plan.reduce_bytes == (4 if fp32 else 2)
    assert resolve(Framework(framework), 2, precision, 8, True, not fp32, None,
                   None).reduce_bytes == (2 if fp32 else 4)  # the key overrides


def test_bucket_sizes_follow_each_framework():
    # Megatron-Core: max(40M, 1M x dp) parameters, one bucket without overlap
    assert default_bucket_bytes(Framework.MEGATRON, 8, 4, True) == 40e6 * 4
    assert default_bucket_bytes(Framework.MEGATRON, 512, 2, True) == 512e6 * 2
    assert default_bucket_bytes(Framework.MEGATRON, 8, 4, False) == float("inf")
    assert default_bucket_bytes(Framework.DEEPSPEED, 8, 2, True) == DEEPSPEED_BUCKET_ELEMENTS * 2
    assert default_bucket_bytes(Framework.PYTORCH, 8, 2, True) == PYTORCH_BUCKET_BYTES
    plan = resolve(Framework.MEGATRON, 2, "bf16", 8, True, None, 1e6, None)
    assert plan.bucket_bytes == 1e6 and plan.overlap_param_gather
    assert not resolve(Framework.DEEPSPEED, 2, "bf16", 8, True, None, None,
                       None).overlap_param_gather


def dp_bytes(result, collective: str) -> float:
    comms = result.comms
    picked = comms[(comms["dimension"] == "dp") & (comms["collective"] == collective)
                   & (comms["group_index"] == 0)]
    return float(picked["bytes"].sum())


def test_fp32_gradient_reduction_doubles_data_parallel_bytes():
    fp32 = run(tiny(dp=16, framework="megatron"))
    half = run(tiny(dp=16, framework="pytorch"))
    params = fp32.summary["parameters"]
    assert dp_bytes(fp32, "all_reduce") == pytest.approx(4 * params)
    assert dp_bytes(half, "all_reduce") == pytest.approx(2 * params)
    fp16 = run(tiny(dp=16, framework="megatron", training__precision="fp16"))
    assert dp_bytes(fp16, "all_reduce") == pytest.approx(2 * params)


def test_megatron_buckets_only_the_first_model_chunk():
    layout = dict(pp=2, dp=8, schedule="interleaved", virtual_stages=2, zero=1,
                  bucket_size="1 MB")
    names = set(run(tiny(**layout)).comms["name"])
    first = {n for n in names if n.startswith("reduce_scatter[0.")}
    later = {n for n in names if n.startswith("reduce_scatter[1.")}
    assert len(first) > 1 and later == {"reduce_scatter[1.0]"}
    names = set(run(tiny(**layout, framework="deepspeed")).comms["name"])
    assert len({n for n in names if n.startswith("reduce_scatter[1.")}) > 1


def gathered(**layout):
    return run(tiny(zero=1, dp=16, bucket_size="4 MB", **layout))


def test_overlapped_parameter_gather_exposes_only_the_first_bucket():
    on, off = gathered(), gathered(overlap_param_gather=False)
    assert on.summary["iteration_time_s"] < off.summary["iteration_time_s"]
    assert on.summary["exposed_comm_s"] < off.summary["exposed_comm_s"]
    # the same bytes gathered: every parameter once, in half precision
    assert dp_bytes(on, "all_gather") == pytest.approx(dp_bytes(off, "all_gather"))
    assert dp_bytes(on, "all_gather") == pytest.approx(2 * on.summary["parameters"])
    spans = on.spans[on.spans["rank"] == 0]
    gathers = spans[spans["name"].str.startswith("param_all_gather")].sort_values("start")
    assert len(gathers) > 2 and (gathers["phase"] == "forward").all()
    first_kernel = spans[spans["kind"] == "compute"]["start"].min()
    # the forward starts when the first bucket (the embedding's) has arrived, and
    # the later buckets arrive while it runs
    assert first_kernel == pytest.approx(gathers["end"].iloc[0])
    assert gathers["end"].iloc[-1] > first_kernel
    last = spans[spans["kind"] == "compute"]
    assert not (off.spans["name"].str.startswith("param_all_gather")
                & (off.spans["phase"] != "optimizer")).any()
    assert last["end"].max() == pytest.approx(on.summary["iteration_time_s"])


def test_overlapped_gather_matches_the_reference_engine():
    layout = dict(zero=1, pp=2, dp=8, schedule="interleaved", virtual_stages=2,
                  bucket_size="4 MB")
    assert_same_run(run(tiny(**layout)), run(reference(tiny(**layout))))


@pytest.mark.parametrize(("key", "value", "match"), [
    ("framework", "jax", r"parallelism\.framework: 'jax' is not one of: megatron, deepspeed"),
    ("grad_reduce_in_fp32", "yes", r"parallelism\.grad_reduce_in_fp32: 'yes' must be true"),
    ("overlap_param_gather", 1, r"parallelism\.overlap_param_gather: 1 must be true")])
def test_bad_framework_keys_name_the_key_and_what_is_allowed(key, value, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(tiny(**{key: value}))


def dp_calls(result, collective: str) -> int:
    comms = result.comms
    return int(((comms["dimension"] == "dp") & (comms["collective"] == collective)
                & (comms["group_index"] == 0)).sum())


def test_deepspeed_zero3_gathers_each_module_and_reduces_every_micro_batch():
    ds = run(tiny(zero=3, dp=16, framework="deepspeed",
                  deepspeed={"stage3_max_reuse_distance": 0}))
    fsdp = run(tiny(zero=3, dp=16, framework="pytorch"))
    layers, passes, micro = 8, 2, 2  # tiny: 2 micro-batches per rank
    # qkv, proj, fc1, fc2 each gathered in forward and backward; the norms persist;
    # the word and position tables for the embedding, the (tied) word table for the head
    assert dp_calls(ds, "all_gather") == (4 * layers + 3) * passes * micro
    # one flat unit per layer, and the embedding and the head as units of their own
    assert dp_calls(fsdp, "all_gather") == (layers + 2) * passes * micro
    assert dp_calls(ds, "reduce_scatter") == micro  # one 5e8-element bucket per backward
    assert dp_calls(fsdp, "reduce_scatter") == layers + 2  # per unit, last micro-batch only
    params = ds.summary["parameters"]
    assert dp_bytes(ds, "reduce_scatter") == pytest.approx(2 * params * micro)


def test_deepspeed_persistence_and_prefetch_settings_act():
    base = dict(zero=3, dp=16, framework="deepspeed")
    kept = run(tiny(**base, deepspeed={"stage3_param_persistence_threshold": 10**9}))
    assert dp_calls(kept, "all_gather") == 0
    default = run(tiny(**base)).summary["iteration_time_s"]
    on_demand = run(tiny(**base, deepspeed={"stage3_prefetch_bucket_size": 0}))
    assert on_demand.summary["iteration_time_s"] > default
    assert on_demand.summary["exposed_comm_s"] > run(tiny(**base)).summary["exposed_comm_s"]


def test_deepspeed_keeps_parameters_reused_within_the_reuse_distance():
    """stage3_max_reuse_distance (default 1e9 elements): the tiny model's whole
    trace is shorter, so nothing gathered in the forward is released before its
    backward, and the tied word table is gathered once per micro-batch."""
    base = dict(zero=3, dp=16, framework="deepspeed")
    kept = run(tiny(**base))
    layers, micro = 8, 2
    assert dp_calls(kept, "all_gather") == (4 * layers + 2) * micro  # forward only
    gathers = kept.spans[kept.spans["name"] == "param_all_gather"]
    assert set(gathers["phase"]) == {"forward"}
    released = run(tiny(**base, deepspeed={"stage3_max_reuse_distance": 0}))
    assert kept.summary["peak_memory_gib"] > released.summary["peak_memory_gib"]
    assert kept.summary["exposed_comm_s"] < released.summary["exposed_comm_s"]


ZERO3_LAYOUTS = [dict(framework="deepspeed", deepspeed={"stage3_max_reuse_distance": r})
                 for r in (0, 3_000_000, 10**9)] + [
    dict(fsdp={"sharding": "full_shard", "version": v}) for v in (1, 2)] + [
    dict(fsdp={"sharding": "full_shard", "reshard_after_forward": False})]


@pytest.mark.parametrize("layout", ZERO3_LAYOUTS, ids=[str(x) for x in ZERO3_LAYOUTS])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_gathered_parameters_are_all_released(layout, recompute):
    from workloads.program import build_program

    zero = {} if "fsdp" in layout else {"zero": 3}
    scenario = from_dict(tiny(dp=16, training__recompute=recompute, **zero, **layout))
    program = build_program(scenario.model, scenario.training, scenario.parallel)
    held = peak = 0.0
    for op in program.ops[0]:
        held += sum(b for b, what in op.mem if what == "gathered_parameters")
        peak = max(peak, held)
    assert held == pytest.approx(0.0, abs=1.0) and peak > 0


def test_per_module_gathers_cost_more_than_flat_units_at_scale():
    """At many ranks each all-gather is latency-bound: four calls per layer cost
    more than one of the same bytes (the effect that sets ZeRO-3 at 1,000+ GPUs)."""
    layout = dict(zero=3, dp=128, cluster__nodes=16, training__global_batch=128)
    ds = run(tiny(**layout, framework="deepspeed")).summary
    fsdp = run(tiny(**layout, framework="pytorch")).summary
    assert ds["iteration_time_s"] > fsdp["iteration_time_s"]


def test_deepspeed_zero3_matches_the_reference_engine():
    layout = dict(zero=3, dp=8, tp=2, framework="deepspeed", training__recompute="full")
    assert_same_run(run(tiny(**layout)), run(reference(tiny(**layout))))


@pytest.mark.parametrize(("layout", "match"), [
    (dict(deepspeed={"stage3_prefetch_bucket_size": 0}),
     r"parallelism\.deepspeed: .* needs parallelism\.framework: deepspeed"),
    (dict(framework="deepspeed", zero=3, pp=2, dp=8),
     r"parallelism\.zero: 3 with parallelism\.pp: 2 is not possible"),
    (dict(framework="deepspeed", deepspeed={"stage3_prefetch_bucket_size": -1}),
     r"stage3_prefetch_bucket_size: -1 must be an integer >= 0")])
def test_deepspeed_layouts_it_cannot_run_are_refused(layout, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(tiny(**layout))


def tp_overlap(overlap: bool, **cluster):
    scenario = tiny(tp=4, dp=4, sequence_parallel=True, tp_comm_overlap=overlap)
    scenario["model"] = {"layers": 2, "hidden": 4096, "heads": 32, "vocab": 4096}
    scenario["training"].update(seq_len=2048, global_batch=4)
    scenario["cluster"].update(cluster)
    return scenario


def test_tp_comm_overlap_splits_each_pair_into_ring_steps_with_the_same_bytes():
    plain, piped = run(tp_overlap(False)), run(tp_overlap(True))
    tp, layers, micro = 4, 2, 1
    comms = piped.comms[(piped.comms["dimension"] == "tp") & (piped.comms["group_index"] == 0)]
    exchanges = comms[comms["collective"] == "ring_exchange"]
    # qkv, proj, fc1, fc2 each pipelined with its collective, in forward and backward
    assert len(exchanges) == 4 * 2 * (tp - 1) * layers * micro
    # a ring all-gather or reduce-scatter sends (tp - 1)/tp of the tensor per rank:
    # the tp - 1 exchanges of 1/tp each carry exactly that
    tensor, pairs = 2048 * 4096 * 2, 4 * 2 * layers * micro
    assert exchanges["bytes"].sum() == pytest.approx(pairs * (tp - 1) / tp * tensor)
    calls = plain.comms[(plain.comms["dimension"] == "tp") & (plain.comms["group_index"] == 0)]
    assert (calls["bytes"] == tensor).sum() == pairs + 4  # + embedding and logits, not piped


def test_tp_comm_overlap_hides_communication_where_it_dominates():
    slow = {"nvlink_bandwidth": "20 GB/s"}
    plain, piped = run(tp_overlap(False, **slow)), run(tp_overlap(True, **slow))
    assert piped.summary["overlapped_comm_s"] > plain.summary["overlapped_comm_s"]
    assert piped.summary["iteration_time_s"] < plain.summary["iteration_time_s"]


def test_tp_comm_overlap_matches_the_reference_engine():
    scenario = tp_overlap(True)
    assert_same_run(run(scenario), run(reference(scenario)))


def test_tp_comm_overlap_needs_sequence_parallelism():
    with pytest.raises(ScenarioError, match=r"tp_comm_overlap needs parallelism\."
                                            r"sequence_parallel"):
        from_dict(tiny(tp=2, dp=8, tp_comm_overlap=True))


def test_overlapped_parameter_gather_covers_gemms_pipelined_with_tp_communication():
    """With tp_comm_overlap the layer's GEMMs are "overlapped" plan items: their
    parameters are gathered too (every parameter once, in half precision)."""
    layout = dict(zero=1, tp=2, dp=8, sequence_parallel=True, bucket_size="4 MB")
    piped, plain = run(tiny(**layout, tp_comm_overlap=True)), run(tiny(**layout))
    assert dp_bytes(piped, "all_gather") == pytest.approx(dp_bytes(plain, "all_gather"))
    assert dp_calls(piped, "all_gather") == dp_calls(plain, "all_gather")


# ---- PyTorch FSDP: reduce-scatter per micro-batch, backward prefetch ---------------
FSDP_TINY = dict(dp=16, fsdp={"sharding": "full_shard"}, framework="pytorch",
                 training__micro_batch=1, training__global_batch=64)


def _dp_calls(result, name):
    comms = result.comms
    return comms[(comms["dimension"] == "dp") & (comms["collective"] == name)]


def test_fsdp_reduce_scatters_every_micro_batch_without_a_pipeline():
    """PyTorch FSDP's default (no no_sync): one reduce-scatter per unit (each
    layer, and FSDP1's root: the embedding and the head) per micro-batch; with a
    pipeline, torch.distributed.pipelining syncs at each stage's last
    micro-batch only."""
    result = run(tiny(**FSDP_TINY))
    layers, micro_batches = result.scenario.model.layers, result.summary["micro_batches"]
    assert micro_batches == 4
    assert len(_dp_calls(result, "reduce_scatter")) == (layers + 1) * micro_batches
    piped = run(tiny(**{**FSDP_TINY, "dp": 8, "pp": 2}))
    per_group = _dp_calls(piped, "reduce_scatter").groupby("group_index").size()
    # one data-parallel group per stage: its layers, and the embedding or the head
    assert list(per_group) == [layers // 2 + 1] * 2


def _gather_and_scatter_order(result):
    """(layer, collective) of rank 0's data-parallel stream in backward, in order."""
    spans = result.spans
    dp = spans[(spans["rank"] == 0) & (spans["stream"] == "dp")
               & (spans["phase"] == "backward")].sort_values("start")
    return list(zip(dp["layer"], dp["name"], strict=True))


@pytest.mark.parametrize("when", ["pre", "post"])
def test_fsdp_gathers_the_next_layer_ahead_of_this_layers_reduce_scatter(when):
    result = run(tiny(**{**FSDP_TINY, "fsdp": {"sharding": "full_shard",
                                               "backward_prefetch": when}}))
    order = _gather_and_scatter_order(result)
    last = result.scenario.model.layers - 1
    # after the last layer's gather: the next layer's gather, then the last's reduce-scatter
    first = order.index((last, "all_gather"))
    assert order[first + 1:first + 3] == [(last - 1, "all_gather"), (last, "reduce_scatter")]


def test_backward_prefetch_pre_hides_the_gathers_post_exposes_them():
    """BACKWARD_PRE issues the next layer's gather as this layer's backward starts
    (hidden under it); BACKWARD_POST when it ends (the next backward waits)."""
    slow = {"cluster__nic_bandwidth": "25 Gb/s"}
    pre = run(tiny(**FSDP_TINY, **slow)).summary
    post = run(tiny(**{**FSDP_TINY, **slow, "fsdp": {"sharding": "full_shard",
                                                      "backward_prefetch": "post"}})).summary
    assert post["exposed_comm_s"] > pre["exposed_comm_s"]
    assert post["iteration_time_s"] > pre["iteration_time_s"]


def test_fsdp_backward_prefetch_matches_the_reference_engine():
    layout = {**FSDP_TINY, "fsdp": {"sharding": "full_shard", "backward_prefetch": "post"}}
    assert_same_run(run(tiny(**layout)), run(reference(tiny(**layout))))


def test_zero3_gathers_and_reduces_the_embedding_and_the_head_as_units():
    """FSDP2 (TorchTitan) wraps the embedding and the output layer as units: each
    is gathered before its forward and its backward (a tied logits weight with
    it) and its gradients reduce-scattered, every micro-batch here. FSDP1's root
    unit holds both: gathered once per micro-batch, kept through the backward."""
    result = run(tiny(**{**FSDP_TINY, "framework": "torchtitan"}))
    m, micro_batches = result.scenario.model, result.summary["micro_batches"]
    gathers, scatters = _dp_calls(result, "all_gather"), _dp_calls(result, "reduce_scatter")
    assert len(gathers) == (2 * m.layers + 4) * micro_batches
    assert len(scatters) == (m.layers + 2) * micro_batches
    assert gathers["bytes"].max() >= 2 * m.vocab * m.hidden  # the bf16 vocabulary table
    root = run(tiny(**FSDP_TINY))
    gathers, scatters = _dp_calls(root, "all_gather"), _dp_calls(root, "reduce_scatter")
    assert len(gathers) == (2 * m.layers + 1) * micro_batches
    assert len(scatters) == (m.layers + 1) * micro_batches
    assert gathers["bytes"].max() >= 2 * m.vocab * m.hidden
    spans = root.spans
    first = spans[(spans["rank"] == 0) & (spans["stream"] == "dp")].sort_values("start")
    assert first.iloc[0]["layer"] == -1 and first.iloc[0]["phase"] == "forward"
    zero3 = {k: v for k, v in FSDP_TINY.items() if k != "fsdp"}
    for layout in ({**zero3, "zero": 3}, FSDP_TINY):
        layout = {**layout, "dp": 8, "pp": 2}
        assert_same_run(run(tiny(**layout)), run(reference(tiny(**layout))))


def test_fsdp2_splits_each_gathered_layer_with_a_copy_out_kernel():
    """FSDP2 (``fully_shard``, TorchTitan's default) gathers per-parameter shards
    into one buffer and copies them out on the compute stream; FSDP1 gathers
    into its flat parameter in place."""
    one = run(tiny(**{**FSDP_TINY, "framework": "torchtitan",
                      "fsdp": {"sharding": "full_shard", "version": 1}}))
    two = run(tiny(**{**FSDP_TINY, "framework": "torchtitan"}))
    def copies(result):
        spans = result.spans
        return spans[(spans["rank"] == 0) & (spans["name"] == "fsdp_copy_out")]
    assert copies(one).empty
    m, micro_batches = two.scenario.model, two.summary["micro_batches"]
    assert len(copies(two)) == 2 * m.layers * micro_batches  # each layer's gather, both passes
    assert two.summary["compute_s"] > one.summary["compute_s"]
    gathers = two.spans[(two.spans["rank"] == 0) & (two.spans["name"] == "all_gather")]
    first_copy, first_gather = copies(two)["start"].min(), gathers["end"].min()
    assert first_copy >= first_gather - 1e-12  # it waits for its gather


@given(st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 50)), max_size=40),
       st.integers(0, 300))
def test_reuse_plan_gathers_what_is_not_held_and_releases_each_gather_once(trace, reuse):
    sizes = {t: n for t, n in trace}  # one size per tensor, as in a real trace
    uses = [(t, sizes[t]) for t, _ in trace]
    gathers, releases = reuse_plan(uses, {"f"}, reuse)
    held = set()
    for (tensor, _), gather, release in zip(uses, gathers, releases, strict=True):
        if tensor == "f":  # persistent
            assert not gather and not release
            continue
        assert gather == (tensor not in held)
        held.add(tensor)
        if release:
            held.discard(tensor)
    assert not held  # the trace's last use of each tensor releases it
    assert reuse_plan(uses, set(), 0)[0] == [True] * len(uses)
    assert sum(reuse_plan(uses, set(), float("inf"))[0]) == len(sizes)
