"""Low-precision training (issue 39): the keys and their errors, what runs in the
low format and what does not, the casts' bytes against their closed form, memory,
communication in the precision sent, the summary's keys, and the shape of the
speed-up (GEMM-bound layouts gain, communication-bound ones barely)."""

from __future__ import annotations

import copy

import pytest

from simulator import run
from simulator.base.ir import KernelClass
from simulator.cli import main
from simulator.config.scenario import ScenarioError, from_dict
from tests.test_parallelism import TINY, reference
from tests.test_symmetry import assert_same_run
from topologies import GPUS
from workloads import kernels as K
from workloads.precision import RECIPES, LowPrecision, gathered_param_bytes

GIB = 2**30


def _scenario(precision: str = "bf16", preset: str = "dgx-h100", **training) -> dict:
    scenario = copy.deepcopy(TINY)
    scenario["cluster"] = {"preset": preset, "nodes": 1}
    scenario["model"] = {"layers": 4, "hidden": 4096, "heads": 32, "vocab": 32000,
                         "ffn_hidden": 16384}
    scenario["training"] = {"seq_len": 4096, "global_batch": 16, "micro_batch": 1,
                            "precision": precision, **training}
    scenario["parallelism"] = {"tp": 2, "sequence_parallel": True, "zero": 1}
    return scenario


def test_precision_keys_take_megatron_defaults_and_refuse_what_cannot_run():
    s = from_dict(_scenario("fp8"))
    assert s.training.recipe.name == "delayed" and s.training.fp8_transposes  # Hopper
    assert from_dict(_scenario("mxfp8", "dgx-b200")).training.recipe.name == "mxfp8"
    assert not from_dict(_scenario("fp8", "dgx-b200")).training.fp8_transposes
    cases = [
        (_scenario("mxfp8"), r"training.precision: 'mxfp8' is not supported by h100-sxm-80gb "
                             r"\(it has bf16, fp16, fp8\)"),
        (_scenario("fp8", fp8_recipe="mxfp8"), r"training.fp8_recipe: 'mxfp8' is a recipe of "
                                               r"precision mxfp8; with training.precision fp8 "
                                               r"use delayed or tensorwise or blockwise"),
        (_scenario(fp8_attention=True), r"training.fp8_attention: True needs a low "
                                        r"training.precision \(fp8, mxfp8, nvfp4\), not bf16"),
        (_scenario(fp8_recipe="delayed"), r"training.fp8_recipe: 'delayed' needs a low"),
        (_scenario("fp8", fp8_recipe="fp4"),
         r"training.fp8_recipe: 'fp4' is not one of: delayed, tensorwise"),
        (_scenario("fp8", fp8_attention=True, flash_attention=False),
         r"training.fp8_attention: True needs fused attention"),
    ]
    a100 = _scenario("fp8", "dgx-a100")
    cases.append((a100, r"training.precision: 'fp8' is not supported by a100-sxm-80gb"))
    for scenario, message in cases:
        with pytest.raises(ScenarioError, match=message):
            from_dict(scenario)


