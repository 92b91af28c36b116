"""Multi-token prediction (issue 41, item 5): DeepSeek-V3's MTP depths on the
last pipeline stage: their parameters against the published count, their
work and memory on the last stage only, their layer's all-to-alls."""

import copy
from dataclasses import replace

import pytest

from simulator import run
from simulator.config.scenario import from_dict
from workloads import kernels as K
from workloads.models import MODELS
from workloads.program import build_program

V3 = MODELS["deepseek-v3"]
BASE = {"name": "mtp", "cluster": {"preset": "dgx-h100", "nodes": 2},
        "model": {"preset": "deepseek-v3", "layers": 4, "first_dense_layers": 1},
        "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 2, "ep": 8, "sequence_parallel": True}}


def with_depths(n: int) -> dict:
    raw = copy.deepcopy(BASE)
    raw["model"]["mtp_layers"] = n
    return raw


def test_parameters_match_deepseek_v3s_module():
    """DeepSeek-V3's MTP module: 14 B parameters with its copies of the embedding
    and the output head (DeepSeek-AI 2024: 685 B on the hub, 671 B without it)."""
    added = K.parameter_count(replace(V3, mtp_layers=1), 16) - K.parameter_count(V3, 16)
    copies = 2 * V3.vocab * V3.hidden
    assert added + copies == pytest.approx(14e9, rel=0.05)


def test_work_and_memory_on_the_last_stage_only():
    plain, mtp = run(with_depths(0)).summary, run(with_depths(1)).summary
    assert mtp["compute_s_by_stage"][0] == pytest.approx(plain["compute_s_by_stage"][0])
    assert mtp["compute_s_by_stage"][1] > plain["compute_s_by_stage"][1]
    assert mtp["peak_memory_gib_by_stage"][0] == pytest.approx(
        plain["peak_memory_gib_by_stage"][0])
    assert mtp["peak_memory_gib_by_stage"][1] > plain["peak_memory_gib_by_stage"][1]
    assert mtp["iteration_time_s"] > plain["iteration_time_s"]
    block = sum(k.flops for k in K.mtp_block(replace(V3, layers=4, first_dense_layers=1), 1,
                                             2048))
    assert mtp["hardware_flops"] - plain["hardware_flops"] == pytest.approx(3 * 8 * block)


def test_each_depth_runs_its_layer_with_its_all_to_alls():
    def ops(n):
        s = from_dict(with_depths(n))
        program = build_program(s.model, s.training, s.parallel)
        last = program.ops[-1]  # a rank of the last stage
        return (sum(1 for op in last if getattr(op, "name", "") == "mtp_proj"),
                sum(1 for op in last if getattr(op, "name", "") == "dispatch"))
    micro_batches = 8 // 4  # global batch over 4 data-parallel ranks per stage
    proj0, dispatch0 = ops(0)
    proj2, dispatch2 = ops(2)
    assert proj0 == 0 and proj2 == 2 * 2 * micro_batches  # 2 depths, forward and backward
    assert dispatch2 - dispatch0 == 2 * 2 * micro_batches
