"""Hardening, round 3 (issue 55): Chakra traces under hostile input. Everything
read from a trace goes through one validation layer (``base.chakra_checks``):
wrong ranks (item 4), damaged metadata and files (5), NaN and other numbers out
of range (6, 13), errors naming the file and node (14); ``export-chakra``
never writes outside ``--out`` (3); a re-export keeps what a trace lacks (7)
and the MoE summary (8); compute-only traces run (1); and fuzz tests damage
valid exports and other tools' traces at random."""

from __future__ import annotations

import copy
import json
import math
import re
import shutil
import time
from pathlib import Path

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from simulator import run
from simulator.base.chakra_schema import NODE_TYPES, delimited, messages, varint
from simulator.cli import main
from simulator.config.scenario import from_dict
from tests.test_chakra import _foreign_trace
from tests.test_hardening import FUZZ, _bounded, _without_notes, one_error

TINY = {"name": "tiny", "cluster": {"preset": "dgx-a100", "nodes": 1},
        "model": {"layers": 2, "hidden": 256, "heads": 4, "vocab": 1000},
        "training": {"seq_len": 128, "global_batch": 8, "micro_batch": 1},
        "parallelism": {"tp": 2, "pp": 2, "dp": 2}}
MOE = {**TINY, "model": {**TINY["model"], "experts": 8, "top_k": 2, "expert_ffn_hidden": 256},
       "parallelism": {"ep": 8, "dp": 8}}
ONE_GPU = {**TINY, "cluster": {"preset": "dgx-a100", "nodes": 1, "gpus_per_node": 1},
           "parallelism": {"pp": 1, "dp": 1}}
_CACHE: dict[str, bytes] = {}


def _write(path: Path, raw: dict) -> Path:
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


def _exported(tmp: Path, raw: dict = TINY, name: str = "t") -> Path:
    """``raw``'s traces in ``tmp/name`` (exported once per scenario, then copied)."""
    out = tmp / name
    key = json.dumps(raw, sort_keys=True)
    if key not in _CACHE:
        source = _write(tmp / f"{name}.yaml", raw)
        assert main(["export-chakra", str(source), "--out", str(out)]) == 0
        _CACHE[key] = json.dumps({p.name: p.read_bytes().hex() for p in out.iterdir()})
    out.mkdir(exist_ok=True)
    for file, data in json.loads(_CACHE[key]).items():
        (out / file).write_bytes(bytes.fromhex(data))
    return out


def _importer(tmp: Path, traces: Path, cluster: dict | None = None, **workload) -> Path:
    return _write(tmp / "import.yaml", {"name": "imported", "cluster": cluster or TINY["cluster"],
                                        "workload": {"chakra": str(traces), **workload}})


def _run(tmp: Path, scenario: Path, *more: str) -> int:
    return _bounded(["run", str(scenario), "--out", str(tmp / "run"), *more])


def _frames(path: Path) -> list[bytes]:
    return delimited(path.read_bytes())


def _save(path: Path, frames: list[bytes]) -> None:
    path.write_bytes(b"".join(varint(len(f)) + f for f in frames))


def _edit_meta(traces: Path, edit) -> None:
    """Rewrite rank 0's clustersim metadata (its JSON) with ``edit(facts)``."""
    M = messages()
    frames = _frames(traces / "trace.0.et")
    meta = M["GlobalMetadata"].FromString(frames[0])
    for attr in meta.attr:
        if attr.name == "clustersim":
            facts = json.loads(attr.string_val)
            attr.string_val = json.dumps(edit(facts))
    frames[0] = meta.SerializeToString()
    _save(traces / "trace.0.et", frames)


def _edit_node(path: Path, index: int, edit) -> None:
    """Rewrite node ``index`` of a trace file with ``edit(node)``."""
    M = messages()
    frames = _frames(path)
    node = M["Node"].FromString(frames[1 + index])
    edit(node)
    frames[1 + index] = node.SerializeToString()
    _save(path, frames)


