"""The one validation layer for everything read from Chakra traces, clustersim's
own (``chakra``) and another tool's (``chakra_foreign``): nothing a trace says
reaches a program unchecked, and anything wrong is one ``TraceError`` line
naming the file, the node where there is one, the value and what is allowed.

- the files: none empty, each no larger than a run can take (``check_sizes``:
  ``MAX_NODES`` per rank, and the whole trace's ops within the machine's memory,
  ``footprint``), counted from their framing before a node is parsed;
- communicators (``check_ranks``: ``comm_groups.json``'s and the metadata's
  groups): ranks that exist, none twice, and a rank in one group of a
  dimension at most;
- clustersim's metadata (``check_metadata``): a mapping with every key the
  program needs, each of its type and in range;
- every op (``check_program``): its communicator holds its rank; a message is
  between two ranks, sent in its sender's trace and received in its receiver's;
  durations, sizes and FLOP counts are finite numbers, not negative, in range
  (``MAX_SECONDS``, ``MAX_BYTES``, ``MAX_FLOPS``, and no faster than
  ``MAX_FLOP_RATE``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from simulator.base import footprint
from simulator.base.chakra_schema import delimited
from simulator.base.fields import ScenarioError
from simulator.base.ir import OpKind, Program

MAX_NODES = 200_000  # per rank's trace: reading (~30 us a node in Python) and running
# more would take minutes; the longest shipped scenario's rank has 3,714 ops
MAX_SECONDS = 1e6  # a recorded op's duration (11.6 days)
MAX_BYTES = 2.0**60  # an op's bytes (1 EiB)
MAX_FLOPS = 1e21  # an op's FLOPs (1,000 s at 1 PFLOP/s)
MAX_FLOP_RATE = 1e17  # FLOP/s: 10x any GPU's densest peak, over a recorded duration of
# at least a microsecond (the trace's resolution)
NUMBERS = (int, float)


class TraceError(ValueError):
    """A trace folder that cannot be read as a program (one line: what and where)."""


def framed(path: Path) -> list[bytes]:
    """A trace file's length-delimited messages, unparsed; one line if unreadable."""
    try:
        return delimited(path.read_bytes())
    except (OSError, ValueError) as error:
        raise TraceError(f"{path}: {error}") from None


def check_sizes(found: Mapping[Path, Sequence[bytes]], memory: int | None = None) -> None:
    """Refuse, before any node is parsed, an empty trace file or one of more than
    ``MAX_NODES`` nodes, and a trace whose ops could not fit in memory."""
    for path, messages in found.items():
        if not messages:
            raise TraceError(f"{path}: is empty (a trace starts with Chakra's metadata)")
        if len(messages) - 1 > MAX_NODES:
            raise TraceError(f"{path}: holds {len(messages) - 1:,} nodes, more than the "
                             f"{MAX_NODES:,} a rank's trace may (reading and simulating them "
                             "would take many minutes); trace fewer iterations or layers")
    ops = sum(len(m) - 1 for m in found.values())
    try:
        footprint.check_ops(ops, "workload.chakra", f"{len(found):,} ranks' traces",
                            "trace fewer ranks or iterations", memory)
    except ScenarioError as error:
        raise TraceError(str(error).removeprefix("workload.chakra: ")) from None


def check_ranks(groups: Sequence[object], ranks: int, where: str) -> None:
    """Each group a list of ranks that exist, none twice; a rank in one group at most."""
    seen: dict[int, int] = {}
    for k, group in enumerate(groups):
        if not isinstance(group, (list, tuple)) or not group:
            raise TraceError(f"{where}: group {k} must be a non-empty list of ranks, not "
                             f"{group!r}")
        for rank in group:
            if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < ranks:
                raise TraceError(f"{where}: {rank!r} is not a rank (the trace has {ranks}: "
                                 f"0 to {ranks - 1})")
            if rank in seen:
                raise TraceError(f"{where}: rank {rank} is given twice (groups {seen[rank]} "
                                 f"and {k})")
            seen[rank] = k


