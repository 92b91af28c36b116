"""Chakra traces that another tool wrote (PyTorch's execution-trace observer
through Chakra's converter, ASTRA-sim's generators), read as a program: they
carry no clustersim metadata, so what Chakra's documented fields say is all
there is.

- files ``PREFIX.RANK.et`` (one prefix, ranks 0 to N-1) and, where
  communicators are named, ``comm_groups.json`` (``{pg_name: [ranks]}``);
- a ``COMP_NODE`` is a compute op of its recorded duration
  (``duration_micros``; its FLOPs ``num_ops`` and bytes ``tensor_size``); other
  non-communication nodes (memory loads and stores, metadata) likewise;
- a ``COMM_COLL_NODE`` is a collective (``comm_type``, ``comm_size`` bytes) of
  its communicator (``pg_name``; none: every rank), on the data-parallel stream;
- a ``COMM_SEND_NODE``/``COMM_RECV_NODE`` a message between ``comm_src`` and
  ``comm_dst``, on the pipeline stream;
- ``data_deps`` and ``ctrl_deps`` order the nodes (sorted topologically).

What it cannot say: streams (a rank's collectives run one after another here,
where ASTRA-sim may run independent ones at once), phases, kernel shapes (so
compute keeps its recorded durations: ``workload.durations: recorded``) and
memory. The scenario's model, training and parallelism are a placeholder of
the trace's rank count (data parallel over every rank).
"""

from __future__ import annotations

import json
import math
import re
from collections import deque
from pathlib import Path

import numpy as np

from simulator.base.chakra_checks import TraceError, check_ranks, check_sizes, framed
from simulator.base.chakra_schema import COLLECTIVES, NODE_TYPES, messages
from simulator.base.ir import DP_STREAM, PP_STREAM, Collective, Op, OpKind, Phase, Program

OF_CHAKRA = {number: name for name, number in COLLECTIVES.items()}
COLLECTIVE = {"ALL_REDUCE": Collective.ALL_REDUCE, "REDUCE": Collective.REDUCE,
              "ALL_GATHER": Collective.ALL_GATHER, "REDUCE_SCATTER": Collective.REDUCE_SCATTER,
              "REDUCE_SCATTER_BLOCK": Collective.REDUCE_SCATTER,
              "BROADCAST": Collective.BROADCAST, "ALL_TO_ALL": Collective.ALL_TO_ALL}
WORLD = "world"  # the communicator of a collective that names none


def files(folder: Path) -> list[Path]:
    """The traces ``PREFIX.RANK.et`` of ``folder``, by rank; TraceError unless one
    prefix covers ranks 0 to N-1."""
    found: dict[str, dict[int, Path]] = {}
    for path in folder.glob("*.et"):
        match = re.fullmatch(r"(.+)\.(\d+)\.et", path.name)
        if match:
            found.setdefault(match[1], {})[int(match[2])] = path
    if len(found) != 1:
        raise TraceError(f"{folder}: holds {'no' if not found else 'several'} sets of Chakra "
                         "traces (PREFIX.RANK.et, one prefix)")
    ((prefix, ranks),) = found.items()
    if sorted(ranks) != list(range(len(ranks))):
        missing = min(set(range(len(ranks))) - set(ranks))
        raise TraceError(f"{folder}: the traces' ranks are not 0 to {len(ranks) - 1}: "
                         f"{prefix}.{missing}.et is missing")
    return [ranks[r] for r in range(len(ranks))]


def read_foreign(folder: Path) -> tuple[Program, list[np.ndarray], dict, list[Path], list]:
    """(the program, each rank's recorded durations, its facts, each rank's file,
    each op's node id) of ``folder``'s traces; TraceError naming the file and
    node of anything malformed (``chakra_checks`` checks the program)."""
    paths = files(folder)
    found = {path: framed(path) for path in paths}
    check_sizes(found)
    named = _groups(folder, len(paths))
    groups: dict[str, tuple[tuple[int, ...], ...]] = {WORLD: (tuple(range(len(paths))),)}
    ops, durations, ids, flops = [], [], [], 0.0
    for rank, path in enumerate(paths):
        mine, seconds, order = [], [], []
        position: dict[int, int] = {}
        for node in _ordered(_nodes(found[path][1:], path), path):
            try:
                op, second = _op(node, rank, named, groups, position)
            except ValueError as error:
                raise TraceError(f"{path}: node {node.id}: {error}") from None
            position[node.id] = len(mine)
            mine.append(op)
            seconds.append(second)
            order.append(node.id)
            flops += op.flops
        ops.append(tuple(mine))
        durations.append(np.array(seconds, dtype=float))
        ids.append(order)
    n = len(paths)
    facts = {"ranks": n, "foreign": True, "scenario": {
        "model": {"layers": 1, "hidden": 128, "heads": 1,
                  "kv_heads": 1, "ffn_hidden": 512, "vocab": 128},
        "training": {"seq_len": 1, "global_batch": n, "micro_batch": 1},
        "parallelism": {"dp": n}}}
    program = Program(tuple(ops), groups, tuple({} for _ in range(n)), flops, 0)
    return program, durations, facts, paths, ids



