"""The strict loader: every bad input gets one line naming key, value and what is allowed."""

import pytest

from simulator.config.scenario import ScenarioError, apply_overrides, from_dict, load
from tests.conftest import QUICKSTART


def test_quickstart_loads():
    s = load(QUICKSTART)
    assert s.gpus == 16 and s.parallel.dp == 16
    assert s.cluster.nic_bandwidth == 25e9
    assert s.parallel.bucket_size == 25e6
    assert s.model.layers == 24


def test_preset_overrides_and_defaults(small):
    small["cluster"].update(nic_bandwidth="400 Gb/s", link_latency="2 us", gpus_per_node=4,
                            nics_per_node=4)
    small["parallelism"].pop("dp")
    s = from_dict(small)
    assert s.cluster.nic_bandwidth == 50e9 and s.cluster.link_latency == 2e-6
    assert s.parallel.dp == 8, "dp defaults to every GPU"
    assert s.model.kv_heads == 8 and s.model.ffn_hidden == 2048


BAD = [
    (("cluster", "preset"), "dgx-z100", "cluster.preset: 'dgx-z100' is not one of"),
    (("cluster", "nodes"), 0, "cluster.nodes: 0 must be an integer >= 1"),
    (("cluster", "nodes"), "two", "cluster.nodes: 'two' must be an integer"),
    (("cluster", "nic_bandwidth"), "0 Gb/s", "cluster.nic_bandwidth: '0 Gb/s' must be a positive"),
    (("cluster", "nic_bandwidth"), "-5 GB/s", "cluster.nic_bandwidth: '-5 GB/s' must be a pos"),
    (("cluster", "nic_bandwidth"), "200", "cluster.nic_bandwidth: '200' is not a bandwidth"),
    (("cluster", "nic_bandwidth"), 200, "cluster.nic_bandwidth: 200 needs a unit"),
    (("cluster", "link_latency"), "1 GB", "cluster.link_latency: '1 GB' is not a time"),
    (("cluster", "gpu"), "v100", "cluster.gpu: 'v100' is not one of"),
    (("cluster", "nic_bandwith"), "1 GB/s", "cluster.nic_bandwith: unknown key (did you mean "
                                            "'nic_bandwidth'?)"),
    (("model", "preset"), "gpt5", "model.preset: 'gpt5' is not one of"),
    (("model", "heads"), 7, "model.heads: 7 must divide model.hidden (512)"),
    (("model", "mlp"), "relu", "model.mlp: 'relu' is not one of: gelu, swiglu"),
    (("training", "global_batch"), 33, "training.global_batch: 33 must be divisible by dp x "
                                       "micro_batch = 16 x 1 = 16"),
    (("training", "precision"), "fp32", "training.precision: 'fp32' is not one of: bf16, fp16"),
    (("training", "seq_len"), 1.5, "training.seq_len: 1.5 must be an integer"),
    (("parallelism", "dp"), 6, "parallelism.dp: 6 must divide the GPU count 16"),
    (("parallelism", "dp"), 8,
     "parallelism: tp x cp x pp x dp = 1 x 1 x 1 x 8 = 8 must equal the GPU count 16"),
    (("parallelism", "bucket_size"), "0 MB", "parallelism.bucket_size: '0 MB' must be a positive"),
    (("network", "step_model"), "async", "network.step_model: 'async' is not one of: pipelined, "),
    (("parallelism", "overlap_grad_reduce"), "yes please", "parallelism.overlap_grad_reduce: "
                                                           "'yes please' must be true or false"),
]


@pytest.mark.parametrize(("where", "value", "message"), BAD)
def test_bad_values_name_the_key(small, where, value, message):
    section, key = where
    small.setdefault(section, {})[key] = value
    with pytest.raises(ScenarioError) as error:
        from_dict(small)
    assert str(error.value).startswith(message)
    assert "\n" not in str(error.value)


def test_unknown_section_and_missing_required(small):
    small["clutser"] = {}
    with pytest.raises(ScenarioError, match=r"^clutser: unknown key \(did you mean 'cluster'"):
        from_dict(small)
    del small["clutser"]
    del small["training"]["global_batch"]
    with pytest.raises(ScenarioError, match="^training.global_batch: missing"):
        from_dict(small)


def test_inline_model_needs_its_shape(small):
    del small["model"]["hidden"]
    with pytest.raises(ScenarioError, match="^model.hidden: missing"):
        from_dict(small)


def test_overrides():
    raw = {"cluster": {"nodes": 1}}
    apply_overrides(raw, ["cluster.nodes=4", "cluster.nic_bandwidth=400 Gb/s",
                          "parallelism.overlap_grad_reduce=false"])
    assert raw == {"cluster": {"nodes": 4, "nic_bandwidth": "400 Gb/s"},
                   "parallelism": {"overlap_grad_reduce": False}}
    with pytest.raises(ScenarioError, match="must look like key.path=value"):
        apply_overrides(raw, ["cluster.nodes"])
    with pytest.raises(ScenarioError, match="cluster.nodes is a value"):
        apply_overrides(raw, ["cluster.nodes.x=1"])


