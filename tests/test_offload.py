"""Offloading to host memory: activations (``training.activation_offload_layers``)
and optimizer states (``training.optimizer_offload``), end to end from a scenario."""

from __future__ import annotations

import copy

import pytest

from simulator import run
from simulator.base.ir import KernelClass, Op, OpKind, Phase
from simulator.cli import main
from simulator.compute.model import ComputeModel
from simulator.config.scenario import ScenarioError, from_dict
from tests.test_parallelism import TINY, reference
from tests.test_symmetry import assert_same_run
from topologies import CLUSTERS, GPUS

GIB = 2**30


def _scenario(layers: int = 0, optimizer: float = 0.0, **cluster) -> dict:
    scenario = copy.deepcopy(TINY)
    scenario["cluster"] = {"preset": "gb200-nvl72", "nodes": 2, **cluster}
    scenario["training"].update(global_batch=16, activation_offload_layers=layers,
                                optimizer_offload=optimizer)
    scenario["parallelism"] = {"tp": 2, "pp": 2, "zero": 1, "sequence_parallel": True}
    return scenario


def test_offloading_moves_activations_and_optimizer_states_to_the_host():
    """Peak GPU memory falls by what goes to the host: half the stage's layers'
    activations, and F of the optimizer states (the host also holds their fp32
    gradients)."""
    before = run(_scenario()).summary
    after = run(_scenario(layers=2, optimizer=0.5)).summary
    mem, host = after["memory_gib"], after["host_memory_gib"]
    assert mem["activations"] == pytest.approx(before["memory_gib"]["activations"] / 2)
    assert host["host_activations"] == pytest.approx(mem["activations"])
    assert mem["optimizer_states"] == pytest.approx(before["memory_gib"]["optimizer_states"] / 2)
    shard = before["memory_gib"]["optimizer_states"] / 12  # GiB of parameters' worth
    assert host["host_optimizer_states"] == pytest.approx(0.5 * shard * (12 + 4))
    moved = host["host_activations"] + mem["optimizer_states"]
    assert before["peak_memory_gib"] - after["peak_memory_gib"] == pytest.approx(moved)
    assert after["host_peak_memory_gib"] == pytest.approx(sum(host.values()))
    assert "host_peak_memory_gib" not in before and not after["oom"]


def test_the_copies_run_on_their_own_lanes_at_the_host_links_rate():
    result = run(_scenario(layers=2, optimizer=0.5))
    spans = result.spans
    copies = spans[spans["kind"] == "copy"]
    assert set(copies["stream"]) == {"offload", "reload"}
    out = copies[copies["name"] == "activations_to_host"]
    back = copies[copies["name"] == "activations_from_host"]
    assert len(out) == len(back) > 0 and set(back["stream"]) == {"reload"}
    link, _ = CLUSTERS["gb200-nvl72"].host_rates()
    seconds = (out["end"] - out["start"]).to_numpy()
    overhead = GPUS["gb200-186gb"].kernel_overhead
    assert seconds == pytest.approx(out["bytes"].to_numpy() / link + overhead)
    names = set(copies["name"])
    assert {"gradients_to_host", "host_adam_step", "parameters_from_host"} <= names
    # a layer's backward starts only once its activations are back
    compute = spans[(spans["stream"] == "compute") & (spans["phase"] == "backward")]
    for row in back[back["rank"] == 0].itertuples():
        first = compute[(compute["rank"] == 0) & (compute["layer"] == row.layer)
                        & (compute["microbatch"] == row.microbatch)]["start"].min()
        assert first >= row.end - 1e-12


def test_offloading_runs_exactly_with_the_default_speed_ups():
    scenario = _scenario(layers=2, optimizer=0.25)
    assert_same_run(run(scenario), run(reference(scenario)))


def test_a_host_that_runs_out_of_memory_is_an_oom_of_host_memory(capsys, tmp_path):
    scenario = _scenario(layers=3, optimizer=1.0, host_memory="50 MB")
    summary = run(scenario).summary
    assert summary["oom"] and summary["oom_memory"] == "host"
    assert summary["oom_excess_gib"] == pytest.approx(
        summary["host_peak_memory_gib"] - 50e6 / GIB)
    import yaml

    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(scenario))
    main(["run", str(path), "--out", str(tmp_path / "out")])
    assert "of host memory)" in capsys.readouterr().out


def test_offload_keys_that_cannot_run_are_errors_naming_the_key():
    with pytest.raises(ScenarioError, match=r"training.activation_offload_layers: 4 must be "
                                            r"fewer than the 4 layers"):
        from_dict(_scenario(layers=4))
    with pytest.raises(ScenarioError, match=r"training.optimizer_offload: 1.5"):
        from_dict(_scenario(optimizer=1.5))
    with pytest.raises(ScenarioError, match=r"cluster.host_link_bandwidth"):
        from_dict(_scenario(host_link_bandwidth="fast"))


def test_host_copies_and_host_work_are_timed_on_the_host_not_the_gpu():
    model = ComputeModel.of(GPUS["h100"], "bf16", host_link=50e9, host_memory=100e9)
    copy_op = Op(OpKind.COMPUTE, "copy", "offload", Phase.FORWARD,
                 kernel=KernelClass.HOST_COPY, bytes=1e9)
    step = copy_op._replace(kernel=KernelClass.HOST_COMPUTE, bytes=2e9)
    assert model.duration(copy_op) == pytest.approx(0.02 + model.kernel_overhead)
    assert model.duration(step) == pytest.approx(0.02 + model.kernel_overhead)