def _set_attr(node, name: str, **value) -> None:
    for attr in node.attr:
        if attr.name == name:
            attr.ClearField(attr.WhichOneof("value"))
            for key, v in value.items():
                setattr(attr, key, v)
            return
    node.attr.append(messages()["AttributeProto"](name=name, **value))


def _first(path: Path, kind: str) -> int:
    nodes = [messages()["Node"].FromString(f) for f in _frames(path)[1:]]
    return next(k for k, n in enumerate(nodes) if n.type == NODE_TYPES[kind])


def _refused(tmp: Path, capsys, traces: Path, pattern: str, **workload) -> str:
    code = _run(tmp, _importer(tmp, traces, **workload))
    err = one_error(capsys, code)
    assert err.startswith("error: workload.chakra: "), err
    assert re.search(pattern, err), err
    return err


# 4. wrong ranks -------------------------------------------------------------------

def _foreign(tmp: Path) -> Path:
    _foreign_trace(tmp / "f")
    return tmp / "f"


def _p2p(folder: Path, rank: int, src: int, dst: int, kind: str = "COMM_SEND_NODE") -> None:
    A = messages()["AttributeProto"]
    path = folder / f"workload.{rank}.et"
    frames = _frames(path)
    node = messages()["Node"](id=13, name="p2p", type=NODE_TYPES[kind], data_deps=[12], attr=[
        A(name="comm_src", int32_val=src), A(name="comm_dst", int32_val=dst),
        A(name="comm_size", int64_val=2**20)])
    _save(path, [*frames[:4], node.SerializeToString()])


@pytest.mark.parametrize(("rank", "src", "dst", "kind", "pattern"), [
    (2, 0, 1, "COMM_SEND_NODE", r"workload\.2\.et: node 13: a send from rank 0 in rank 2's "
                                r"trace"),
    (2, 0, 1, "COMM_RECV_NODE", r"workload\.2\.et: node 13: a receive by rank 1 in rank 2's"),
    (0, 0, 8, "COMM_SEND_NODE", r"workload\.0\.et: node 13: rank 8 is not a rank \(the trace "
                                r"has 8: 0 to 7\)"),
    (0, 0, -1, "COMM_SEND_NODE", "rank -1 is not a rank"),
    (0, 0, 0, "COMM_SEND_NODE", r"workload\.0\.et: node 13: a message from rank 0 to itself"),
])
def test_messages_naming_wrong_ranks_are_refused_at_load(tmp_path, capsys, rank, src, dst,
                                                        kind, pattern):
    traces = _foreign(tmp_path)
    _p2p(traces, rank, src, dst, kind)
    _refused(tmp_path, capsys, traces, pattern, durations="recorded")


def test_an_exports_message_in_the_wrong_ranks_trace_is_refused(tmp_path, capsys):
    traces = _exported(tmp_path)

    def swap(facts):
        facts["groups"]["pp.f0"] = [list(reversed(p)) for p in facts["groups"]["pp.f0"]]
        return facts
    _edit_meta(traces, swap)
    _refused(tmp_path, capsys, traces, r"trace\.0\.et: node \d+: a send from rank 4 in rank "
                                       r"0's trace")


# 5. damaged clustersim traces -------------------------------------------------------

