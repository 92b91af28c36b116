"""Chakra execution traces (issue 43, item 2): export then import gives the same
run (iteration time and communication log) on every shipped scenario, the one
with several jobs too (each training job's traces in a folder of its own); the
files are Chakra's format; other tools' traces run; malformed traces are one
line."""

import json
import re
from pathlib import Path

import pytest
import yaml

from simulator import run
from simulator.base.chakra_schema import COLLECTIVES, NODE_TYPES, delimited, messages
from simulator.cli import main
from simulator.config.scenario import from_dict
from tests.conftest import QUICKSTART, ROOT

SHIPPED = sorted(p for p in (ROOT / "scripts" / "scenarios").glob("*.yaml")
                 if "jobs" not in yaml.safe_load(p.read_text()) and p.stem != "sweep-base")


def _export(path: Path, out: Path, capsys) -> None:
    assert main(["export-chakra", str(path), "--out", str(out)]) == 0
    assert "Chakra traces" in capsys.readouterr().out


def _imported(path: Path, traces: Path, **workload) -> dict:
    raw = {k: v for k, v in yaml.safe_load(path.read_text()).items()
           if k not in ("model", "training", "parallelism")}
    raw["workload"] = {"chakra": str(traces), **workload}
    return raw


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_export_then_import_is_the_same_run(tmp_path, capsys, path):
    _export(path, tmp_path / "traces", capsys)
    again = run(from_dict(_imported(path, tmp_path / "traces"), base_dir=path.parent))
    first = run(path)
    assert again.summary["iteration_time_s"] == first.summary["iteration_time_s"]
    assert again.comms.equals(first.comms)


def test_recorded_durations_on_the_same_gpu_are_the_model_s(tmp_path, capsys):
    _export(QUICKSTART, tmp_path / "t", capsys)
    recorded = run(from_dict(_imported(QUICKSTART, tmp_path / "t", durations="recorded"),
                             base_dir=QUICKSTART.parent))
    assert recorded.summary["iteration_time_s"] == pytest.approx(
        run(QUICKSTART).summary["iteration_time_s"], rel=1e-3)  # (no host stall recorded)


def test_the_files_are_chakra_traces_one_per_rank(tmp_path, capsys):
    _export(ROOT / "scripts" / "scenarios" / "gpt3-6.7b-3d.yaml", tmp_path, capsys)
    M = messages()
    files = sorted(tmp_path.glob("trace.*.et"))
    assert len(files) == 32
    raw = delimited((tmp_path / "trace.5.et").read_bytes())
    assert M["GlobalMetadata"].FromString(raw[0]).version
    nodes = [M["Node"].FromString(b) for b in raw[1:]]
    kinds = {n.type for n in nodes}
    assert {NODE_TYPES[k] for k in ("COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE",
                                     "COMM_RECV_NODE")} <= kinds
    groups = json.loads((tmp_path / "comm_groups.json").read_text())
    for n, node in enumerate(nodes):
        assert node.id == n and all(d < n for d in (*node.data_deps, *node.ctrl_deps))
        attrs = {a.name: a for a in node.attr}
        if node.type == NODE_TYPES["COMM_COLL_NODE"]:
            assert attrs["comm_type"].int64_val in COLLECTIVES.values()
            assert attrs["comm_size"].int64_val > 0
            assert 5 in groups[attrs["pg_name"].string_val]
        if node.type == NODE_TYPES["COMP_NODE"]:
            assert node.duration_micros >= 0 and attrs["num_ops"].int64_val >= 0