def number(value: object, where: str, low: float = 0.0, high: float = math.inf) -> float:
    """``value`` as a float: a finite number from ``low`` to ``high``, or a TraceError."""
    if isinstance(value, bool) or not isinstance(value, NUMBERS) or not (
            math.isfinite(value) and low <= value <= high):
        bound = "" if high == math.inf else f" at most {high:g}"
        raise TraceError(f"{where}: {value!r} must be a finite number, at least {low:g}"
                         f"{bound}")
    return float(value)


def integer(value: object, where: str, low: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise TraceError(f"{where}: {value!r} must be an integer, at least {low}")
    return value


# the metadata's keys the program needs, and the type of each
REQUIRED = {"ranks": int, "groups": dict, "static_memory": list, "model_flops": NUMBERS,
            "tokens": int, "stage": list}
OPTIONAL = {"steps": list, "notes": dict, "scenario": dict, "name": str, "foreign": bool}


def check_metadata(facts: object, path: Path) -> None:
    """clustersim's metadata: a mapping with each key the program needs, of its
    type and in range (groups, static memory and stages one per rank)."""
    where = f"{path}: its clustersim metadata"
    if not isinstance(facts, dict):
        raise TraceError(f"{where} must be a mapping, not {type(facts).__name__}")
    for key, kind in (*REQUIRED.items(), *OPTIONAL.items()):
        if key not in facts and key in REQUIRED:
            raise TraceError(f"{where} has no {key!r}")
        if key in facts and (isinstance(facts[key], bool) and kind is not bool
                             or not isinstance(facts[key], kind)):
            raise TraceError(f"{where}'s {key} must be {_kind(kind)}, not {facts[key]!r:.60}")
    ranks = integer(facts["ranks"], f"{where}'s ranks", 1)
    for dim, groups in facts["groups"].items():
        if not isinstance(groups, list):
            raise TraceError(f"{where}'s groups[{dim!r}] must be a list of groups")
        check_ranks(groups, ranks, f"{where}'s groups[{dim!r}]")
    memory = facts["static_memory"]
    if len(memory) != ranks or not all(isinstance(m, dict) for m in memory):
        raise TraceError(f"{where}'s static_memory must be one mapping per rank ({ranks})")
    for r, held in enumerate(memory):
        for category, size in held.items():
            number(size, f"{where}'s static_memory[{r}][{category!r}]", high=MAX_BYTES)
    number(facts["model_flops"], f"{where}'s model_flops", high=MAX_FLOPS * MAX_NODES * ranks)
    integer(facts["tokens"], f"{where}'s tokens")
    if len(facts["stage"]) not in (0, ranks):
        raise TraceError(f"{where}'s stage must be one per rank ({ranks}) or none")
    for stage in facts["stage"]:
        integer(stage, f"{where}'s stage")
    if len(facts.get("steps") or ()) not in (0, ranks):
        raise TraceError(f"{where}'s steps must be one list per rank ({ranks}) or none")


def _kind(kind) -> str:
    names = {int: "an integer", dict: "a mapping", list: "a list", str: "text",
             bool: "true or false", NUMBERS: "a number"}
    return names[kind]


def check_steps(steps: Sequence, ops: Sequence[int], path: Path) -> None:
    """Each rank's pipeline steps: ``[first, end, key]`` in order, within its ops,
    steps of one key of one length (the engine may replay one for another)."""
    for rank, mine in enumerate(steps):
        where = f"{path}: its clustersim metadata's steps[{rank}]"
        if not isinstance(mine, list):
            raise TraceError(f"{where} must be a list of [first, end, key]")
        at, lengths = 0, {}
        for step in mine:
            if not (isinstance(step, list) and len(step) == 3):
                raise TraceError(f"{where}: {step!r:.60} must be [first, end, key]")
            first, end = integer(step[0], where, at), integer(step[1], where, step[0])
            if end > ops[rank] or lengths.setdefault(str(step[2]), end - first) != end - first:
                raise TraceError(f"{where}: [{first}, {end}] is past the rank's {ops[rank]} ops "
                                 "or not as long as another step of its key")
            at = end


def check_program(program: Program, durations: Sequence[np.ndarray], paths: Sequence[Path],
                  ids: Sequence[Sequence[int]]) -> None:
    """Every op of every rank (``paths[r]``: rank r's file; ``ids[r][i]``: the node
    of its op i): its communicator and peers, its numbers and its duration's."""
    checked: set[tuple[int, int]] = set()
    index = {dim: {r: g for g in groups for r in g} for dim, groups in program.groups.items()}
    for rank, ops in enumerate(program.ops):
        for i, op in enumerate(ops):
            if op.kind is not OpKind.COMPUTE:
                _communication(program, index, rank, op, f"{paths[rank]}: node {ids[rank][i]}")
    for rank, ops in enumerate(program.ops):
        if (id(ops), id(durations[rank])) not in checked:
            _numbers(ops, durations[rank], paths[rank], ids[rank])
            checked.add((id(ops), id(durations[rank])))
    _matched(program, index, paths, ids)


def _matched(program: Program, index: Mapping, paths: Sequence[Path], ids: Sequence) -> None:
    """The ranks of a communicator make the same calls (collective and size, in
    order), and a pair's sender sends what its receiver receives, or they would
    wait for each other forever."""
    seqs: dict[int, dict[str, list]] = {}
    for ops in program.ops:
        if id(ops) not in seqs:
            seq = seqs[id(ops)] = {}
            for i, op in enumerate(ops):
                if op.kind is not OpKind.COMPUTE:
                    seq.setdefault(op.group, []).append(
                        (op.collective.value if op.collective else "message", op.bytes, i))
    for dim, groups in program.groups.items():
        for group in groups:
            lead = group[0]
            theirs = seqs[id(program.ops[lead])].get(dim, [])
            for rank in group[1:]:
                mine = seqs[id(program.ops[rank])].get(dim, [])
                if mine is not theirs and [c[:2] for c in mine] != [c[:2] for c in theirs]:
                    _unmatched(dim, group, (rank, mine), (lead, theirs), paths, ids)


def _unmatched(dim: str, group, mine: tuple, theirs: tuple, paths, ids) -> None:
    (rank, a), (lead, b) = mine, theirs
    k = next(k for k in range(max(len(a), len(b)))
             if k >= len(a) or k >= len(b) or a[k][:2] != b[k][:2])
    r, calls = (rank, a) if k < len(a) else (lead, b)
    raise TraceError(f"{paths[r]}: node {ids[r][calls[k][2]]}: call {k} of communicator "
                     f"{dim!r} {tuple(group)}: rank {rank} makes "
                     f"{_call(a[k] if k < len(a) else None)}, rank {lead} "
                     f"{_call(b[k] if k < len(b) else None)}; they would wait for each other "
                     "forever")


def _call(call) -> str:
    return "none" if call is None else f"{call[0]} of {call[1]:g} B"


def _communication(program: Program, index: Mapping, rank: int, op, where: str) -> None:
    """A collective's communicator holds ``rank``; a message is between two ranks,
    sent by its sender and received by its receiver (``index[dim][rank]``: the
    group of ``dim`` holding ``rank``)."""
    groups = program.groups.get(op.group)
    if groups is None:
        raise TraceError(f"{where}: its communicator {op.group!r} is not in the trace's groups")
    pair = index[op.group].get(rank)
    if op.kind is OpKind.COLLECTIVE:
        if pair is None:
            raise TraceError(f"{where}: no {op.group!r} communicator holds rank {rank}")
        return
    if pair is None and len(groups) != 1:
        raise TraceError(f"{where}: no {op.group!r} pair holds rank {rank}")
    pair = groups[0] if pair is None else pair
    if len(pair) != 2:
        raise TraceError(f"{where}: a message needs a sender and a receiver, not ranks {pair}")
    for peer in pair:
        if not 0 <= peer < program.ranks:
            raise TraceError(f"{where}: rank {peer} is not a rank (the trace has "
                             f"{program.ranks}: 0 to {program.ranks - 1})")
    if pair[0] == pair[1]:
        raise TraceError(f"{where}: a message from rank {pair[0]} to itself")
    if op.kind is OpKind.SEND and pair[0] != rank:
        raise TraceError(f"{where}: a send from rank {pair[0]} in rank {rank}'s trace")
    if op.kind is OpKind.RECV and pair[1] != rank:
        raise TraceError(f"{where}: a receive by rank {pair[1]} in rank {rank}'s trace")


def _numbers(ops, seconds: np.ndarray, path: Path, ids: Sequence[int]) -> None:
    """Durations, bytes, FLOPs and memory events: finite, not negative, in range."""
    flops = np.array([op.flops for op in ops], dtype=float)
    size = np.array([op.bytes for op in ops], dtype=float)
    seconds = np.asarray(seconds, dtype=float)
    for name, values, high in (("duration", seconds, MAX_SECONDS), ("bytes", size, MAX_BYTES),
                               ("FLOPs", flops, MAX_FLOPS)):
        bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0) & (values <= high)))
        if len(bad):
            k = bad[0]
            raise TraceError(f"{path}: node {ids[k]}: its {name} {float(values[k]):g} must be "
                             f"a finite number from 0 to {high:g}")
    fast = np.flatnonzero(flops > MAX_FLOP_RATE * np.maximum(seconds, 1e-6))
    if len(fast):
        k = fast[0]
        raise TraceError(f"{path}: node {ids[k]}: {flops[k]:g} FLOPs in {seconds[k]:g} s is "
                         f"faster than any GPU (over {MAX_FLOP_RATE:g} FLOP/s)")
    for i, op in enumerate(ops):
        for size, _category in op.mem:
            if not math.isfinite(size) or abs(size) > MAX_BYTES:
                raise TraceError(f"{path}: node {ids[i]}: its memory event {size!r} must be "
                                 f"a finite number of bytes, at most {MAX_BYTES:g} either way")