@pytest.mark.parametrize(("edit", "pattern"), [
    (lambda f: {k: v for k, v in f.items() if k != "groups"}, "has no 'groups'"),
    (lambda f: {k: v for k, v in f.items() if k != "static_memory"}, "has no 'static_memory'"),
    (lambda f: {k: v for k, v in f.items() if k != "model_flops"}, "has no 'model_flops'"),
    (lambda f: {k: v for k, v in f.items() if k != "tokens"}, "has no 'tokens'"),
    (lambda f: [f], "must be a mapping, not list"),
    (lambda f: {**f, "groups": [1, 2]}, "groups must be a mapping"),
    (lambda f: {**f, "model_flops": "big"}, "model_flops must be a number, not 'big'"),
    (lambda f: {**f, "static_memory": [{"parameters": -1.0}] * 8},
     r"static_memory\[0\]\['parameters'\]: -1.0 must be a finite number, at least 0"),
    (lambda f: {**f, "groups": {**f["groups"], "dp": [[0, 0], [1, 3], [4, 6], [5, 7]]}},
     "rank 0 is given twice"),
    (lambda f: {**f, "groups": {**f["groups"], "dp": [[0, 9]]}}, "9 is not a rank"),
    (lambda f: {**f, "notes": {**f["notes"], "parameters": "many"}}, "'many' must be a finite"),
])
def test_damaged_metadata_is_one_line(tmp_path, capsys, edit, pattern):
    traces = _exported(tmp_path)
    _edit_meta(traces, edit)
    err = _refused(tmp_path, capsys, traces, pattern)
    assert "trace.0.et: its clustersim metadata" in err


def test_an_empty_rank_file_is_refused(tmp_path, capsys):
    traces = _exported(tmp_path)
    (traces / "trace.0.et").write_bytes(b"")
    _refused(tmp_path, capsys, traces, r"trace\.0\.et: is empty")
    traces = _foreign(tmp_path)
    (traces / "workload.3.et").write_bytes(b"")
    _refused(tmp_path, capsys, traces, r"workload\.3\.et: is empty", durations="recorded")


def test_an_export_without_its_metadata_is_not_read_as_another_tools(tmp_path, capsys):
    traces = _exported(tmp_path)
    frames = _frames(traces / "trace.0.et")
    frames[0] = messages()["GlobalMetadata"](version="0.0.4").SerializeToString()
    _save(traces / "trace.0.et", frames)
    _refused(tmp_path, capsys, traces, "carries clustersim's attributes, but trace.0.et has no "
                                       "clustersim metadata", durations="recorded")


# 6. numbers out of range -------------------------------------------------------------

@pytest.mark.parametrize("value", [math.nan, math.inf, -1e-3, 1e9])
def test_recorded_durations_are_finite_and_in_range(tmp_path, capsys, value):
    traces = _exported(tmp_path)
    k = _first(traces / "trace.2.et", "COMP_NODE")
    _edit_node(traces / "trace.2.et", k, lambda n: _set_attr(n, "cs.duration_s",
                                                             double_val=value))
    _refused(tmp_path, capsys, traces, rf"trace\.2\.et: node {k}: its duration .* must be a "
                                       "finite number from 0", durations="recorded")


@pytest.mark.parametrize(("attr", "value", "pattern"), [
    ("cs.flops", math.nan, "its FLOPs nan"), ("cs.bytes", -5.0, "its bytes -5 "),
    ("cs.bytes", "x", "its cs.bytes must be float"),
])
def test_an_exports_numbers_are_checked(tmp_path, capsys, attr, value, pattern):
    traces = _exported(tmp_path)
    kind = "double_val" if isinstance(value, float) else "string_val"
    _edit_node(traces / "trace.1.et", 0, lambda n: _set_attr(n, attr, **{kind: value}))
    _refused(tmp_path, capsys, traces, rf"trace\.1\.et: node 0: .*{pattern}")


# 13. another tool's values -----------------------------------------------------------

@pytest.mark.parametrize(("rank", "index", "attr", "value", "pattern"), [
    (1, 0, "num_ops", -10**12, "its FLOPs -1e\\+12"),
    (1, 0, "num_ops", 2**62, "faster than any GPU"),
    (1, 1, "comm_size", -2**20, "its bytes -1.04858e\\+06"),
    (1, 1, "comm_size", 1.5e300, r"its bytes 1\.5e\+300"),
])
def test_another_tools_numbers_are_checked(tmp_path, capsys, rank, index, attr, value, pattern):
    traces = _foreign(tmp_path)
    field = "int64_val" if isinstance(value, int) else "double_val"
    _edit_node(traces / f"workload.{rank}.et", index,
               lambda n: _set_attr(n, attr, **{field: value}))
    _refused(tmp_path, capsys, traces, rf"workload\.{rank}\.et: node 1\d: .*{pattern}",
             durations="recorded")


