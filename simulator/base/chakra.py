"""A program as Chakra execution traces, and back (``chakra_schema``: the format).

``write`` puts one file per rank, ``trace.{rank}.et`` (ASTRA-sim's
``--workload-configuration=DIR/trace``), and ``comm_groups.json`` (each
communicator's id and ranks, its ``--comm-group-configuration``). Each op is a
node: compute a ``COMP_NODE`` (its duration in ``duration_micros``, its FLOPs in
``num_ops``, its bytes in ``tensor_size``), a collective a ``COMM_COLL_NODE``
(``comm_type``, ``comm_size`` in bytes, ``pg_name``: its communicator's id), a
message a ``COMM_SEND_NODE`` or ``COMM_RECV_NODE`` (``comm_src``, ``comm_dst``,
``comm_tag``); ``ctrl_deps`` holds the previous op of the node's stream (a
stream runs its ops in order), ``data_deps`` the ops of other streams it waits
for. ``cs.*`` attributes keep what Chakra has no field for (the stream, phase,
kernel class and shape, micro-batch, layer, memory events, the exact duration
in seconds), and rank 0's metadata the program's facts (groups, static memory,
stages, pipeline steps, model FLOPs, tokens, notes) and the scenario's
sections, so ``read`` gives back the same program: the same run, op for op.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.base.chakra_checks import (
    TraceError,
    check_metadata,
    check_notes,
    check_program,
    check_sizes,
    check_steps,
    framed,
)
from simulator.base.chakra_foreign import read_foreign
from simulator.base.chakra_notes import plain, restored
from simulator.base.chakra_schema import COLLECTIVES, NODE_TYPES, messages, varint
from simulator.base.ir import Collective, KernelClass, Op, OpKind, Phase, Program

VERSION = "0.0.4"  # Chakra's schema version the files declare
META = "clustersim"  # rank 0's metadata attribute holding the program's facts (JSON)
CHAKRA_COLLECTIVE = {Collective.ALL_REDUCE: "ALL_REDUCE", Collective.ALL_GATHER: "ALL_GATHER",
                     Collective.REDUCE_SCATTER: "REDUCE_SCATTER",
                     Collective.BROADCAST: "BROADCAST", Collective.REDUCE: "REDUCE",
                     Collective.ALL_TO_ALL: "ALL_TO_ALL"}  # (others: ALL_TO_ALL's number)
KIND_NODE = {OpKind.COMPUTE: "COMP_NODE", OpKind.COLLECTIVE: "COMM_COLL_NODE",
             OpKind.SEND: "COMM_SEND_NODE", OpKind.RECV: "COMM_RECV_NODE"}


@dataclass(frozen=True)
class Trace:
    """A program read from Chakra traces, each rank's recorded compute durations
    (seconds, per op; 0 for communication) and the writer's facts."""

    program: Program
    durations: tuple[np.ndarray, ...]
    facts: Mapping[str, object]

    @property
    def kernels(self) -> bool:
        """Whether every compute op names its kernel (what re-timing needs: another
        tool's traces, and their re-exports, do not)."""
        unique = {id(ops): ops for ops in self.program.ops}.values()
        return not self.facts.get("foreign") and all(
            op.kernel is not None for ops in unique for op in ops if op.kind is OpKind.COMPUTE)


