"""``clustersim init``: a commented starter scenario, its cluster, model and
layout chosen by flags, checked by the scenario loader before it is written
(so it runs as it is)."""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from simulator.cli import options
from simulator.config.cluster import SCHEMA as CLUSTER_SCHEMA
from simulator.config.scenario import ScenarioError, from_dict
from simulator.config.training import PARALLEL_SCHEMA, TRAINING_SCHEMA
from workloads.memory import Recompute
from workloads.precision import HIGH, LOW, PRECISIONS

TEMPLATE = """\
# A starter scenario written by `clustersim init`: {model} on {nodes} {cluster} node(s).
# Run it:       clustersim run {path}
# Change a key: clustersim run {path} --set parallelism.tp=2
# Every key, its type, default and allowed values: the documentation's scenario reference.
name: {name}
seed: 0                     # the same scenario and seed give the same trace, byte for byte
cluster:
  preset: {cluster}         # GPUs, servers and fabric (clustersim presets lists them)
  nodes: {nodes}            # servers: {gpus} GPUs
  # compute_jitter: 0.02    # seeded per-kernel slow-downs, so ranks wait for each other
  # slow: {{"gpu 3": 1.2}}   # a straggler: GPU 3 computes 1.2x slower
model:
  preset: {model}           # or layers, hidden, heads, ... or hf_config: config.json
training:
  seq_len: {seq_len}        # tokens per sequence
  global_batch: {global_batch}  # sequences per iteration (dp x micro_batch x micro-batches)
  micro_batch: {micro_batch}  # sequences per micro-batch
  precision: {precision}      # {high}; {low} where the GPU has them
  recompute: {recompute}    # {recomputes} activation recomputation
parallelism:
  tp: {tp}                     # tensor parallel (inside an NVLink domain)
  pp: {pp}                     # pipeline stages
  cp: {cp}                     # context parallel (ring attention)
  dp: {dp}                     # data parallel: tp x pp x cp x dp = {gpus} GPUs
  zero: {zero}                   # ZeRO stage 0-3 (1: Megatron's distributed optimizer)
{experts}# network:                  # NCCL's algorithm and protocol (default: its tuner's choice)
#   algorithm: auto
# simulation:
#   symmetry: auto          # the fast exact path; full simulates every rank
"""
EXPERTS = "  ep: {ep}                     # expert parallel (the model's {count} experts)\n"
# Each flag's scenario key: its value is checked by that key's own check, the error
# naming the flag (``checked``).
FLAGS = {"nodes": CLUSTER_SCHEMA["nodes"], **{k: PARALLEL_SCHEMA[k] for k in (
    "tp", "pp", "cp", "ep", "zero")}, **{k: TRAINING_SCHEMA[k] for k in (
        "seq_len", "micro_batch", "global_batch", "precision", "recompute")}}
RECOMPUTES = " | ".join(r.value for r in Recompute)


def add_parser(sub) -> None:
    init = sub.add_parser(
        "init", help="write a commented starter scenario",
        description="Write a starter scenario with comments on every key, its cluster, model "
                    "and layout chosen by the flags; it is checked by the scenario loader "
                    "first, so it runs as written.")
    init.add_argument("path", nargs="?", default="scenario.yaml",
                      help="the file to write (default scenario.yaml)")
    init.add_argument("--cluster", default="dgx-h100", help="cluster preset (default dgx-h100)")
    init.add_argument("--nodes", type=int, default=2, help="servers (default 2)")
    init.add_argument("--model", default="gpt3-1.3b", help="model preset (default gpt3-1.3b)")
    for flag, default, text in (("--tp", 1, "tensor-parallel size"),
                                ("--pp", 1, "pipeline stages"),
                                ("--cp", 1, "context-parallel size"),
                                ("--ep", 1, "expert-parallel size (a model with experts)"),
                                ("--zero", 1, "ZeRO stage 0-3"),
                                ("--seq-len", 4096, "tokens per sequence"),
                                ("--micro-batch", 1, "sequences per micro-batch")):
        init.add_argument(flag, type=int, default=default, help=f"{text} (default {default})")
    init.add_argument("--global-batch", type=int,
                      help="sequences per iteration (default: dp x micro-batch x 4 x pp)")
    init.add_argument("--precision", default="bf16",
                      help=f"{', '.join(PRECISIONS)} (default bf16; {', '.join(LOW)} where "
                           "the GPU has them)")
    init.add_argument("--recompute", default="selective",
                      help=f"{RECOMPUTES.replace(' | ', ', ')} (default selective)")
    init.add_argument("--force", action="store_true", help="replace an existing file")


