"""The host as a resource (issue 56, item 1): CUDA graph scopes as Megatron-Core
captures them (``workloads.cuda_graphs``), each kernel's host seconds per framework
(``compute.host_costs``), the optimizer's host syncs, and what the summary says."""

import copy
import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.cli import main
from simulator.compute import host_costs as H
from simulator.compute.host import host_bound, race
from simulator.config.scenario import from_dict
from workloads import cuda_graphs as G

L = 13.6e-6
GEMM, ELEM, ATT = KernelClass.GEMM, KernelClass.ELEMENTWISE, KernelClass.ATTENTION


def op(name, layer=0, phase=Phase.FORWARD, kernel=ELEM, shape=None):
    return Op(OpKind.COMPUTE, name, "compute", phase, kernel=kernel, layer=layer, shape=shape)


DENSE = [("ln1", ELEM), ("qkv", GEMM), ("attention", ATT), ("proj", GEMM), ("residual1", ELEM),
         ("ln2", ELEM), ("fc1", GEMM), ("act", ELEM), ("fc2", GEMM), ("residual2", ELEM)]
EXPERTS = (1024, 512, 256, 100, 100, 100, 100, 100, 100, 100, 100)  # 8 local experts
MOE = [("ln1", ELEM), ("qkv", GEMM), ("attention", ATT), ("proj", GEMM), ("residual1", ELEM),
       ("ln2", ELEM), ("shared_fc1", GEMM), ("router", GEMM), ("topk", ELEM),
       ("permute", ELEM), ("experts_fc1", GEMM), ("experts_fc2", GEMM), ("unpermute", ELEM),
       ("residual2", ELEM)]


def layer(names, layer=0, phase=Phase.FORWARD):
    ops = [op(n, layer, phase, k, EXPERTS if n.startswith("experts") else
              (512, 512, 512) if k is GEMM else None) for n, k in names]
    return ops[::-1] if phase is Phase.BACKWARD else ops


def labels(ops):
    return G.blocks(ops, list(range(len(ops))))


# --- which kernels each scope captures --------------------------------------------------

def test_a_dense_layer_splits_at_its_first_residual_add_forward_and_backward():
    forward = labels(layer(DENSE))
    assert forward == ["attn"] * 5 + ["mlp"] * 5
    assert labels(layer(DENSE, phase=Phase.BACKWARD)) == forward[::-1]
    head = [op("final_ln", 1), op("logits", 1, kernel=GEMM), op("loss", 1)]
    assert labels(head) == ["outside"] * 3  # no residual add: not a transformer layer


def test_a_moe_layer_has_router_preprocess_and_expert_blocks():
    assert labels(layer(MOE)) == (["attn"] * 5 + ["moe_router"] * 4 + ["moe_preprocess"]
                                  + ["moe"] * 4)


@pytest.mark.parametrize(("scope", "kept"), [
    ((), {"attn", "mlp", "moe_router", "moe_preprocess", "moe"}),
    (("attn",), {"attn"}),
    (("attn", "moe_router", "moe_preprocess"), {"attn", "moe_router", "moe_preprocess"}),
    (("moe",), {"moe_router", "moe_preprocess", "moe"}),
    (("full_iteration",), {"attn", "mlp", "moe_router", "moe_preprocess", "moe", "outside"}),
])
def test_what_each_scope_captures(scope, kept):
    assert G.captured(scope) == kept


@pytest.mark.parametrize(("scope", "moe", "dense", "dropless", "recompute", "offload", "why"), [
    (("full_iteration", "attn"), False, True, True, False, False, "must be alone"),
    (("moe", "moe_router"), True, True, True, False, False, "both moe and moe_router"),
    (("moe_preprocess",), True, True, True, False, False, "needs moe_router"),
    (("moe_router",), False, True, True, False, False, "no routed experts"),
    (("mlp",), True, False, True, False, False, "every layer of the model is a MoE"),
    (("moe",), True, True, True, False, False, "drop-and-pad"),
    ((), True, True, True, False, False, "drop-and-pad"),
    (("attn",), False, True, True, True, False, "full recompute"),
    (("attn",), False, True, True, False, True, "CPU offloading"),
])
def test_megatron_refuses_these_scopes(scope, moe, dense, dropless, recompute, offload, why):
    assert why in G.refusal(scope, moe, dense, dropless, recompute, offload)


@pytest.mark.parametrize("scope", [(), ("attn", "mlp"), ("full_iteration",)])
def test_dense_scopes_are_allowed(scope):
    assert G.refusal(scope, False, True, True, False, False) is None
    assert G.refusal(("attn", "moe_router", "moe_preprocess"), True, True, True, False,
                     False) is None
    assert G.refusal(("moe",), True, True, False, False, False) is None  # capacity factor