def test_casts_move_the_bytes_of_their_closed_form():
    """Quantizing E elements reads them (twice under current scaling), writes the
    format's bytes and scales in each orientation; NVFP4's weight-gradient operand
    is read once more for the Hadamard transform; a weight's cast is shared by the
    micro-batches."""
    m, n, k, mb = 4096, 1024, 2048, 4
    expected = {  # (forward bytes per input element, per weight element, backward per dY)
        ("delayed", True): (2 + 2, 2 + 2, 2 + 2),  # Hopper: a transposed copy
        ("delayed", False): (2 + 1, 2 + 1, 2 + 1),  # Blackwell: one buffer serves both
        ("tensorwise", False): (4 + 1, 4 + 1, 4 + 1),
        ("blockwise", True): (2 + 2 * (1 + 4 / 128),) * 3,
        ("mxfp8", False): (2 + 2 * (1 + 1 / 32),) * 3,
        ("nvfp4", False): (2 + 2 * (0.5 + 1 / 16), 2 + 2 * (0.5 + 1 / 16),
                           4 + 2 * (0.5 + 1 / 16)),
    }
    for (name, transposes), (x, w, dy) in expected.items():
        lowp = LowPrecision(RECIPES[name], transposes, mb)
        cast = K.quantize_kernel("fc1", m, n, k, lowp)
        assert cast.bytes == pytest.approx(m * k * x + k * n * w / mb), name
        assert cast.backward_bytes == pytest.approx(m * n * dy), name
    fed = K.quantize_kernel("qkv", m, n, k, LowPrecision(RECIPES["delayed"], True), True)
    assert fed.bytes == pytest.approx(m * k * 2 + k * n * 4)  # the norm cast its output
    fed = K.quantize_kernel("qkv", m, n, k, LowPrecision(RECIPES["tensorwise"], True), True)
    assert fed.bytes == pytest.approx(m * k * 4 + k * n * 6)  # the norm found the amax


def test_only_the_linear_layers_run_in_the_low_format():
    s = from_dict(_scenario("fp8"))
    lowp = s.training.low_precision(4)
    shard = K.Shard(1, 4096, 2, 2, 1, True, True, lowp)
    kernels = {k.name: k for k in K.layer_kernels(s.model, shard)}
    lowp_gemms = {n for n, k in kernels.items() if k.cls is KernelClass.LOWP_GEMM}
    assert lowp_gemms == {"qkv", "proj", "fc1", "fc2"}
    assert {n for n, k in kernels.items() if k.cls is KernelClass.QUANTIZE} == {
        f"{n}_quantize" for n in lowp_gemms}
    assert kernels["attention"].cls is KernelClass.ATTENTION
    head = K.head_kernels(s.model, shard)
    assert head[1].cls is KernelClass.GEMM  # the output layer stays in BF16
    fp8_attention = K.Shard(1, 4096, 2, 2, 1, True, True, lowp, fp8_attention=True)
    assert K.attention_kernels(s.model, fp8_attention)[0].cls is KernelClass.LOWP_ATTENTION
    # FLOPs are the model's whatever the precision
    assert sum(k.flops for k in kernels.values()) == pytest.approx(
        sum(k.flops for k in K.layer_kernels(s.model, K.Shard(1, 4096, 2, 2, 1, True))))


def test_fp8_gemms_run_at_the_fp8_peak_and_the_summary_says_where_time_went():
    bf16, fp8 = run(_scenario()).summary, run(_scenario("fp8")).summary
    assert fp8["iteration_time_s"] < bf16["iteration_time_s"]
    peak = GPUS["h100-sxm-80gb"].peak_flops
    assert fp8["mfu"] == pytest.approx(fp8["model_tflops_per_gpu"] * 1e12 / peak["bf16"])
    assert fp8["mfu_lowp"] == pytest.approx(fp8["model_tflops_per_gpu"] * 1e12 / peak["fp8"])
    assert fp8["precision"] == "fp8" and 0 < fp8["lowp_overhead_s"] < fp8["compute_s"]
    assert "precision" not in bf16 and "lowp_overhead_s" not in bf16
    assert "low-precision GEMMs at 1979 TFLOP/s" in fp8["compute_model"]


def test_memory_keeps_quantized_inputs_and_weight_copies():
    bf16 = run(_scenario()).summary["memory_gib"]
    fp8 = run(_scenario("fp8")).summary["memory_gib"]
    gathered = run(_scenario("fp8", fp8_param_gather=True)).summary["memory_gib"]
    assert fp8["activations"] < bf16["activations"]
    # Hopper: an FP8 copy and its transpose of every linear weight, 2 bytes a parameter
    linear = 4 * (4096 * (3 * 4096) + 4096 * 4096 + 2 * 4096 * 16384) / 2  # per TP rank
    assert fp8["lowp_weights"] == pytest.approx(2 * linear / GIB, rel=1e-3)  # (and biases)
    # FP8 parameters: the BF16 copy goes, the FP8 one is the parameter
    assert gathered["parameters"] == pytest.approx(fp8["parameters"] - linear / GIB, rel=1e-3)
    assert gathered["lowp_weights"] == pytest.approx(linear / GIB, rel=1e-3)