def aligned(text: str, column: int = 30) -> str:
    """``text`` with each line's trailing comment starting at ``column`` (a
    commented-out key's own comment too).

    >>> aligned("a: 1  # one\\n  # b: 2  # two", 12).splitlines()
    ['a: 1        # one', '  # b: 2    # two']
    """
    out = []
    for line in text.splitlines():
        body = line.lstrip()
        indent = line[: len(line) - len(body)]
        if body.startswith("# ") and "  # " in body:  # a commented-out key and its comment
            indent, body = indent + "# ", body[2:]
        head, mark, comment = body.partition("  # ")
        if mark and head.strip():
            line = f"{(indent + head.rstrip()).ljust(column - 1)} # {comment.strip()}"
        out.append(line)
    return "\n".join(out) + "\n"


def starter(args: argparse.Namespace, path: str, gpus: int, experts: int) -> str:
    """The scenario's text for the flags (``gpus``: the cluster's; ``experts``:
    the model's count, 0 for a dense one)."""
    split = args.tp * args.pp * args.cp
    if split < 1 or gpus % split:
        raise ScenarioError(f"--tp {args.tp} x --pp {args.pp} x --cp {args.cp} = {split} must "
                            f"divide the {gpus} GPUs of --nodes {args.nodes} {args.cluster}")
    dp = gpus // split
    batch = args.global_batch if args.global_batch is not None else (
        dp * args.micro_batch * 4 * args.pp)
    return aligned(TEMPLATE.format(
        model=args.model, nodes=args.nodes, cluster=args.cluster, path=path, gpus=gpus,
        name=f"{args.model}-{args.cluster}-{gpus}gpu", seq_len=args.seq_len,
        global_batch=batch, micro_batch=args.micro_batch, precision=args.precision,
        recompute=args.recompute, high=", ".join(HIGH), low=", ".join(LOW),
        recomputes=RECOMPUTES, tp=args.tp, pp=args.pp, cp=args.cp, dp=dp, zero=args.zero,
        experts=EXPERTS.format(ep=args.ep, count=experts) if experts else ""))


def checked(args: argparse.Namespace) -> None:
    """Each flag's value checked by the scenario key it sets, the error naming the
    flag (``--micro-batch: 0 must be an integer >= 1``), before any is used."""
    for name, (check, _) in FLAGS.items():
        value = getattr(args, name)
        if value is not None:
            check(f"--{name.replace('_', '-')}", value)


def run(args: argparse.Namespace) -> int:
    from simulator.config.scenario import machine_from, model_from

    checked(args)
    try:
        machine = machine_from({"preset": args.cluster, "nodes": args.nodes})
    except ScenarioError as error:
        raise ScenarioError(f"--cluster: {error}") from None
    try:
        model = model_from({"preset": args.model})
    except ScenarioError as error:
        raise ScenarioError(f"--model: {error}") from None
    if args.ep > 1 and not model.experts:
        raise ScenarioError(f"--ep {args.ep}: the model {args.model} has no experts")
    path = options.output_file(args.path, "path")
    if path.exists() and not args.force:
        raise ScenarioError(f"path: {path} exists; give another or --force to replace it")
    text = starter(args, str(args.path), machine.gpus, model.experts)
    try:
        from_dict(yaml.safe_load(text), base_dir=Path(path).parent)
    except ScenarioError as error:
        raise ScenarioError(f"the scenario these flags make does not load: {error}") from None
    path.write_text(text)
    print(f"wrote {path}: {model.layers}-layer {args.model} on {machine.gpus} GPUs "
          f"({args.cluster}); run it with: clustersim run {path}")
    return 0
