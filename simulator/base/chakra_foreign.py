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
import re
from collections import deque
from pathlib import Path

import numpy as np

from simulator.base.chakra_schema import COLLECTIVES, NODE_TYPES, delimited, messages
from simulator.base.ir import DP_STREAM, PP_STREAM, Collective, Op, OpKind, Phase, Program

OF_CHAKRA = {number: name for name, number in COLLECTIVES.items()}
COLLECTIVE = {"ALL_REDUCE": Collective.ALL_REDUCE, "REDUCE": Collective.REDUCE,
              "ALL_GATHER": Collective.ALL_GATHER, "REDUCE_SCATTER": Collective.REDUCE_SCATTER,
              "REDUCE_SCATTER_BLOCK": Collective.REDUCE_SCATTER,
              "BROADCAST": Collective.BROADCAST, "ALL_TO_ALL": Collective.ALL_TO_ALL}
WORLD = "world"  # the communicator of a collective that names none


def files(folder: Path) -> list[Path]:
    """The traces ``PREFIX.RANK.et`` of ``folder``, by rank; ValueError unless one
    prefix covers ranks 0 to N-1."""
    found: dict[str, dict[int, Path]] = {}
    for path in folder.glob("*.et"):
        match = re.fullmatch(r"(.+)\.(\d+)\.et", path.name)
        if match:
            found.setdefault(match[1], {})[int(match[2])] = path
    if len(found) != 1:
        raise ValueError(f"{folder}: holds {'no' if not found else 'several'} sets of Chakra "
                         "traces (PREFIX.RANK.et, one prefix)")
    (ranks,) = found.values()
    if sorted(ranks) != list(range(len(ranks))):
        raise ValueError(f"{folder}: the traces' ranks are not 0 to {len(ranks) - 1}")
    return [ranks[r] for r in range(len(ranks))]


def read_foreign(folder: Path) -> tuple[Program, tuple[np.ndarray, ...], dict]:
    """(the program, each rank's recorded durations, its facts) of ``folder``'s
    traces; ValueError naming the file and node of anything wrong."""
    paths = files(folder)
    named = _groups(folder)
    groups: dict[str, tuple[tuple[int, ...], ...]] = {WORLD: (tuple(range(len(paths))),)}
    ops, durations, flops = [], [], 0.0
    for rank, path in enumerate(paths):
        nodes = [messages()["Node"].FromString(b) for b in delimited(path.read_bytes())[1:]]
        mine, seconds = [], []
        position: dict[int, int] = {}
        for node in _ordered(nodes, path):
            op, second = _op(node, rank, named, groups, position, path)
            position[node.id] = len(mine)
            mine.append(op)
            seconds.append(second)
            flops += op.flops
        ops.append(tuple(mine))
        durations.append(np.array(seconds))
    n = len(paths)
    facts = {"ranks": n, "foreign": True, "scenario": {
        "model": {"layers": 1, "hidden": 128, "heads": 1,
                  "kv_heads": 1, "ffn_hidden": 512, "vocab": 128},
        "training": {"seq_len": 1, "global_batch": n, "micro_batch": 1},
        "parallelism": {"dp": n}}}
    program = Program(tuple(ops), groups, tuple({} for _ in range(n)), flops, 0)
    return program, tuple(durations), facts


def _groups(folder: Path) -> dict[str, tuple[int, ...]]:
    path = folder / "comm_groups.json"
    if not path.is_file():
        return {}
    raw = json.loads(path.read_text())
    if not isinstance(raw, dict) or not all(
            isinstance(v, list) and all(isinstance(r, int) for r in v) for v in raw.values()):
        raise ValueError(f"{path}: must map each communicator to a list of ranks")
    return {str(k): tuple(v) for k, v in raw.items()}


def _ordered(nodes: list, path: Path) -> list:
    """The nodes in an order that respects their dependencies (file order where free)."""
    index = {node.id: k for k, node in enumerate(nodes)}
    waiting = [0] * len(nodes)
    after: list[list[int]] = [[] for _ in nodes]
    for k, node in enumerate(nodes):
        for d in {*node.data_deps, *node.ctrl_deps}:
            if d not in index:
                raise ValueError(f"{path}: node {node.id} depends on node {d}, which is not there")
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
        raise ValueError(f"{path}: the nodes' dependencies form a cycle")
    return out


def _op(node, rank: int, named: dict, groups: dict, position: dict, path: Path) -> tuple[Op, float]:
    """A node as an op (registering its communicator's group) and its duration."""
    a = {x.name: getattr(x, x.WhichOneof("value")) for x in node.attr if x.WhichOneof("value")}
    deps = tuple(sorted({position[d] for d in (*node.data_deps, *node.ctrl_deps)}))
    kind = node.type
    if kind == NODE_TYPES["COMM_COLL_NODE"]:
        name = OF_CHAKRA.get(int(a.get("comm_type", -1)))
        if name not in COLLECTIVE:
            raise ValueError(f"{path}: node {node.id}: comm_type {a.get('comm_type')!r} is not "
                             f"a collective clustersim runs ({', '.join(COLLECTIVE)})")
        dim = _communicator(a.get("pg_name"), rank, named, groups, path, node.id)
        return Op(OpKind.COLLECTIVE, node.name, DP_STREAM, Phase.FORWARD, deps,
                  bytes=float(a.get("comm_size", 0)), collective=COLLECTIVE[name], group=dim), 0.0
    if kind in (NODE_TYPES["COMM_SEND_NODE"], NODE_TYPES["COMM_RECV_NODE"]):
        src, dst = int(a["comm_src"]), int(a["comm_dst"])
        dim = f"p2p.{src}.{dst}"
        groups.setdefault(dim, ((src, dst),))
        send = kind == NODE_TYPES["COMM_SEND_NODE"]
        return Op(OpKind.SEND if send else OpKind.RECV, node.name, PP_STREAM, Phase.FORWARD,
                  deps, bytes=float(a.get("comm_size", 0)), group=dim), 0.0
    return Op(OpKind.COMPUTE, node.name, "compute", Phase.FORWARD, deps,
              flops=float(a.get("num_ops", 0)), bytes=float(a.get("tensor_size", 0))), \
        node.duration_micros * 1e-6


def _communicator(pg: object, rank: int, named: dict, groups: dict, path: Path, node: int) -> str:
    """The group dimension of communicator ``pg`` (none: every rank)."""
    if not pg:
        return WORLD
    if str(pg) not in named:
        raise ValueError(f"{path}: node {node}: communicator {pg!r} is not in comm_groups.json")
    ranks = named[str(pg)]
    if rank not in ranks:
        raise ValueError(f"{path}: node {node}: communicator {pg!r} does not hold rank {rank}")
    dim = f"pg.{pg}"
    groups.setdefault(dim, (tuple(sorted(ranks)),))
    return dim