def test_communication_is_in_the_precision_sent():
    """Sequence-parallel all-gathers carry FP8 (the quantized row-wise copy), the
    reduce-scatters and gradients stay as before, FP8 parameters are gathered in FP8,
    and delayed scaling adds one small amax all-reduce per iteration."""
    def log(precision, **training):
        scenario = _scenario(precision, **training)
        scenario["cluster"]["nodes"] = 2
        scenario["parallelism"]["overlap_param_gather"] = False
        return run(scenario).comms

    bf16, fp8 = log("bf16"), log("fp8", fp8_param_gather=True)

    def sizes(comms, op):
        return set(comms[(comms["dimension"] == "tp") & (comms["collective"] == op)]["bytes"])

    (ag,) = sizes(bf16, "all_gather")  # forward (before a block) and backward (after one)
    assert sizes(fp8, "all_gather") == {ag, ag / 2}  # the forward's carries FP8
    assert sizes(bf16, "reduce_scatter") == sizes(fp8, "reduce_scatter")
    grads = [c[(c["dimension"] == "dp") & (c["collective"] == "reduce_scatter")]["bytes"].sum()
             for c in (bf16, fp8)]
    assert grads[0] == grads[1]
    params = [c[c["name"].str.startswith("param_all_gather")]["bytes"].sum()
              for c in (bf16, fp8)]
    assert params[1] == pytest.approx(params[0] / 2)
    amax = fp8[fp8["name"] == "amax_all_reduce"]
    assert len(amax[amax["group_index"] == 0]) == 1
    assert not (bf16["name"] == "amax_all_reduce").any()
    assert gathered_param_bytes(RECIPES["mxfp8"]) == 2  # Megatron gathers MXFP8 in BF16


def test_the_speed_up_follows_what_dominates():
    """FP8 gains on a GEMM-bound layout and barely where communication dominates
    (the same model data-parallel over slow links)."""
    def speedup(scenario):
        fast = run(scenario).summary["iteration_time_s"]
        scenario = copy.deepcopy(scenario)
        scenario["training"].update(precision="bf16")
        return run(scenario).summary["iteration_time_s"] / fast

    gemm_bound = _scenario("fp8")
    slow = _scenario("fp8")
    slow["cluster"] = {"preset": "dgx-h100", "nodes": 4, "nic_bandwidth": "10 Gb/s"}
    slow["training"].update(global_batch=32, seq_len=1024)
    slow["parallelism"] = {"dp": 32, "overlap_grad_reduce": False}
    assert speedup(gemm_bound) > 1.2
    assert 1.0 <= speedup(slow) < 1.05


def test_low_precision_runs_exactly_with_the_default_speed_ups():
    scenario = _scenario("mxfp8", "gb200-nvl72", fp8_param_gather=True)
    scenario["cluster"]["nodes"] = 2
    scenario["parallelism"] = {"tp": 2, "pp": 2, "zero": 1, "sequence_parallel": True}
    assert_same_run(run(scenario), run(reference(scenario)))


def test_the_command_line_takes_the_keys(tmp_path, capsys):
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(_scenario()))
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--set",
                 "training.precision=fp8", "--set", "training.fp8_recipe=tensorwise"]) == 0
    assert "precision        fp8: MFU" in capsys.readouterr().out
    assert main(["run", str(path), "--out", str(tmp_path / "o"), "--set",
                 "training.precision=nvfp4"]) == 2
    assert "training.precision: 'nvfp4' is not supported by h100" in capsys.readouterr().err
