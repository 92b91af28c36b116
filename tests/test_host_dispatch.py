"""The host CPU's pace (``cluster.host_dispatch``): Grace issues PyTorch's ops
2.75x as slowly as a DGX H100's Xeon (TransformerEngine issue #2053), so its
launches and module overheads cost that much more (``compute.host_costs``)."""

import copy

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.compute.host_costs import HostPlan
from simulator.config.scenario import from_dict
from topologies.clusters import CLUSTERS, HOSTS
from workloads.training import TrainingSpec

SMALL = {"name": "pace", "cluster": {"preset": "gb200-nvl72", "nodes": 2},
         "model": {"preset": "gpt3-350m"},
         "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 1},
         "parallelism": {"tp": 4, "framework": "megatron"}}


def test_grace_is_the_measured_ratio_and_the_x86_hosts_the_reference():
    """torch.nn.Linear's forward: 37.08 us of CPU on GB200, 13.48 us on DGX H100."""
    assert HOSTS["grace"]["host_dispatch"] == pytest.approx(2.7507, abs=1e-4)
    for name in ("gb200-nvl72", "gb300-nvl72"):
        assert CLUSTERS[name].host_dispatch == HOSTS["grace"]["host_dispatch"]
    for name in ("dgx-h100", "dgx-b200", "dgx-a100"):
        assert CLUSTERS[name].host_dispatch == 1.0


def test_the_pace_scales_the_launch_and_the_module_overheads():
    training = TrainingSpec(seq_len=2048, global_batch=8)
    plain, slow = HostPlan.of(training, "megatron"), HostPlan.of(training, "megatron", 2.5)
    assert slow.kernel_launch == pytest.approx(2.5 * plain.kernel_launch)
    assert "34 us a kernel launch" in slow.describe()


def test_a_grace_host_never_makes_a_run_faster_and_the_summary_says_its_launch():
    grace = run(copy.deepcopy(SMALL)).summary
    x86 = copy.deepcopy(SMALL)
    x86["cluster"]["host_dispatch"] = 1.0
    reference = run(x86).summary
    assert grace["iteration_time_s"] > reference["iteration_time_s"]
    assert "37.4 us a kernel launch" in grace["compute_model"]
    assert "13.6 us a kernel launch" in reference["compute_model"]


def test_a_bad_pace_is_refused_naming_the_field():
    bad = copy.deepcopy(SMALL)
    bad["cluster"]["host_dispatch"] = 0
    with pytest.raises(ScenarioError, match="cluster.host_dispatch"):
        from_dict(bad)