@pytest.mark.parametrize(("groups", "pattern"), [
    ({"1": [0, 1, 2, 3, 4, 5, 6, 7, 8]}, "8 is not a rank"),
    ({"1": [0, 1, 2, 3, 4, 5, 6, 7, 7]}, "rank 7 is given twice"),
    ({"1": [-1, 0, 1, 2, 3, 4, 5, 6, 7]}, "-1 is not a rank"),
    ({"1": []}, "must be a non-empty list"),
])
def test_comm_groups_name_real_ranks_once(tmp_path, capsys, groups, pattern):
    traces = _foreign(tmp_path)
    (traces / "comm_groups.json").write_text(json.dumps(groups))
    _refused(tmp_path, capsys, traces, rf"comm_groups\.json: communicator '1': .*{pattern}",
             durations="recorded")


def test_two_nodes_with_one_id_are_refused(tmp_path, capsys):
    traces = _foreign(tmp_path)
    _edit_node(traces / "workload.4.et", 2, lambda n: setattr(n, "id", 10))
    _refused(tmp_path, capsys, traces, r"workload\.4\.et: node 10: a second node with this id",
             durations="recorded")


def test_a_trace_too_large_is_refused_before_it_is_read(tmp_path, capsys):
    traces = _foreign(tmp_path)
    frames = _frames(traces / "workload.0.et")
    _save(traces / "workload.0.et", [frames[0], *[frames[1]] * 300_000])
    began = time.monotonic()
    _refused(tmp_path, capsys, traces, r"workload\.0\.et: holds 300,000 nodes, more than the "
                                       "200,000", durations="recorded")
    assert time.monotonic() - began < 20


# 14. errors name the file and node ---------------------------------------------------

def test_a_message_without_its_peer_names_the_file_and_node(tmp_path, capsys):
    traces = _foreign(tmp_path)
    _edit_node(traces / "workload.0.et", 3, lambda n: n.ClearField("attr"))
    _refused(tmp_path, capsys, traces, r"workload\.0\.et: node 13: has no comm_src attribute",
             durations="recorded")


def test_comm_groups_that_are_not_json_are_named(tmp_path, capsys):
    traces = _foreign(tmp_path)
    (traces / "comm_groups.json").write_text("{1: [0")
    _refused(tmp_path, capsys, traces, r"f/comm_groups\.json: is not JSON",
             durations="recorded")


# 3. export-chakra writes inside --out -----------------------------------------------

def _two_jobs(names: tuple[str, str]) -> dict:
    job = {"nodes": 1, "model": TINY["model"], "training": TINY["training"],
           "parallelism": {"dp": 8}}
    return {"name": "jobs", "cluster": {"preset": "dgx-a100", "nodes": 2},
            "jobs": {names[0]: {**job, "nodes": [0]}, names[1]: {**job, "nodes": [1]}}}


@pytest.mark.parametrize("name", ["..", "../../x", "ABS", "a/b"])
def test_job_names_cannot_lead_out_of_out(tmp_path, capsys, name):
    outside = tmp_path / "outside"
    name = str(outside) if name == "ABS" else name
    source = _write(tmp_path / "jobs.yaml", _two_jobs((name, "ok")))
    out = tmp_path / "deep" / "er" / "out"
    code = main(["export-chakra", str(source), "--out", str(out)])
    assert code == 0, capsys.readouterr().err
    written = {p for p in tmp_path.rglob("*") if p.is_file()}
    assert all(out in p.parents for p in written if p.suffix in (".et", ".json")), written
    assert not outside.exists()
    folders = [p for p in out.iterdir() if p.is_dir()]
    assert len(folders) == 2 and all((f / "trace.0.et").is_file() for f in folders)


