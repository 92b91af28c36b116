"""MoE's token dispatcher as Megatron-Core runs it (issue 56, item 2): the token
counts exchanged over the EP group before each forward dispatch, at their real
bytes, and the host's wait for them, after which the kernels wait for their
launches (``compute.host``)."""

import copy

import numpy as np
import pytest

import simulator.compute.host as host
from simulator import run
from simulator.base.ir import Collective, KernelClass, Op, OpKind, Phase
from simulator.compute.host import host_bound, host_syncs, race
from simulator.config.scenario import from_dict
from tests.test_moe import scenario
from workloads.program import make_context
from workloads.strategies import expert


def ctx_of(**parallelism):
    s = from_dict(scenario(dp=16, **parallelism))
    return make_context(s.model, s.training, s.parallel)


def test_alltoall_gathers_one_int64_per_expert_per_rank_before_the_forward_dispatch():
    ctx = ctx_of(ep=4)
    assert expert.counts(ctx, expert.DISPATCH, True) == (
        ("ep", "ep", Collective.ALL_GATHER, 4 * 8 * 8, expert.COUNTS),)
    assert expert.counts(ctx, expert.DISPATCH, False) == ()
    assert expert.counts(ctx, expert.COMBINE, True) == ()
    assert expert.counts(ctx_of(ep=1), expert.DISPATCH, True) == ()


def test_deepep_and_allgather_exchange_their_own_routing_metadata():
    flex = expert.counts(ctx_of(ep=4, moe_token_dispatcher_type="flex"), expert.DISPATCH, True)
    assert flex == (("ep", "ep", Collective.ALL_TO_ALL, (8 + 4) * 4, expert.COUNTS),)
    gather = ctx_of(ep=4, moe_token_dispatcher_type="allgather")
    scores = 4 * 128 * 8  # the group's tokens x experts
    assert [(c[2], c[3]) for c in expert.counts(gather, expert.DISPATCH, True)] == [
        (Collective.ALL_GATHER, scores), (Collective.ALL_GATHER, scores * 2)]
    assert [(c[2], c[3]) for c in expert.counts(gather, expert.DISPATCH, False)] == [
        (Collective.REDUCE_SCATTER, scores * 2)]


def test_a_moe_run_logs_the_count_exchange_before_each_forward_dispatch():
    comms = run(scenario(dp=16, ep=4)).comms
    ep = comms[comms["group"] == "ep"]
    counts = ep[ep["name"] == expert.COUNTS]
    assert set(counts["bytes"]) == {4 * 8 * 8} and set(counts["collective"]) == {"all_gather"}
    assert len(counts) == 4 * 2 * 4  # layers x micro-batches x groups, forward only
    assert set(ep[ep["name"] != expert.COUNTS]["collective"]) == {"all_to_all"}


def test_a_one_gpu_moe_run_exchanges_nothing():
    raw = scenario(ep=1)
    raw["cluster"] = {"preset": "dgx-h100", "nodes": 1, "gpus_per_node": 1}
    raw["training"]["global_batch"] = 2
    assert run(raw).comms.empty


def op(name, phase=Phase.FORWARD, layer=0):
    return Op(OpKind.COMPUTE, name, "compute", phase, kernel=KernelClass.ELEMENTWISE,
              layer=layer)


def test_the_host_waits_before_each_layers_first_forward_expert_kernel():
    ops = [op("permute"), op("experts_fc1"), op("experts_act"), op("experts_fc2"),
           op("unpermute"), op("experts_fc1", layer=1), op("experts_fc1", Phase.BACKWARD)]
    assert host_syncs(ops, range(len(ops))).tolist() == [
        False, True, False, False, False, True, False]


def test_after_the_sync_the_host_has_no_lead():
    durations, launches = np.array([1e-6, 1e-3, 1e-6, 1e-6]), np.ones(4, int)
    free = race(durations, launches, 10e-6)
    synced = race(durations, launches, 10e-6, np.array([False, False, True, False]))
    assert free[2:] == pytest.approx([1e-6, 1e-6])  # the host's lead over the 1 ms kernel
    assert synced[2] == pytest.approx(10e-6 + 1e-6) and synced[3] == pytest.approx(10e-6)
    assert race(durations, launches, 0.0, np.ones(4, bool)) == pytest.approx(durations)


def test_host_bound_charges_the_sync_only_with_launch_costs():
    ops = [op("router"), op("topk"), op("experts_fc1"), op("experts_fc2")]
    durations = np.array([2e-3, 1e-6, 1e-6, 1e-6])
    out = host_bound(ops, [(0, 4, "a")], durations, 10e-6)
    assert out[2] == pytest.approx(11e-6)  # not hidden behind the long router
    assert host_bound(ops, [(0, 4, "a")], durations, 0.0) is durations


def slow_launch(**training):
    raw = scenario(dp=8, ep=4)
    raw["cluster"]["nodes"] = 1
    raw["training"].update(global_batch=8, **training)
    return raw


def test_a_moe_run_pays_the_sync_with_launches_and_not_with_cuda_graphs():
    """A dropless MoE layer's experts stay eager under Megatron-Core's partial graphs
    (the sync and the launches after it remain); drop-and-pad MoE captures them."""
    eager = run(slow_launch(kernel_launch="200 us")).summary
    partial = run(slow_launch(kernel_launch="200 us", cuda_graphs=True, cuda_graph_scope=[
        "attn", "moe_router", "moe_preprocess"])).summary
    padded = slow_launch(kernel_launch="200 us", cuda_graphs=True)
    padded["model"]["capacity_factor"] = 1.0
    whole = run(padded).summary
    free = run(slow_launch(kernel_launch="0 us")).summary
    assert eager["host_stall_s"] > partial["host_stall_s"] > whole["host_stall_s"] > 0
    assert free["host_stall_s"] == 0.0
    assert eager["iteration_time_s"] > partial["iteration_time_s"] > free["iteration_time_s"]


def test_the_sync_adds_launch_bound_time_to_a_moe_run(monkeypatch):
    raw = slow_launch(kernel_launch="200 us")
    synced = run(copy.deepcopy(raw)).summary["host_stall_s"]
    monkeypatch.setattr(host, "host_syncs", lambda ops, compute: np.zeros(len(compute), bool))
    unsynced = run(raw).summary["host_stall_s"]
    assert synced > unsynced
