"""Selective recompute by module (``training.recompute_modules``, issue 41): the
bytes each module frees against Korthikanti et al.'s terms, what it re-runs,
the alias ``recompute: selective``, and the errors."""

import copy

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.config.scenario import from_dict
from workloads.program import build_program
from workloads.stage import LayoutError

SEQ, LAYERS, HIDDEN = 2048, 24, 2048
DENSE = {"name": "dense", "cluster": {"preset": "dgx-h100", "nodes": 1},
         "model": {"preset": "gpt3-1.3b"},
         "training": {"seq_len": SEQ, "global_batch": 8, "micro_batch": 1},
         "parallelism": {"tp": 1, "pp": 1}}
MOE = {"name": "moe", "cluster": {"preset": "dgx-h100", "nodes": 1},
       "model": {"preset": "mixtral-8x7b", "layers": 2},
       "training": {"seq_len": 4096, "global_batch": 8, "micro_batch": 1},
       "parallelism": {"tp": 1, "pp": 1, "ep": 8}}


def program_of(raw: dict):
    scenario = from_dict(raw)
    return build_program(scenario.model, scenario.training, scenario.parallel)


def with_modules(base: dict, modules: list, **training) -> dict:
    raw = copy.deepcopy(base)
    raw["training"].update(recompute_modules=modules, **training)
    return raw


@pytest.fixture(scope="module")
def dense_runs():
    return {tuple(m): run(with_modules(DENSE, m)).summary
            for m in ([], ["layernorm"], ["mlp"], ["layernorm", "mlp"])}


def activations(summary) -> float:
    return summary["memory_gib"]["activations"] * 2**30


def test_modules_free_korthikanti_terms(dense_runs):
    """Per layer, in s*b*h: the norms' outputs 2 + 2 (BF16), the MLP's 8 + 8 + 1."""
    sbh = SEQ * HIDDEN * LAYERS
    none = activations(dense_runs[()])
    assert (none - activations(dense_runs[("layernorm",)])) / sbh == pytest.approx(4.0)
    assert (none - activations(dense_runs[("mlp",)])) / sbh == pytest.approx(17.0)
    assert (none - activations(dense_runs[("layernorm", "mlp")])) / sbh == pytest.approx(21.0)


def test_recompute_costs_time_and_flops(dense_runs):
    """Each module re-run takes time; the MLP's GEMMs count in the hardware FLOPs."""
    times = {k: s["iteration_time_s"] for k, s in dense_runs.items()}
    assert times[()] < times[("layernorm",)] < times[("layernorm", "mlp")]
    assert times[()] < times[("mlp",)]
    assert dense_runs[("layernorm",)]["hardware_flops"] == dense_runs[()]["hardware_flops"]
    extra = dense_runs[("mlp",)]["hardware_flops"] / dense_runs[()]["hardware_flops"]
    assert 1.1 < extra < 1.3  # the MLP's forward: about 2/3 of a layer's, a third of 3


def test_reruns_the_modules_kernels_in_the_backward():
    """The backward of each layer is preceded by its norms' forward again."""
    program = program_of(with_modules(DENSE, ["layernorm"]))
    plain = program_of(DENSE)

    def count(p, name):
        return sum(1 for op in p.ops[0] if getattr(op, "name", "") == name)
    assert count(program, "ln1") == count(plain, "ln1") + LAYERS  # one micro-batch
    assert count(program, "fc1") == count(plain, "fc1")


def test_selective_is_core_attn():
    alias = run(copy.deepcopy(DENSE) | {"training": DENSE["training"] | {
        "recompute": "selective", "attention_kernel": "unfused"}}).summary
    listed = run(with_modules(DENSE, ["core_attn"], attention_kernel="unfused")).summary
    assert alias["iteration_time_s"] == listed["iteration_time_s"]
    assert alias["memory_gib"] == listed["memory_gib"]
    none = run(with_modules(DENSE, [], attention_kernel="unfused")).summary
    assert activations(listed) < activations(none)  # the score matrices


def test_moe_modules():
    """moe_act frees the second grouped GEMM's input; moe the whole block and
    re-runs its all-to-alls."""
    runs = {m: run(with_modules(MOE, list(m))) for m in ((), ("moe_act",), ("moe",))}
    acts = {m: activations(r.summary) for m, r in runs.items()}
    assert acts[()] > acts[("moe_act",)] > acts[("moe",)]
    routed_act = 4096 * 2 * 14336 * 2 * 2  # tokens x top-2 x ffn x 2 bytes, 2 layers
    assert acts[()] - acts[("moe_act",)] == pytest.approx(routed_act)
    dispatches = {m: int(r.comms["name"].eq("dispatch").sum()) for m, r in runs.items()}
    assert dispatches[()] == dispatches[("moe_act",)] == 4  # 2 layers, forward and backward
    assert dispatches[("moe",)] == 6  # and each layer's forward again
    assert runs[("moe",)].summary["iteration_time_s"] > runs[()].summary["iteration_time_s"]


@pytest.mark.parametrize("training, message", [
    ({"recompute_modules": ["attn"]}, "training.recompute_modules[0]: 'attn' is not one of"),
    ({"recompute_modules": "mlp"}, "training.recompute_modules: 'mlp' must be a list"),
    ({"recompute_modules": ["mlp", "mlp"]}, "names a module twice"),
    ({"recompute_modules": ["mlp"], "recompute": "full"}, "not recompute: full"),
    ({"recompute_modules": ["moe_act"]}, "'moe_act' needs a model with experts"),
])
def test_errors_name_the_key(training, message):
    raw = copy.deepcopy(DENSE)
    raw["training"].update(training)
    with pytest.raises((ScenarioError, LayoutError), match=message.replace("[", r"\[")
                       .replace("]", r"\]")):
        program_of(raw)
