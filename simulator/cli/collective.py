"""``clustersim collective``: an nccl-tests-style sweep of one collective on an idle fabric."""

from __future__ import annotations

import argparse
import sys

from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs.out_dirs import guarded

LARGE_FABRIC = 16_384  # GPUs from which building the fabric takes long enough to say so


def add_parser(sub) -> None:
    from simulator.base.ir import Collective
    from simulator.collectives.nccl_tests import DTYPES

    tool = sub.add_parser("collective", help="nccl-tests-style sweep of one collective",
                          description="Time one collective over a range of sizes on an idle "
                                      "fabric and print nccl-tests' table.")
    tool.add_argument("--cluster", required=True, help="cluster preset (clustersim presets)")
    tool.add_argument("--nodes", type=int, default=1, help="servers (default 1)")
    names = [c.value for c in Collective]
    op = tool.add_argument("--op", default="all_reduce", type=_op_name, metavar="{" + ",".join(
        names) + "}", help="the collective; nccl-tests' names (allreduce, alltoall, "
        "sendrecv, ...) are accepted too")
    op.completions = names  # (not choices, which would refuse nccl-tests' spellings)
    tool.add_argument("--min-bytes", "-b", default="32M", help="smallest size, e.g. 8, 1M")
    tool.add_argument("--max-bytes", "-e", default="8G", help="largest size, e.g. 8G")
    tool.add_argument("--factor", "-f", type=float, default=2.0, help="size multiplier")
    tool.add_argument("--group", help="ranks, e.g. 0-7,64 (default: every GPU; send_recv "
                                      "sends from the first rank to the second)")
    tool.add_argument("--algorithm", default="auto",
                      help="auto | ring | tree | nvls | pat | collnet")
    tool.add_argument("--protocol", default="auto", help="auto | ll | ll128 | simple")
    tool.add_argument("--dtype", default="float", choices=list(DTYPES))
    tool.add_argument("--csv", help="also write the table to this CSV file")
    tool.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a cluster key, e.g. nic_bandwidth=400Gb/s (repeatable)")


def _op_name(text: str) -> str:
    """A collective's name: ours (``all_to_all``) or nccl-tests' (``alltoall``, as in
    ``alltoall_perf``)."""
    from simulator.base.ir import Collective

    names = {c.value.replace("_", ""): c.value for c in Collective}
    name = names.get(text.replace("_", "").lower())
    if name is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not one of: {', '.join(names.values())}")
    return name


def run(args: argparse.Namespace) -> int:
    import pandas as pd
    from tqdm import tqdm

    from simulator.base import footprint
    from simulator.base.ir import Collective
    from simulator.collectives import nccl_tests
    from simulator.collectives.states import FabricStates
    from simulator.config.scenario import apply_overrides, machine_from, network_from

    csv = options.output_file(args.csv, "--csv") if args.csv else None
    if args.nodes < 1:
        raise ScenarioError(f"--nodes: {args.nodes} must be at least 1")
    sets = [a if a.startswith("cluster.") else f"cluster.{a}" for a in args.set]
    raw = apply_overrides({"cluster": {"preset": args.cluster, "nodes": args.nodes}}, sets)
    machine = machine_from(raw["cluster"])
    if machine.changes:  # faults that start during an iteration: there is none here
        raise ScenarioError(f"cluster.fabric.faults: a fault with at: "
                            f"{machine.changes[0][0] * 1e3:g} ms; clustersim collective times "
                            "each size alone on one state of the fabric, so a fault applies "
                            "from the start or not at all: drop its at:")
    algorithm, protocol, _ = network_from({"algorithm": args.algorithm,
                                           "protocol": args.protocol}, machine)
    try:
        byte_sizes = nccl_tests.sizes(nccl_tests.parse_size(args.min_bytes),
                                      nccl_tests.parse_size(args.max_bytes), args.factor,
                                      nccl_tests.DTYPES[args.dtype])
        ranks = (nccl_tests.parse_ranks(args.group, machine.gpus) if args.group
                 else list(range(machine.gpus)))
    except ValueError as error:
        raise ScenarioError(f"collective: {error}") from None
    kind = Collective(args.op)
    footprint.check_fabric(machine.gpus, "--nodes", args.nodes)
    if machine.gpus >= LARGE_FABRIC:
        print(f"building the fabric of {machine.gpus:,} GPUs (about {machine.gpus * 3e-4:.0f} s "
              "on a 2-core machine) ...", file=sys.stderr, flush=True)
    fabrics = FabricStates.build(machine.build_graph(), algorithm=algorithm, protocol=protocol)
    fabric, tuner = fabrics.fabric, fabrics.lowering
    gpus = [fabrics.gpus[r] for r in (ranks[:2] if kind is Collective.SEND_RECV else ranks)]
    with tqdm(total=len(byte_sizes), unit="size", file=sys.stderr, leave=False,
              disable=None) as bar:  # shown on a terminal only
        rows, wall = nccl_tests.run_sweep(fabric, tuner, kind, gpus, byte_sizes, args.dtype,
                                          bar.update)
    header = [f"clustersim collective: {kind.value} on {len(gpus)} of {machine.gpus} GPUs "
              f"({machine.nodes} x {machine.cluster.name}, {machine.cluster.fabric.name})",
              f"algorithm {args.algorithm}, protocol {args.protocol}",
              *(f"fault: {f}" for f in fabric.graph.graph.get("faults", ()))]
    print(nccl_tests.format_table(rows, header))
    print(f"# simulated {len(rows)} sizes in {wall:.2f} s wall, "
          f"{sum(r.events for r in rows):,} events")
    if csv:
        guarded(csv, lambda: pd.DataFrame([r.__dict__ for r in rows]).to_csv(
            csv, index=False, float_format="%.9g"))
    return 0