def test_file_errors(tmp_path):
    with pytest.raises(ScenarioError, match="cannot read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("cluster: [unclosed\n")
    with pytest.raises(ScenarioError, match="not valid YAML at line"):
        load(bad)


@pytest.mark.parametrize("kind", ["fat_tree", "fat_tree_3", "rail_optimized", "dragonfly"])
def test_every_fabric_type_runs_end_to_end(small, kind):
    from simulator import run

    small["cluster"]["fabric"] = {"type": kind, **({"router_nodes": 1} if kind == "dragonfly"
                                                   else {"leaf_ports": 8})}
    summary = run(small).summary
    assert summary["gpus"] == 16 and summary["iteration_time_s"] > 0


def test_a_fabric_key_of_another_kind_is_refused_by_the_kind(small):
    small["cluster"]["fabric"] = {"type": "dragonfly", "leaf_ports": 8}
    with pytest.raises(ScenarioError, match=r"^cluster.fabric.leaf_ports: unknown key; "
                                            r"allowed: global_links, group_routers, router_nodes"):
        from_dict(small)
    small["cluster"]["fabric"] = {"type": "dragonfly"}
    small["cluster"]["oversubscription"] = 2.0
    with pytest.raises(ScenarioError, match=r"^cluster.oversubscription: 2.0 is not a setting "
                                            r"of a dragonfly fabric"):
        from_dict(small)


def test_fabric_keys(small):
    small["cluster"]["oversubscription"] = 2.0
    small["cluster"]["fabric"] = {"type": "fat_tree_3", "pod_leaves": 4}
    fabric = from_dict(small).cluster.fabric
    assert (fabric.name, fabric.oversubscription, fabric.pod_leaves) == (
        "fat_tree_3", 2.0, 4)
    small["cluster"]["fabric"]["oversubscription"] = 3.0
    with pytest.raises(ScenarioError, match="^cluster.oversubscription: give it once"):
        from_dict(small)


@pytest.mark.parametrize(("cluster", "network", "message"), [
    ({"fabric": {"type": "torus"}}, {}, "cluster.fabric.type: 'torus' is not one of"),
    ({"fabric": {"type": "file"}}, {}, "cluster.fabric.path: missing"),
    ({"fabric": {"type": "file", "path": "nope.yaml"}}, {}, "cluster.fabric.path: nope.yaml: "
                                                            "no such fabric file"),
    ({"fabric": {"leaf_port": 8}}, {}, "cluster.fabric.leaf_port: unknown key"),
    ({"nic_efficiency": 1.5}, {}, r"cluster.nic_efficiency: 1.5 must be a number in \[0.01, 1\]"),
    ({}, {"algorithm": "nvls"}, "network.algorithm: 'nvls' needs an NVSwitch with NVLink SHARP"),
    ({"preset": "dgx-h100"}, {"algorithm": "nvls", "protocol": "ll"},
     "network.protocol: 'll' cannot run with network.algorithm nvls"),
    ({}, {"algorithm": "butterfly"}, "network.algorithm: 'butterfly' is not one of: auto, ring"),
])
def test_bad_fabric_and_network(small, cluster, network, message):
    small["cluster"].update(cluster)
    small["network"] = network
    with pytest.raises(ScenarioError, match=f"^{message}"):
        from_dict(small)


def test_fabric_file_scenario():
    from tests.conftest import ROOT

    s = load(ROOT / "scripts" / "scenarios" / "custom-fabric-file.yaml")
    assert s.gpus == 8 and s.machine.nodes == 2
    with pytest.raises(ScenarioError, match="^cluster.nodes: 3 disagrees with the fabric"):
        load(ROOT / "scripts" / "scenarios" / "custom-fabric-file.yaml", ["cluster.nodes=3"])


def test_forced_algorithm_and_protocol_reach_the_collectives(small):
    from simulator import run

    small["network"] = {"algorithm": "ring", "protocol": "simple"}
    comms = run(small).comms
    assert set(comms["algorithm"]) == {"ring"} and set(comms["protocol"]) == {"simple"}


def test_model_from_a_hugging_face_config_next_to_the_scenario(tmp_path):
    import json

    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "num_hidden_layers": 4, "hidden_size": 512,
        "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1376,
        "vocab_size": 32000, "hidden_act": "silu"}))
    (tmp_path / "s.yaml").write_text(
        "cluster: {preset: dgx-a100}\nmodel: {hf_config: config.json}\n"
        "training: {seq_len: 512, global_batch: 8}\nparallelism: {tp: 2}\n")
    s = load(tmp_path / "s.yaml")
    assert (s.model.layers, s.model.kv_heads, s.model.mlp.value) == (4, 2, "swiglu")
    (tmp_path / "s.yaml").write_text(
        "cluster: {preset: dgx-a100}\nmodel: {hf_config: missing.json}\n"
        "training: {seq_len: 512, global_batch: 8}\n")
    with pytest.raises(ScenarioError, match="^model.hf_config: .*missing.json: cannot read"):
        load(tmp_path / "s.yaml")
