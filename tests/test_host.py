"""Host-bound kernels (``simulator.compute.host``): the GPU runs a step's kernels
no faster than the host issues them; CUDA graphs remove the launches."""

import copy

import numpy as np
import pytest

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.compute.host import host_bound, race
from tests.test_parallelism import reference
from tests.test_symmetry import assert_same_run


def kernel(phase=Phase.FORWARD):
    return Op(OpKind.COMPUTE, "k", "compute", phase, kernel=KernelClass.ELEMENTWISE)


def test_long_kernels_hide_the_launches_short_ones_wait_for_them():
    long = race(np.full(5, 100e-6), np.ones(5, int), 10e-6)
    assert long[1:] == pytest.approx(100e-6) and long[0] == pytest.approx(110e-6)
    short = race(np.full(5, 1e-6), np.ones(5, int), 10e-6)
    assert short.sum() == pytest.approx(5 * 10e-6 + 1e-6)  # the host's pace, then the last
    assert race(np.full(3, 1e-6), np.full(3, 2), 10e-6).sum() == pytest.approx(61e-6)


def test_every_step_of_a_kind_gets_the_same_durations_and_others_keep_theirs():
    ops = [kernel(), kernel(), kernel(Phase.BACKWARD), kernel(), kernel(), kernel(Phase.BACKWARD),
           kernel(Phase.OPTIMIZER)]
    durations = np.array([1e-6, 50e-6, 1e-6, 1e-6, 50e-6, 1e-6, 1e-6])
    steps = [(0, 3, "a"), (3, 6, "a")]
    out = host_bound(ops, steps, durations, 10e-6)
    assert out[:3].tolist() == out[3:6].tolist()
    assert out[:3].sum() > durations[:3].sum() and out[6] == durations[6]
    assert host_bound(ops, steps, durations, 0.0) is durations


SMALL = {"name": "small", "cluster": {"preset": "dgx-h100", "nodes": 1},
         "model": {"preset": "gpt3-350m"},
         "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
         "parallelism": {"tp": 8, "sequence_parallel": True}}


def variant(**training):
    scenario = copy.deepcopy(SMALL)
    scenario["training"].update(training)
    return scenario


def test_small_kernels_are_host_bound_and_cuda_graphs_free_them():
    eager = run(variant()).summary
    graphs = run(variant(cuda_graphs=True)).summary  # per layer: embedding and head eager
    whole = run(variant(cuda_graphs=True, cuda_graph_scope="full_iteration")).summary
    # one graph an iteration: only the optimizer's wait after the grad norm's sync stays
    assert whole["host_stall_s"] == pytest.approx(13.6e-6) and eager["host_stall_s"] > 0.01
    assert 0 < graphs["host_stall_s"] < 0.1 * eager["host_stall_s"]
    assert eager["compute_s"] == pytest.approx(whole["compute_s"] + eager["host_stall_s"]
                                               - whole["host_stall_s"])
    assert eager["iteration_time_s"] > graphs["iteration_time_s"] > whole["iteration_time_s"]
    no_launch = run(variant(kernel_launch="0 us")).summary
    assert no_launch["host_stall_s"] == 0.0
    assert no_launch["iteration_time_s"] <= whole["iteration_time_s"]
    slower = run(variant(kernel_launch="30 us")).summary
    assert slower["iteration_time_s"] > eager["iteration_time_s"]


def test_large_kernels_barely_notice_the_host():
    scenario = variant(seq_len=2048, micro_batch=8, global_batch=64)
    scenario["model"] = {"preset": "gpt3-6.7b"}
    scenario["parallelism"] = {"tp": 2, "dp": 4}
    summary = run(scenario).summary
    assert summary["host_stall_s"] < 0.005 * summary["compute_s"]


def test_host_bound_steps_match_the_reference_engine():
    scenario = variant(global_batch=8)
    scenario["parallelism"] = {"tp": 2, "pp": 2, "dp": 2}
    assert_same_run(run(scenario), run(reference(scenario)))