COUNTS = ("micro_batches", "parameters", "buckets", "hardware_flops")  # notes: numbers
MOE = {"moe_routing": str, "moe_rank_imbalance": NUMBERS, "moe_expert_imbalance": NUMBERS,
       "moe_dropped_fraction": NUMBERS, "load_factors": list}


def check_notes(notes: object, path: Path) -> None:
    """The program's notes: a mapping, its counts numbers, its MoE note whole
    (what routing came to, and each MoE layer's load factors)."""
    where = f"{path}: its clustersim metadata's notes"
    if not isinstance(notes, dict):
        raise TraceError(f"{where} must be a mapping")
    for key in COUNTS:
        if key in notes:
            number(notes[key], f"{where}[{key!r}]")
    moe = notes.get("_moe")
    if moe is None:
        return
    if not isinstance(moe, dict) or any(
            k not in moe or isinstance(moe[k], bool) or not isinstance(moe[k], kind)
            for k, kind in MOE.items()):
        raise TraceError(f"{where}' MoE note must give {', '.join(MOE)}")
    for k in ("moe_rank_imbalance", "moe_expert_imbalance", "moe_dropped_fraction"):
        number(moe[k], f"{where}' MoE note's {k}")
    factors = moe["load_factors"]
    if len(factors) != 2 or not all(isinstance(f, dict) and all(
            isinstance(v, np.ndarray) and np.isfinite(v).all() and (v >= 0).all()
            for v in f.values()) for f in factors):
        raise TraceError(f"{where}' MoE note's load_factors must be two mappings of each "
                         "layer's factors (finite, not negative)")