def _nodes(data: list[bytes], path: Path) -> list:
    """The nodes of a file, each parsed; one line naming the file and node if not."""
    Node = messages()["Node"]
    out = []
    for n, message in enumerate(data):
        try:
            out.append(Node.FromString(message))
        except Exception as error:  # noqa: BLE001 - protobuf's DecodeError and kin
            raise TraceError(f"{path}: message {n + 1} is not a Chakra node ({error})") from None
        if any(a.name.startswith("cs.") for a in out[-1].attr):
            raise TraceError(f"{path}: node {out[-1].id} carries clustersim's attributes, but "
                             "trace.0.et has no clustersim metadata: a clustersim export "
                             "whose rank 0 trace is missing or damaged")
    return out


def _groups(folder: Path, ranks: int) -> dict[str, tuple[int, ...]]:
    path = folder / "comm_groups.json"
    if not path.is_file():
        return {}
    try:
        raw = json.loads(path.read_bytes())
    except (OSError, ValueError) as error:
        raise TraceError(f"{path}: is not JSON ({error})") from None
    if not isinstance(raw, dict) or not all(isinstance(v, list) for v in raw.values()):
        raise TraceError(f"{path}: must map each communicator to a list of ranks")
    for name, group in raw.items():
        check_ranks([group], ranks, f"{path}: communicator {name!r}")
    return {str(k): tuple(v) for k, v in raw.items()}


def _ordered(nodes: list, path: Path) -> list:
    """The nodes in an order that respects their dependencies (file order where free)."""
    index: dict[int, int] = {}
    for k, node in enumerate(nodes):
        if index.setdefault(node.id, k) != k:
            raise TraceError(f"{path}: node {node.id}: a second node with this id")
    waiting = [0] * len(nodes)
    after: list[list[int]] = [[] for _ in nodes]
    for k, node in enumerate(nodes):
        for d in {*node.data_deps, *node.ctrl_deps}:
            if d not in index:
                raise TraceError(f"{path}: node {node.id} depends on node {d}, which is not "
                                 "there")
            waiting[k] += 1
            after[index[d]].append(k)
    ready = deque(k for k in range(len(nodes)) if not waiting[k])
    out = []
    while ready:
        k = ready.popleft()
        out.append(nodes[k])
        for j in after[k]:
            waiting[j] -= 1
            if not waiting[j]:
                ready.append(j)
    if len(out) < len(nodes):
        raise TraceError(f"{path}: the nodes' dependencies form a cycle")
    return out


def _op(node, rank: int, named: dict, groups: dict, position: dict) -> tuple[Op, float]:
    """A node as an op (registering its communicator's group) and its duration;
    ValueError saying what is wrong with it."""
    a = {x.name: getattr(x, x.WhichOneof("value")) for x in node.attr if x.WhichOneof("value")}
    deps = tuple(sorted({position[d] for d in (*node.data_deps, *node.ctrl_deps)}))
    kind = node.type
    if kind == NODE_TYPES["COMM_COLL_NODE"]:
        name = OF_CHAKRA.get(_number(a, "comm_type", -1))
        if name not in COLLECTIVE:
            raise ValueError(f"comm_type {a.get('comm_type')!r} is not a collective "
                             f"clustersim runs ({', '.join(COLLECTIVE)})")
        dim = _communicator(a.get("pg_name"), rank, named, groups)
        return Op(OpKind.COLLECTIVE, node.name, DP_STREAM, Phase.FORWARD, deps,
                  bytes=_number(a, "comm_size", 0), collective=COLLECTIVE[name], group=dim), 0.0
    if kind in (NODE_TYPES["COMM_SEND_NODE"], NODE_TYPES["COMM_RECV_NODE"]):
        src, dst = (_number(a, key) for key in ("comm_src", "comm_dst"))
        if not (float(src).is_integer() and float(dst).is_integer()):
            raise ValueError(f"comm_src {src!r} and comm_dst {dst!r} must be ranks")
        src, dst = int(src), int(dst)
        dim = f"p2p.{src}.{dst}"
        groups.setdefault(dim, ((src, dst),))
        send = kind == NODE_TYPES["COMM_SEND_NODE"]
        return Op(OpKind.SEND if send else OpKind.RECV, node.name, PP_STREAM, Phase.FORWARD,
                  deps, bytes=_number(a, "comm_size", 0), group=dim), 0.0
    return Op(OpKind.COMPUTE, node.name, "compute", Phase.FORWARD, deps,
              flops=float(_number(a, "num_ops", 0)),
              bytes=float(_number(a, "tensor_size", 0))), node.duration_micros * 1e-6


def _number(a: dict, key: str, default: float | None = None):
    """Attribute ``key``, a number (``default`` where absent; None: required)."""
    if key not in a:
        if default is None:
            raise ValueError(f"has no {key} attribute (a message needs comm_src and comm_dst)")
        return default
    value = a[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"its {key} must be a finite number, not {value!r:.60}")
    return value


def _communicator(pg: object, rank: int, named: dict, groups: dict) -> str:
    """The group dimension of communicator ``pg`` (none: every rank)."""
    if not pg:
        return WORLD
    if str(pg) not in named:
        raise ValueError(f"communicator {pg!r} is not in comm_groups.json")
    ranks = named[str(pg)]
    if rank not in ranks:
        raise ValueError(f"communicator {pg!r} does not hold rank {rank}")
    dim = f"pg.{pg}"
    groups.setdefault(dim, (tuple(sorted(ranks)),))
    return dim