def test_symbolic_links_inside_out_are_not_written_through(tmp_path, capsys):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "trace.0.et").write_text("keep")
    out = tmp_path / "out"
    out.mkdir()
    (out / "trace.0.et").symlink_to(outside / "trace.0.et")
    (out / "comm_groups.json").symlink_to(outside / "comm_groups.json")
    assert main(["export-chakra", str(_write(tmp_path / "s.yaml", TINY)), "--out",
                 str(out)]) == 0
    assert (outside / "trace.0.et").read_text() == "keep"
    assert not (outside / "comm_groups.json").exists()
    assert not (out / "trace.0.et").is_symlink()
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "ok").symlink_to(outside, target_is_directory=True)
    code = main(["export-chakra", str(_write(tmp_path / "j.yaml", _two_jobs(("a", "ok")))),
                 "--out", str(jobs)])
    assert "is a symbolic link" in one_error(capsys, code)
    assert sorted(p.name for p in outside.iterdir()) == ["trace.0.et"]
    assert not (jobs / "a").exists()  # (refused before anything was written)


# 7. a re-export keeps what the traces lack ---------------------------------------------

def test_a_reexport_of_another_tools_traces_still_refuses_model_durations(tmp_path, capsys):
    traces = _foreign(tmp_path)
    first = run(from_dict(yaml.safe_load(_importer(tmp_path, traces,
                                                   durations="recorded").read_text())))
    for n in range(3):
        source = _importer(tmp_path, traces, durations="recorded")
        again = tmp_path / f"again{n}"
        assert main(["export-chakra", str(source), "--out", str(again)]) == 0
        traces = again
        code = _run(tmp_path, _importer(tmp_path, traces))
        assert "needs the kernels' shapes" in one_error(capsys, code)
    last = run(from_dict(yaml.safe_load(_importer(tmp_path, traces,
                                                  durations="recorded").read_text())))
    assert last.summary["iteration_time_s"] == first.summary["iteration_time_s"]


# 8. the MoE summary survives a round trip ----------------------------------------------

MOE_KEYS = ("moe_routing", "moe_rank_imbalance", "moe_expert_imbalance", "moe_dropped_fraction",
            "moe_a2a_s", "moe_a2a_hidden_s", "moe_imbalance_s")


def test_a_round_trip_keeps_the_moe_summary(tmp_path, capsys):
    traces = _exported(tmp_path, MOE)
    again = run(from_dict(yaml.safe_load(_importer(tmp_path, traces).read_text()))).summary
    first = run(from_dict(copy.deepcopy(MOE))).summary
    assert {k: again.get(k) for k in MOE_KEYS} == {k: first[k] for k in MOE_KEYS}
    assert _run(tmp_path, _importer(tmp_path, traces)) == 0
    assert "experts " in capsys.readouterr().out


def test_a_jobs_round_trip_keeps_its_moe_summary(tmp_path, capsys):
    job = {"nodes": [0], "model": MOE["model"], "training": TINY["training"],
           "parallelism": MOE["parallelism"]}
    dense = {"nodes": [1], "model": TINY["model"], "training": TINY["training"],
             "parallelism": {"dp": 8}}
    raw = {"name": "jobs", "cluster": {"preset": "dgx-a100", "nodes": 2},
           "jobs": {"moe": job, "dense": dense}}
    assert main(["export-chakra", str(_write(tmp_path / "j.yaml", raw)), "--out",
                 str(tmp_path / "x")]) == 0
    traced = copy.deepcopy(raw)
    for name in ("moe", "dense"):
        traced["jobs"][name] = {"nodes": raw["jobs"][name]["nodes"],
                                "workload": {"chakra": str(tmp_path / "x" / name)}}
    again = {j["name"]: j for j in run(from_dict(traced)).summary["jobs"]}
    first = {j["name"]: j for j in run(from_dict(raw)).summary["jobs"]}
    assert {k: again["moe"].get(k) for k in MOE_KEYS} == {k: first["moe"][k] for k in MOE_KEYS}