def write(program: Program, durations: Callable[[int], np.ndarray], folder: str | Path,
          facts: Mapping[str, object]) -> list[Path]:
    """Write ``program`` (``durations(rank)``: its ops' compute seconds) as one
    Chakra trace per rank into ``folder``, ``facts`` (JSON-able) in rank 0's
    metadata; the files written."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    ids = {(dim, k): n for n, (dim, k) in enumerate(
        ((dim, k) for dim, groups in program.groups.items() for k in range(len(groups))),
        start=1)}
    index = {dim: {r: k for k, g in enumerate(groups) for r in g}
             for dim, groups in program.groups.items()}
    written = []
    for rank, ops in enumerate(program.ops):
        path = _fresh(folder / f"trace.{rank}.et")
        with open(path, "wb") as file:
            _put(file, _metadata(program, facts if rank == 0 else None))
            seconds = durations(rank)
            last: dict[str, int] = {}
            for i, op in enumerate(ops):
                _put(file, _node(i, op, float(seconds[i]), last.get(op.stream), rank,
                                 program.groups, index, ids))
                last[op.stream] = i
        written.append(path)
    groups = {str(n): list(program.groups[dim][k]) for (dim, k), n in ids.items()}
    _fresh(folder / "comm_groups.json").write_text(json.dumps(groups))
    return written


def _fresh(path: Path) -> Path:
    """``path`` with a symbolic link there removed: a file is written in its
    folder, never through a link to somewhere else."""
    if path.is_symlink():
        path.unlink()
    return path


def _put(file, message) -> None:
    data = message.SerializeToString()
    file.write(varint(len(data)) + data)


def _metadata(program: Program, facts: Mapping[str, object] | None):
    M = messages()
    meta = M["GlobalMetadata"](version=VERSION)
    meta.attr.append(M["AttributeProto"](name="schema", string_val=f"1.0.2-chakra.{VERSION}"))
    if facts is not None:
        own = {"ranks": program.ranks, "groups": {d: [list(g) for g in gs]
                                                  for d, gs in program.groups.items()},
               "static_memory": [dict(m) for m in program.static_memory],
               "model_flops": program.model_flops, "tokens": program.tokens,
               "stage": list(program.stage), "steps": [list(r) for r in program.steps],
               "notes": plain(program.notes), **facts}
        meta.attr.append(M["AttributeProto"](name=META, string_val=json.dumps(own)))
    return meta


def _attr(name: str, **value):
    return messages()["AttributeProto"](name=name, **value)


def _node(i: int, op: Op, seconds: float, previous: int | None, rank: int, groups, index, ids):
    """The Chakra node of ``op``, the ``i``-th of ``rank``'s program."""
    node = messages()["Node"](id=i, name=op.name, type=NODE_TYPES[KIND_NODE[op.kind]])
    node.ctrl_deps.extend([] if previous is None else [previous])
    node.data_deps.extend(op.deps)
    attrs = [_attr("cs.kind", string_val=op.kind.value), _attr("cs.stream", string_val=op.stream),
             _attr("cs.phase", string_val=op.phase.value),
             _attr("cs.microbatch", int64_val=op.microbatch),
             _attr("cs.layer", int64_val=op.layer), _attr("cs.bytes", double_val=op.bytes)]
    if op.mem:
        attrs += [_attr("cs.mem_bytes", double_list={"values": [b for b, _ in op.mem]}),
                  _attr("cs.mem_category", string_list={"values": [c for _, c in op.mem]})]
    if op.kind is OpKind.COMPUTE:
        node.duration_micros = round(seconds * 1e6)
        attrs += [_attr("is_cpu_op", bool_val=False), _attr("num_ops", int64_val=int(op.flops)),
                  _attr("tensor_size", uint64_val=int(op.bytes)),
                  _attr("cs.duration_s", double_val=seconds),
                  _attr("cs.flops", double_val=op.flops)]
        attrs += [_attr("cs.kernel", string_val=op.kernel.value)] if op.kernel else []
        attrs += [_attr("cs.shape", int64_list={"values": list(op.shape)})] if op.shape else []
    else:
        k = index[op.group][rank]
        attrs += [_attr("cs.group", string_val=op.group), _attr("pg_name", string_val=str(
            ids[(op.group, k)])), _attr("comm_size", int64_val=int(op.bytes))]
    if op.kind is OpKind.COLLECTIVE:
        attrs += [_attr("cs.collective", string_val=op.collective.value), _attr(
            "comm_type", int64_val=COLLECTIVES[CHAKRA_COLLECTIVE.get(op.collective, "ALL_TO_ALL")])]
    elif op.kind in (OpKind.SEND, OpKind.RECV):
        pair = groups[op.group][index[op.group][rank]]
        attrs += [_attr("comm_src", int32_val=pair[0]), _attr("comm_dst", int32_val=pair[-1]),
                  _attr("comm_tag", int32_val=ids[(op.group, index[op.group][rank])])]
    node.attr.extend(attrs)
    return node


def read(folder: str | Path) -> Trace:
    """The program of the Chakra traces in ``folder``: written by ``write``, op for
    op; another tool's, from Chakra's fields (``chakra_foreign``). Everything
    read is checked (``chakra_checks``): a ``TraceError`` naming the file, the
    node and what is wrong otherwise."""
    folder = Path(folder)
    first = folder / "trace.0.et"
    head = framed(first) if first.is_file() else None
    if head == []:
        check_sizes({first: head})
    facts = _facts(head[0], first) if head else None
    if facts is None:  # another tool's traces: what Chakra's fields say
        try:
            program, durations, facts, paths, ids = read_foreign(folder)
        except TraceError:
            raise
        except Exception as error:  # noqa: BLE001 - anything unforeseen: still one line
            raise TraceError(f"{folder}: {type(error).__name__}: {error}") from None
    else:
        program, durations, paths = _own(folder, facts, first)
        ids = [range(len(ops)) for ops in program.ops]
    check_program(program, durations, paths, ids)
    return Trace(program, tuple(durations), facts)


def _own(folder: Path, facts: dict, first: Path) -> tuple[Program, list, list[Path]]:
    """The program ``write`` wrote into ``folder`` (``facts``: rank 0's metadata)."""
    check_metadata(facts, first)
    ranks = facts["ranks"]
    paths = [folder / f"trace.{rank}.et" for rank in range(ranks)]
    for path in paths:
        if not path.is_file():
            raise TraceError(f"{folder}: {path.name} is missing ({ranks} ranks traced)")
    found = {path: framed(path) for path in paths}
    check_sizes(found)
    shared: dict[tuple, tuple[Op, ...]] = {}
    ops, durations = [], []
    for path in paths:
        _header(found[path][:1], path)
        mine, seconds = _ops(found[path][1:], path)
        ops.append(shared.setdefault(mine, mine))  # (ranks of one program share its ops)
        durations.append(seconds)
    check_steps(facts.get("steps") or [], [len(o) for o in ops], first)
    try:
        notes = restored(facts.get("notes") or {})
    except (TypeError, ValueError) as error:
        raise TraceError(f"{first}: its clustersim metadata's notes: {error}") from None
    check_notes(notes, first)
    program = Program(tuple(ops), {d: tuple(tuple(g) for g in gs)
                                   for d, gs in facts["groups"].items()},
                      tuple(facts["static_memory"]), float(facts["model_flops"]),
                      int(facts["tokens"]), tuple(facts["stage"]), notes,
                      tuple(tuple(_tuples(s) for s in r) for r in facts.get("steps") or ()))
    return program, durations, paths