@pytest.mark.parametrize(("damage", "match"), [
    (lambda d: (d / "trace.3.et").write_bytes((d / "trace.3.et").read_bytes()[:-7]),
     r"trace.3.et: a message at byte \d+ claims"),
    (lambda d: (d / "trace.2.et").unlink(), "trace.2.et is missing"),
    (lambda d: (d / "trace.1.et").write_bytes(b"\x05hello"),
     "trace.1.et: does not start with Chakra's metadata"),
    (lambda d: [p.unlink() for p in d.glob("*.et")], "holds no sets of Chakra traces"),
])
def test_malformed_traces_are_one_line(tmp_path, capsys, damage, match):
    _export(QUICKSTART, tmp_path / "t", capsys)
    damage(tmp_path / "t")
    scenario = tmp_path / "s.yaml"
    scenario.write_text(yaml.safe_dump(_imported(QUICKSTART, tmp_path / "t")))
    assert main(["run", str(scenario), "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: workload.chakra: ") and err.count("\n") == 1, err
    assert re.search(match, err), err


def test_the_traces_must_fit_the_cluster_and_stand_alone(tmp_path, capsys):
    _export(QUICKSTART, tmp_path / "t", capsys)
    raw = _imported(QUICKSTART, tmp_path / "t")
    raw["cluster"]["nodes"] = 4
    with pytest.raises(Exception, match="holds 16 ranks' traces; the cluster has 32 GPUs"):
        from_dict(raw)
    raw = _imported(QUICKSTART, tmp_path / "t")
    raw["training"] = {"seq_len": 1024, "global_batch": 16}
    with pytest.raises(Exception, match="training: .* cannot be given beside workload"):
        from_dict(raw)


def _foreign_trace(folder: Path, ranks: int = 8) -> None:
    """Traces as Chakra's own tools write them: metadata, then nodes with only
    Chakra's documented fields (a compute, an all-reduce of communicator 1, a
    compute after it; rank 0 sends rank 1 a message)."""
    from simulator.base.chakra_schema import varint

    M = messages()
    A = M["AttributeProto"]
    folder.mkdir()
    (folder / "comm_groups.json").write_text(json.dumps({"1": list(range(ranks))}))
    for rank in range(ranks):
        nodes = [M["Node"](id=10, name="fwd", type=NODE_TYPES["COMP_NODE"], duration_micros=100,
                           attr=[A(name="num_ops", int64_val=10**12)]),
                 M["Node"](id=11, name="grad_sync", type=NODE_TYPES["COMM_COLL_NODE"],
                           data_deps=[10], attr=[
                               A(name="comm_type", int64_val=COLLECTIVES["ALL_REDUCE"]),
                               A(name="comm_size", int64_val=64 * 2**20),
                               A(name="pg_name", string_val="1")]),
                 M["Node"](id=12, name="step", type=NODE_TYPES["COMP_NODE"],
                           duration_micros=50, data_deps=[11])]
        if rank in (0, 1):
            kind = "COMM_SEND_NODE" if rank == 0 else "COMM_RECV_NODE"
            nodes.append(M["Node"](id=13, name="p2p", type=NODE_TYPES[kind], data_deps=[12],
                                   attr=[A(name="comm_src", int32_val=0),
                                         A(name="comm_dst", int32_val=1),
                                         A(name="comm_size", int64_val=2**20)]))
        data = [M["GlobalMetadata"](version="0.0.4").SerializeToString(),
                *(n.SerializeToString() for n in nodes)]
        (folder / f"workload.{rank}.et").write_bytes(
            b"".join(varint(len(d)) + d for d in data))


def test_another_tools_traces_run_with_their_recorded_durations(tmp_path):
    _foreign_trace(tmp_path / "t")
    raw = {"name": "foreign", "cluster": {"preset": "dgx-a100", "nodes": 1},
           "workload": {"chakra": str(tmp_path / "t"), "durations": "recorded"}}
    result = run(from_dict(raw))
    calls = result.comms
    reduce = calls[calls["collective"] == "all_reduce"]
    assert len(reduce) == 1 and reduce["bytes"].iloc[0] == 64 * 2**20
    assert len(calls[calls["collective"] == "send_recv"]) == 1
    took = float(reduce["end"].iloc[0] - reduce["start"].iloc[0])
    assert result.summary["iteration_time_s"] >= 150e-6 + took - 1e-9
    raw["workload"]["durations"] = "model"
    with pytest.raises(Exception, match="workload.durations: 'model' needs the kernels' shapes"):
        from_dict(raw)


@pytest.mark.parametrize(("damage", "match"), [
    (lambda d: (d / "comm_groups.json").write_text('{"2": [0, 1]}'),
     "communicator '1' is not in comm_groups.json"),
    (lambda d: (d / "workload.3.et").rename(d / "workload.9.et"),
     "the traces' ranks are not 0 to 7"),
    (lambda d: (d / "comm_groups.json").write_text("[1, 2]"),
     "comm_groups.json: must map each communicator to a list of ranks")])
def test_another_tools_malformed_traces_are_one_line(tmp_path, damage, match):
    from simulator.base.fields import ScenarioError

    _foreign_trace(tmp_path / "t")
    damage(tmp_path / "t")
    raw = {"cluster": {"preset": "dgx-a100", "nodes": 1},
           "workload": {"chakra": str(tmp_path / "t"), "durations": "recorded"}}
    with pytest.raises(ScenarioError, match=match) as error:
        from_dict(raw)
    assert "\n" not in str(error.value)


def test_a_shared_clusters_jobs_round_trip_each_from_its_own_traces(tmp_path, capsys):
    """Each training job of scripts/scenarios/shared-cluster.yaml exported into a
    folder of its own and read back by its jobs entry (background traffic stays
    in the scenario): the same run, job by job."""
    path = ROOT / "scripts" / "scenarios" / "shared-cluster.yaml"
    assert main(["export-chakra", str(path), "--out", str(tmp_path)]) == 0
    assert "checkpoints: background traffic" in capsys.readouterr().out
    raw = yaml.safe_load(path.read_text())
    for name, job in raw["jobs"].items():
        if job.get("kind") != "background":
            for key in ("model", "training", "parallelism"):
                job.pop(key)
            job["workload"] = {"chakra": str(tmp_path / name)}
    again, first = run(from_dict(raw)), run(path)
    assert again.summary["jobs"] == first.summary["jobs"]
    assert again.comms.equals(first.comms)