# 1. traces with no communication ----------------------------------------------------

def _compute_only(folder: Path, ranks: int = 8) -> None:
    M = messages()
    folder.mkdir()
    for rank in range(ranks):
        nodes = [M["Node"](id=k, name="c", type=NODE_TYPES["COMP_NODE"], duration_micros=100,
                           data_deps=[k - 1] if k else []) for k in range(3)]
        _save(folder / f"et.{rank}.et", [M["GlobalMetadata"](version="0.0.4").SerializeToString(),
                                         *(n.SerializeToString() for n in nodes)])


def test_compute_only_traces_run_with_an_empty_communication_log(tmp_path, capsys):
    _compute_only(tmp_path / "c")
    result = run(from_dict(yaml.safe_load(_importer(tmp_path, tmp_path / "c",
                                                    durations="recorded").read_text())))
    assert len(result.comms) == 0 and result.summary["iteration_time_s"] > 0
    traces = _exported(tmp_path, ONE_GPU, "one")
    code = _run(tmp_path, _importer(tmp_path, traces, cluster=ONE_GPU["cluster"]))
    assert code == 0, capsys.readouterr().err


# fuzz: random damage to valid exports and to other tools' traces ------------------------

DAMAGE = st.sampled_from(["truncate", "drop", "retype", "nan", "inf", "negative", "huge",
                          "rank", "duplicate", "meta"])
ATTRS = ["cs.duration_s", "cs.flops", "cs.bytes", "cs.kind", "cs.stream", "cs.group",
         "cs.layer", "cs.shape", "comm_src", "comm_dst", "comm_size", "num_ops", "pg_name",
         "comm_type", "tensor_size", "cs.microbatch", "cs.kernel"]
META_KEYS = ["ranks", "groups", "static_memory", "model_flops", "tokens", "stage", "steps",
             "notes", "scenario", "foreign"]
FUZZ_VALUES = [None, -1, 0, 2**62, 1.5, math.nan, math.inf, "x", [], {}, [[0, 9]], True]


def _damage(folder: Path, how: str, pick: int, attr: str, value) -> None:
    files = sorted(folder.glob("*.et"))
    path = files[pick % len(files)]
    try:
        frames = _frames(path)
        [messages()["Node"].FromString(f) for f in frames[1:2]]
    except Exception:  # noqa: BLE001 - already damaged past editing
        return
    k = 1 + pick % max(1, len(frames) - 1)
    if how == "truncate":
        path.write_bytes(path.read_bytes()[: pick % max(1, path.stat().st_size)])
    elif how == "meta":
        if "trace.0.et" in (p.name for p in files) and _CLUSTERSIM in frames[0]:
            _edit_meta(folder, lambda f: _meta_edit(f, META_KEYS[pick % len(META_KEYS)], value))
    elif how == "duplicate" and len(frames) > 2:
        _save(path, [*frames[:k], frames[k], *frames[k:]])
    elif len(frames) > 1:
        _edit_node(path, k - 1, lambda n: _node_edit(n, how, attr, pick))


_CLUSTERSIM = b"clustersim"


def _meta_edit(facts: dict, key: str, value) -> object:
    if not isinstance(facts, dict):
        return facts
    if value is None:
        facts.pop(key, None)
    else:
        facts[key] = value
    return facts