def _tuples(value):
    """``value`` with JSON's lists back as tuples (a pipeline step's key).

    >>> _tuples([16, 131, [True, 0, ["a", 1]]])
    (16, 131, (True, 0, ('a', 1)))
    """
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value



def _header(found: list[bytes], path: Path) -> None:
    """A trace file starts with Chakra's metadata (with its schema version)."""
    try:
        version = messages()["GlobalMetadata"].FromString(found[0]).version if found else ""
    except Exception:  # noqa: BLE001 - protobuf's DecodeError and kin
        version = ""
    if not version:
        raise TraceError(f"{path}: does not start with Chakra's metadata (a schema version)")


def _facts(data: bytes, path: Path) -> dict | None:
    M = messages()
    try:
        meta = M["GlobalMetadata"].FromString(data)
    except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and kin
        raise TraceError(f"{path}: the first message is not Chakra metadata ({error})") from None
    said = {a.name: a.string_val for a in meta.attr}
    if META not in said:
        return None  # (not clustersim's: ``chakra_foreign``)
    try:
        return json.loads(said[META])
    except ValueError as error:
        raise TraceError(f"{path}: its clustersim metadata is not JSON ({error})") from None


def _ops(nodes: list[bytes], path: Path) -> tuple[tuple[Op, ...], np.ndarray]:
    Node = messages()["Node"]
    ops, seconds = [], []
    for n, data in enumerate(nodes):
        try:
            node = Node.FromString(data)
            op, duration = _op(node)
        except KeyError as error:
            raise TraceError(f"{path}: node {n}: has no {error.args[0]} attribute (clustersim "
                             "writes it on every node)") from None
        except Exception as error:  # noqa: BLE001 - any malformed node: one line
            raise TraceError(f"{path}: node {n}: {type(error).__name__}: {error}") from None
        if node.id != n or any(d >= n for d in node.data_deps):
            raise TraceError(f"{path}: node {n} has id {node.id} or depends on a later node")
        ops.append(op)
        seconds.append(duration)
    return tuple(ops), np.array(seconds, dtype=float)


def _op(node) -> tuple[Op, float]:
    a = {x.name: getattr(x, x.WhichOneof("value")) for x in node.attr if x.WhichOneof("value")}
    kind = OpKind(_of(a, "cs.kind", str))
    mem = tuple(zip(_of(a, "cs.mem_bytes", float, True), _of(a, "cs.mem_category", str, True),
                    strict=True)) if "cs.mem_bytes" in a else ()
    common = dict(kind=kind, name=node.name, stream=_of(a, "cs.stream", str),
                  phase=Phase(_of(a, "cs.phase", str)), deps=tuple(node.data_deps),
                  bytes=_of(a, "cs.bytes", float), microbatch=_of(a, "cs.microbatch", int),
                  layer=_of(a, "cs.layer", int), mem=mem)
    if kind is OpKind.COMPUTE:
        shape = tuple(_of(a, "cs.shape", int, True)) if "cs.shape" in a else None
        if shape is not None and not all(0 <= v < 2**48 for v in shape):
            raise ValueError(f"its cs.shape {shape} must be sizes from 0 to 2**48")
        kernel = KernelClass(_of(a, "cs.kernel", str)) if "cs.kernel" in a else None
        return Op(**common, kernel=kernel, flops=_of(a, "cs.flops", float), shape=shape), \
            _of(a, "cs.duration_s", float)
    collective = Collective(_of(a, "cs.collective", str)) if kind is OpKind.COLLECTIVE else None
    return Op(**common, collective=collective, group=_of(a, "cs.group", str)), 0.0


KINDS = {str: (str,), int: (int,), float: (int, float)}


def _of(a: Mapping, key: str, kind: type, listed: bool = False):
    """Attribute ``key`` of a node (``a``: name to value), of ``kind`` (a list of
    them if ``listed``); ValueError naming it otherwise (KeyError if absent)."""
    value = a[key]
    values = list(getattr(value, "values", ())) if listed else [value]
    if (listed and not hasattr(value, "values")) or not all(
            isinstance(v, KINDS[kind]) and not isinstance(v, bool) for v in values):
        raise ValueError(f"its {key} must be {'a list of ' if listed else ''}"
                         f"{kind.__name__}, not {value!r:.60}")
    return values if listed else kind(value)
