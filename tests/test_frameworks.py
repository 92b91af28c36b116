"""Framework defaults for data-parallel gradients and parameters
(``workloads.frameworks``) and Megatron-Core's overlapped parameter all-gather,
end to end from a scenario."""

from __future__ import annotations

import pytest

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