def _node_edit(node, how: str, attr: str, pick: int) -> None:
    if how == "drop":
        kept = [a for a in node.attr if a.name != attr]
        del node.attr[:]
        node.attr.extend(kept)
    elif how == "retype":
        _set_attr(node, attr, string_val="x")
    elif how == "rank":
        _set_attr(node, attr if attr in ("comm_src", "comm_dst") else "comm_dst",
                  int32_val=(-1, 99, 0, 8)[pick % 4])
    elif how == "duplicate":
        node.id = 0
    else:
        value = {"nan": math.nan, "inf": math.inf, "negative": -3.0, "huge": 1e30}[how]
        numeric = attr.startswith("cs.") and attr not in ("cs.kind", "cs.stream", "cs.group",
                                                          "cs.kernel", "cs.shape")
        _set_attr(node, attr, **({"double_val": value} if numeric else {
            "int64_val": -3 if how == "negative" else 2**62}))


def _fuzz_run(tmp: Path, capsys, traces: Path, edits) -> None:
    for how, pick, attr, value in edits:
        _damage(traces, how, pick, attr, value)
    code = _run(tmp, _importer(tmp, traces, durations="recorded"))
    err = _without_notes(capsys.readouterr().err)
    assert code in (0, 2), (edits, err)
    assert "Traceback" not in err and err.count("\n") == (code == 2), (edits, err)


EDITS = st.lists(st.tuples(DAMAGE, st.integers(0, 10**6), st.sampled_from(ATTRS),
                           st.sampled_from(FUZZ_VALUES)), min_size=1, max_size=3)


@FUZZ
@given(EDITS)
def test_fuzzed_exports_end_in_a_result_or_one_line(tmp_path, capsys, edits):
    _fuzz_run(tmp_path, capsys, _exported(tmp_path), edits)


@FUZZ
@given(EDITS)
def test_fuzzed_foreign_traces_end_in_a_result_or_one_line(tmp_path, capsys, edits):
    shutil.rmtree(tmp_path / "f", ignore_errors=True)
    _fuzz_run(tmp_path, capsys, _foreign(tmp_path), edits)


def test_ranks_whose_calls_do_not_match_are_refused_at_load(tmp_path, capsys):
    """(Found by the fuzz: a rank's trace cut after its metadata deadlocked the run.)"""
    traces = _foreign(tmp_path)
    _save(traces / "workload.0.et", _frames(traces / "workload.0.et")[:2])
    _refused(tmp_path, capsys, traces, r"workload\.\d\.et: node 11: call 0 of communicator "
                                       r"'pg\.1' .*: rank 1 makes all_reduce of .* B, "
                                       "rank 0 none; they would wait for each other",
             durations="recorded")


FP8_H100 = {**TINY, "cluster": {"preset": "dgx-h100", "nodes": 1},
            "training": {**TINY["training"], "precision": "fp8"}}


def test_fp8_traces_replayed_as_recorded_run_on_a_gpu_without_fp8(tmp_path, capsys):
    """Item 18: recorded durations need no compute model, so an A100 replays an
    H100 FP8 run's traces (MFU against its BF16 peak, no low-precision figure);
    re-timing them on it is refused, naming the workload and why."""
    traces = _exported(tmp_path, FP8_H100, "fp8")
    a100 = {"preset": "dgx-a100", "nodes": 1}
    result = run(_importer(tmp_path, traces, a100, durations="recorded"))
    summary = result.summary
    assert result.scenario.training.precision == "fp8" and "mfu_lowp" not in summary
    assert summary["compute_model"].startswith("recorded durations of the traces")
    on_h100 = run(_importer(tmp_path, traces, FP8_H100["cluster"], durations="recorded"))
    compute = result.spans[result.spans["stream"] == "compute"]
    traced = on_h100.spans[on_h100.spans["stream"] == "compute"]
    assert (compute["end"] - compute["start"]).sum() == pytest.approx(
        (traced["end"] - traced["start"]).sum())
    scenario = _importer(tmp_path, traces, a100, durations="model")
    assert main(["run", str(scenario), "--out", str(tmp_path / "m")]) == 2
    error = capsys.readouterr().err
    assert error.startswith("error: workload.durations: model re-times the traces' kernels on "
                            "a100") and "give durations: recorded" in error