def test_scope_values_are_checked_with_the_field_named():
    assert G.scope_list("training.cuda_graph_scope", "attn") == ("attn",)
    with pytest.raises(ScenarioError, match=r"cuda_graph_scope\[1\]: 'mamba' is not a scope"):
        G.scope_list("training.cuda_graph_scope", ["attn", "mamba"])
    with pytest.raises(ScenarioError, match="names a scope twice"):
        G.scope_list("training.cuda_graph_scope", ["attn", "attn"])


# --- each kernel's host seconds, against the sources' figures ----------------------------

def test_module_overheads_are_the_published_cpu_times_per_forward():
    plan = H.HostPlan(L, "megatron")
    qkv, logits, router = op("qkv", kernel=GEMM), op("logits", kernel=GEMM), op(
        "router", kernel=GEMM)
    assert plan.eager(qkv) == pytest.approx(115e-6)  # TE PR #1191: TEColumnParallelLinear
    assert plan.eager(logits) == pytest.approx(74e-6)  # ... Megatron-Core ColumnParallelLinear
    assert plan.eager(router) == pytest.approx(L)  # torch.nn.functional.linear: one launch
    assert plan.eager(op("attn_scores", kernel=GEMM)) == pytest.approx(L)  # torch.baddbmm
    torch = H.HostPlan(L, "pytorch").eager(qkv)
    assert torch == pytest.approx(13.48e-6, rel=0.01)  # TE #2053: torch.nn.Linear on DGX H100
    assert plan.eager(op("qkv", phase=Phase.BACKWARD, kernel=GEMM)) == pytest.approx(2 * L)
    assert H.HostPlan(2 * L, "megatron").eager(qkv) == pytest.approx(230e-6)  # host's pace


def test_te_grouped_gemm_launches_one_gemm_per_local_expert():
    experts = op("experts_fc1", kernel=GEMM, shape=EXPERTS)
    assert H.launches(experts, "megatron") == 8
    assert H.launches(experts._replace(phase=Phase.BACKWARD), "megatron") == 16
    assert H.launches(experts, "torchtitan") == 1
    assert H.HostPlan(L, "megatron").eager(experts) == pytest.approx(115e-6)  # 8 L < 115 us
    slower = H.HostPlan(20e-6, "megatron").eager(experts)  # a slower host runs Python slower
    assert slower == pytest.approx(115e-6 * 20 / 13.6) and slower > 8 * 20e-6


def test_a_captured_region_costs_one_copy_and_one_graph_launch():
    ops = layer(DENSE) + layer(DENSE, layer=1)
    seconds, inside = H.HostPlan(L, "megatron", True, ("attn",)).host_seconds(
        ops, list(range(len(ops))))
    assert inside.tolist() == ([True] * 5 + [False] * 5) * 2
    assert seconds[0] == seconds[10] == pytest.approx(2 * L)
    assert seconds[1:5].tolist() == [0.0] * 4
    assert seconds[6] == pytest.approx(115e-6) and seconds[5] == pytest.approx(L)


def test_a_captured_layers_step_is_launch_free():
    """Oracle: every layer captured whole, a step's kernels run back to back after the
    graphs' launches (two a layer, before its first kernel while the GPU is busy)."""
    ops = layer(DENSE) + layer(DENSE, layer=1)
    durations = np.full(len(ops), 30e-6)  # longer than a launch: the graphs' copies hide
    out = host_bound(ops, [(0, len(ops), "f")], durations, H.HostPlan(L, "megatron", True))
    assert out[0] == pytest.approx(2 * L + 30e-6)
    assert out[1:].tolist() == pytest.approx(durations[1:].tolist())
    eager = host_bound(ops, [(0, len(ops), "f")], durations, H.HostPlan(L, "megatron"))
    assert eager.sum() > 8 * 115e-6  # eager, the TE modules' Python sets the pace


def test_race_with_graph_regions_takes_host_seconds():
    d = np.array([1.0, 1.0, 1.0, 1.0])
    assert race(d, np.array([2.0, 0.0, 0.0, 2.0]), 1.0).tolist() == [3.0, 1.0, 1.0, 1.0]
    assert race(d, np.array([2.0, 0.0, 0.0, 5.0]), 1.0).tolist() == [3.0, 1.0, 1.0, 3.0]


def test_the_dispatcher_sync_goes_where_a_graph_replays_the_experts():
    ops = layer(MOE)
    durations = np.full(len(ops), 1e-3)  # long kernels: only a sync can expose a launch
    steps = [(0, len(ops), "f")]
    eager = host_bound(ops, steps, durations, H.HostPlan(L, "megatron"))
    captured = host_bound(ops, steps, durations, H.HostPlan(L, "megatron", True, ("moe",)))
    assert eager.sum() - durations.sum() == pytest.approx(L + 115e-6)  # first + after sync
    assert captured.sum() - durations.sum() == pytest.approx(L)  # graph launch hidden


