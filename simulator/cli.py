"""The ``clustersim`` command line.

    clustersim run SCENARIO.yaml --out DIR [--format png|pdf|svg] [--json] [--set k=v ...]
    clustersim presets

Exit codes: 0 success, 1 simulation failure, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from simulator import exports
from simulator.engine import SimulationError
from simulator.fabric import FabricError
from simulator.gantt import FORMATS
from simulator.scenario import ScenarioError, load
from simulator.units import format_bytes, format_time


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="clustersim", description="Simulate distributed transformer training.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="simulate one training iteration of a scenario")
    run.add_argument("scenario", help="scenario YAML file")
    run.add_argument("--out", help="output directory (default: runs/<scenario name>)")
    run.add_argument("--format", choices=FORMATS, default="png", help="Gantt figure format")
    run.add_argument("--json", action="store_true", help="print summary.json to stdout")
    run.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override a scenario key (repeatable)")
    sub.add_parser("presets", help="list cluster, GPU and model presets")
    return parser


def _human(summary: dict, out: Path) -> str:
    mem = summary["memory_gib"]
    lines = [
        f"iteration time   {format_time(summary['iteration_time_s'])}",
        f"throughput       {summary['tokens_per_s']:,.0f} tokens/s, "
        f"{summary['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU, "
        f"MFU {summary['mfu']:.1%} on {summary['gpus']} GPUs",
        f"last rank {summary['critical_rank']:<6} compute {format_time(summary['compute_s'])}, "
        f"exposed comm {format_time(summary['exposed_comm_s'])}, "
        f"overlapped comm {format_time(summary['overlapped_comm_s'])}, "
        f"waiting {format_time(summary['comm_wait_s'])}, "
        f"bubble {format_time(summary['bubble_s'])}",
        f"peak memory      {summary['peak_memory_gib']:.2f} GiB of "
        f"{summary['gpu_memory_gib']:.0f} GiB"
        + (" (OOM)" if summary["oom"] else "")
        + "  [" + ", ".join(f"{k} {format_bytes(v * 2**30)}" for k, v in mem.items()) + "]",
        f"simulated        {summary['events']:,} events in {summary['wall_s']:.2f} s wall",
        f"outputs          {out}/",
    ]
    return "\n".join(lines)


def cmd_run(args: argparse.Namespace) -> int:
    from simulator.runner import run

    scenario = load(args.scenario, args.set)
    out = Path(args.out) if args.out else Path("runs") / scenario.name
    result = run(scenario)
    out.mkdir(parents=True, exist_ok=True)
    exports.write_summary(result.summary, out / "summary.json")
    exports.write_spans(result.spans, out / "spans.csv")
    exports.write_spans(result.comms, out / "comms.csv")
    exports.write_chrome_trace(result.spans, result.placement, out / "trace.json")
    (out / "scenario.yaml").write_text(yaml.safe_dump(dict(scenario.source), sort_keys=False))
    result.gantt(str(out / f"gantt.{args.format}"))
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(_human(result.summary, out))
    return 0


def cmd_presets(_args: argparse.Namespace) -> int:
    from topologies import CLUSTERS, GPUS
    from workloads.kernels import parameter_count
    from workloads.models import MODELS

    print("clusters (cluster.preset):")
    for c in CLUSTERS.values():
        print(f"  {c.name:10} {c.gpus_per_node} x {c.gpu}, {c.intra_node.value} "
              f"{c.nvlink_bandwidth / 1e9:g} GB/s per GPU, {c.nics_per_node} NICs x "
              f"{c.nic_bandwidth * 8 / 1e9:g} Gb/s, fabric link latency "
              f"{c.link_latency * 1e6:g} us")
    print("gpus (cluster.gpu):")
    for g in GPUS.values():
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in g.peak_flops.items())
        print(f"  {g.name:15} {g.memory_bytes / 2**30:.0f} GiB, HBM "
              f"{g.hbm_bandwidth / 1e12:g} TB/s, dense TFLOP/s: {peaks}")
    print("models (model.preset):")
    for m in MODELS.values():
        params = parameter_count(m, 2048) / 1e9
        print(f"  {m.name:10} {params:7.2f}B params, {m.layers} layers, hidden {m.hidden}, "
              f"{m.heads} heads ({m.kv_heads} kv), ffn {m.ffn_hidden}, vocab {m.vocab}, "
              f"{m.mlp.value}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"run": cmd_run, "presets": cmd_presets}[args.command]
    try:
        return handler(args)
    except ScenarioError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (SimulationError, FabricError) as error:
        print(f"simulation failed: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