def test_megatrons_optimizer_waits_for_the_grad_norm():
    ops = layer(DENSE) + [op("optimizer", None, Phase.OPTIMIZER)]
    durations = np.full(len(ops), 1e-3)
    out = host_bound(ops, [(0, len(ops) - 1, "f")], durations, H.HostPlan(L, "megatron", False,
                                                                          (), 1))
    assert out[-1] == pytest.approx(1e-3 + L)
    assert host_bound(ops, [(0, len(ops) - 1, "f")], durations, L)[-1] == 1e-3


@settings(max_examples=40, deadline=None)
@given(d=st.lists(st.floats(1e-7, 1e-3), min_size=len(MOE) * 2, max_size=len(MOE) * 2),
       launch=st.floats(0, 50e-6), more=st.floats(0, 50e-6),
       scope=st.sampled_from([None, (), ("attn",), ("attn", "moe_router", "moe_preprocess")]),
       framework=st.sampled_from(["megatron", "pytorch"]))
def test_a_larger_launch_cost_never_makes_a_step_faster(d, launch, more, scope, framework):
    ops = layer(MOE) + layer(MOE, phase=Phase.BACKWARD)
    steps = [(0, len(MOE), "f"), (len(MOE), 2 * len(MOE), "b")]

    def total(per_launch):
        plan = H.HostPlan(per_launch, framework, scope is not None, scope or ())
        return host_bound(ops, steps, np.array(d), plan).sum()
    assert total(launch + more) >= total(launch) - 1e-12


# --- scenarios --------------------------------------------------------------------------

SMALL = {"name": "small", "cluster": {"preset": "dgx-h100", "nodes": 1},
         "model": {"preset": "gpt3-350m"},
         "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
         "parallelism": {"tp": 8, "sequence_parallel": True}}
MOE_SCENARIO = {"name": "moe", "cluster": {"preset": "dgx-h100", "nodes": 1},
                "model": {"preset": "qwen1.5-moe-a2.7b", "layers": 4},
                "training": {"seq_len": 1024, "global_batch": 8, "micro_batch": 1},
                "parallelism": {"tp": 2, "ep": 4, "sequence_parallel": True}}


def scenario(base, **training):
    out = copy.deepcopy(base)
    out["training"].update(training)
    return out


@pytest.mark.parametrize(("base", "training", "message"), [
    (SMALL, {"cuda_graph_scope": ["attn"]}, "needs training.cuda_graphs: true"),
    (SMALL, {"cuda_graphs": True, "cuda_graph_scope": ["moe_router"]}, "no routed experts"),
    (MOE_SCENARIO, {"cuda_graphs": True}, "drop-and-pad"),
    (SMALL, {"cuda_graphs": True, "cuda_graph_scope": "nope"}, "is not a scope"),
])
def test_bad_scopes_are_refused_naming_the_field(base, training, message):
    with pytest.raises(ScenarioError, match=f"training.cuda_graph_scope.*{message}"):
        from_dict(scenario(base, **training))


def test_partial_graphs_of_a_moe_model_end_to_end_through_the_cli(tmp_path, capsys):
    path = tmp_path / "moe.yaml"
    path.write_text(json.dumps(MOE_SCENARIO))
    partial = ["--set", "training.cuda_graphs=true",
               "--set", "training.cuda_graph_scope=[attn, moe_router, moe_preprocess]"]
    summaries = {}
    for name, extra in (("eager", []), ("partial", partial)):
        assert main(["run", str(path), "--out", str(tmp_path / name), *extra]) == 0
        summaries[name] = json.loads((tmp_path / name / "summary.json").read_text())
    eager, graphs = summaries["eager"], summaries["partial"]
    assert "CUDA graphs: per layer: attn, moe_router, moe_preprocess" in graphs["compute_model"]
    assert "host syncs: MoE dispatcher per MoE layer, optimizer grad norm" in \
        eager["compute_model"] and "host-bound:" in eager["compute_model"]
    assert 0 < graphs["host_stall_s"] < eager["host_stall_s"]
    assert graphs["iteration_time_s"] < eager["iteration_time_s"]
    code = main(["run", str(path), "--out", str(tmp_path / "bad"),
                 "--set", "training.cuda_graphs=true"])
    assert code == 2 and "training.cuda_graph_scope" in capsys.readouterr().err


def test_per_layer_graphs_leave_the_head_eager_and_keep_the_run_exact():
    graphs = run(scenario(SMALL, cuda_graphs=True)).summary
    whole = run(scenario(SMALL, cuda_graphs=True, cuda_graph_scope="full_iteration")).summary
    assert "CUDA graphs: every layer whole (full)" in graphs["compute_model"]
    assert graphs["host_stall_s"] > whole["host_stall_s"] > 0  # the optimizer's sync stays
