"""The ``clustersim`` command line.

    clustersim run SCENARIO.yaml --out DIR [--format png|pdf|svg] [--json] [--set k=v ...]
    clustersim collective --cluster dgx-a100 --nodes 2 --op all_reduce --min-bytes 1M \
        --max-bytes 8G [--factor 2] [--group 0-7] [--algorithm A] [--protocol P] [--csv FILE]
    clustersim gantt RUN_DIR [--out FILE] [--ranks 0-7,64] [--from T] [--to T] [--streams]
    clustersim comms RUN_DIR [--csv FILE] [--plot FILE]
    clustersim compare RUN_A RUN_B [--out FILE]
    clustersim sweep BASE.yaml --grid KEY=V1,V2 [--zip KEY=V1,V2 ...] --out DIR
                     [--workers N] [--dask tcp://HOST:8786] [--retry-failed]
    clustersim sweep SWEEP.yaml --out DIR ...   (a file with base, grid, zip)
    clustersim plot DIR --x KEY --y METRIC [--hue KEY | --z METRIC] [--out FILE]
    clustersim validate [--case NAME ...] [--tag TAG ...] [--csv FILE] [--markdown] [--list]
    clustersim calibrate KERNELS.csv --gpu NAME --out FILE [--precision bf16]
    clustersim presets

Exit codes: 0 success, 1 simulation failure, 2 bad input (one line on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

import yaml

from simulator.base.units import UnitError, format_bytes, format_time, parse_time
from simulator.collectives.nccl_tests import parse_ranks
from simulator.collectives.tuner import CollectiveError
from simulator.config.scenario import ScenarioError, load
from simulator.engine.core import SimulationError
from simulator.network.fabric import FabricError
from simulator.outputs import run_dir
from simulator.outputs.style import FORMATS


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
    _collective_parser(sub)
    _gantt_parser(sub)
    comms = sub.add_parser("comms", help="communication profile of a finished run",
                           description="Counts, volumes and message-size histograms per "
                                       "parallelism dimension, from RUN_DIR/comms.*")
    comms.add_argument("run_dir", help="a directory written by clustersim run")
    comms.add_argument("--csv", help="write the profile table to this CSV file")
    comms.add_argument("--histogram-csv", help="write the size histogram to this CSV file")
    comms.add_argument("--plot", help="draw the size histogram to this figure (png/pdf/svg)")
    compare = sub.add_parser("compare", help="two finished runs side by side",
                             description="Print two runs' summaries side by side and draw "
                                         "their Gantt charts on one time axis.")
    compare.add_argument("run_a")
    compare.add_argument("run_b")
    compare.add_argument("--out", help="figure file (default: RUN_B/compare.png)")
    compare.add_argument("--ranks", help="ranks to draw in both, e.g. 0-7,64")
    _sweep_parsers(sub)
    validate = sub.add_parser("validate", help="compare with published measurements",
                              description="Run the validation set (published measurements "
                                          "rebuilt as scenarios, collectives and kernels) and "
                                          "print measured, simulated and error per case and "
                                          "the mean absolute error per group.")
    validate.add_argument("--case", action="append", default=[], help="a case (repeatable)")
    validate.add_argument("--tag", action="append", default=[],
                          help="cases with this tag, e.g. megatron, nccl-tests (repeatable)")
    validate.add_argument("--csv", help="write the per-case table to this CSV file")
    validate.add_argument("--markdown", action="store_true", help="print Markdown tables")
    validate.add_argument("--list", action="store_true", help="list the cases and stop")
    calibrate = sub.add_parser("calibrate", help="fit the compute model to measured kernels",
                               description="Fit the GPU's five compute-model efficiencies to a "
                                           "table of measured kernel times (README: Calibration)"
                                           " and write a calibration file for "
                                           "cluster.calibration.")
    calibrate.add_argument("kernels", help="kernel table CSV (scripts/measure_kernels.py)")
    calibrate.add_argument("--gpu", required=True, help="GPU preset the table was measured on")
    calibrate.add_argument("--out", required=True, help="calibration file to write (YAML)")
    calibrate.add_argument("--precision", default="bf16", help="precision of the GEMMs")
    return parser


def _sweep_parsers(sub) -> None:
    sweep = sub.add_parser("sweep", help="run many scenarios from one base",
                           description="Run the cartesian product of --grid values (crossed "
                                       "with --zip rows) over a base scenario, in parallel; "
                                       "re-run the same command to resume.")
    sweep.add_argument("base", help="base scenario YAML, or a sweep file (base, grid, zip)")
    sweep.add_argument("--grid", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="a key and its values; every combination runs (repeatable)")
    sweep.add_argument("--zip", action="append", default=[], metavar="KEY=V1,V2,...",
                       help="keys whose values pair up element by element (repeatable)")
    sweep.add_argument("--out", required=True, help="results directory")
    sweep.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="local worker processes (default: the number of cores)")
    sweep.add_argument("--dask", metavar="ADDRESS",
                       help="run on an existing Dask scheduler, e.g. tcp://host:8786")
    sweep.add_argument("--retry-failed", action="store_true",
                       help="run again the cases that failed last time")
    plot = sub.add_parser("plot", help="draw a sweep's results",
                          description="Lines of --y against --x (one per --hue value), or a "
                                      "heatmap of --z over --x and --y.")
    plot.add_argument("sweep_dir", help="a directory written by clustersim sweep")
    plot.add_argument("--x", required=True, help="column for the x axis, e.g. cluster.nodes")
    plot.add_argument("--y", required=True, help="metric (line) or key (heatmap)")
    plot.add_argument("--hue", help="one line per value of this column")
    plot.add_argument("--z", help="metric for a heatmap over --x and --y")
    plot.add_argument("--out", help="figure file (default: DIR/plot.png)")


def _gantt_parser(sub) -> None:
    gantt = sub.add_parser("gantt", help="re-draw the Gantt chart of a finished run",
                           description="Draw RUN_DIR's spans again, without simulating.")
    gantt.add_argument("run_dir", help="a directory written by clustersim run")
    gantt.add_argument("--out", help="figure file (default: RUN_DIR/gantt.FORMAT)")
    gantt.add_argument("--format", choices=FORMATS, default="png")
    gantt.add_argument("--ranks", help="ranks to draw, e.g. 0-7,64")
    gantt.add_argument("--from", dest="start", help="window start, e.g. '120 ms'")
    gantt.add_argument("--to", dest="end", help="window end, e.g. '0.5 s'")
    gantt.add_argument("--streams", action="store_true", help="one row per rank and stream")
    gantt.add_argument("--no-group", action="store_true",
                       help="never merge identical ranks into one row")
    gantt.add_argument("--no-breakdown", action="store_true",
                       help="leave out the time-breakdown panel")


def _collective_parser(sub) -> None:
    from simulator.base.ir import Collective
    from simulator.collectives.nccl_tests import DTYPES

    tool = sub.add_parser("collective", help="nccl-tests-style sweep of one collective",
                          description="Time one collective over a range of sizes on an idle "
                                      "fabric and print nccl-tests' table.")
    tool.add_argument("--cluster", required=True, help="cluster preset (clustersim presets)")
    tool.add_argument("--nodes", type=int, default=1, help="servers (default 1)")
    tool.add_argument("--op", default="all_reduce", choices=[c.value for c in Collective])
    tool.add_argument("--min-bytes", "-b", default="32M", help="smallest size, e.g. 8, 1M")
    tool.add_argument("--max-bytes", "-e", default="8G", help="largest size, e.g. 8G")
    tool.add_argument("--factor", "-f", type=float, default=2.0, help="size multiplier")
    tool.add_argument("--group", help="ranks, e.g. 0-7,64 (default: every GPU; send_recv "
                                      "sends from the first rank to the second)")
    tool.add_argument("--algorithm", default="auto", help="auto | ring | tree | nvls")
    tool.add_argument("--protocol", default="auto", help="auto | ll | ll128 | simple")
    tool.add_argument("--dtype", default="float", choices=list(DTYPES))
    tool.add_argument("--csv", help="also write the table to this CSV file")
    tool.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                      help="override a cluster key, e.g. nic_bandwidth=400Gb/s (repeatable)")


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
        _critical_line(summary["critical_path"]),
        f"peak memory      {summary['peak_memory_gib']:.2f} GiB of "
        f"{summary['gpu_memory_gib']:.0f} GiB"
        + (f" (OOM: rank {summary['oom_rank']} by {summary['oom_excess_gib']:.2f} GiB)"
           if summary["oom"] else "")
        + "  [" + ", ".join(f"{k} {format_bytes(v * 2**30)}" for k, v in mem.items()) + "]",
        f"simulated        {summary['events']:,} events in {summary['wall_s']:.2f} s wall",
        f"outputs          {out}/",
    ]
    return "\n".join(lines)


def _critical_line(path: dict) -> str:
    parts = [f"{name} {format_time(path[f'{name}_s'])}"
             for name in ("compute", "communication", "waiting", "bubble", "idle")
             if path[f"{name}_s"] > 0]
    where = f"{path['ranks']} rank(s)" + (f", {path['stages']} stage(s)" if "stages" in path
                                          else "")
    return f"critical path    {', '.join(parts)} over {path['spans']:,} spans on {where}"


def cmd_run(args: argparse.Namespace) -> int:
    from simulator.experiments.runner import run

    scenario = load(args.scenario, args.set)
    out = Path(args.out) if args.out else Path("runs") / scenario.name
    result = run(scenario)
    run_dir.write(result, out, args.format)
    if args.json:
        print(json.dumps(result.summary, indent=2))
    else:
        print(_human(result.summary, out))
    return 0


def _time_option(text: str | None, name: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text) if text.replace(".", "", 1).isdigit() else parse_time(text)
    except UnitError as error:
        raise ScenarioError(f"{name}: {error}") from None


def _figure(path: str | Path, option: str) -> Path:
    """A figure path whose suffix names a format we write, or a one-line error."""
    path = Path(path)
    if path.suffix.lstrip(".") not in FORMATS:
        raise ScenarioError(f"{option}: {path.name} must end in one of .png, .pdf, .svg")
    return path


def _ranks_option(text: str | None, total: int) -> list[int] | None:
    if text is None:
        return None
    try:
        return parse_ranks(text, total, minimum=1)
    except ValueError as error:
        raise ScenarioError(f"--ranks: {error}") from None


def cmd_gantt(args: argparse.Namespace) -> int:
    from simulator.outputs.gantt import plot_gantt

    finished = run_dir.read(args.run_dir)
    total = int(finished.spans["rank"].max()) + 1
    start, end = _time_option(args.start, "--from"), _time_option(args.end, "--to")
    if start is not None and end is not None and end <= start:
        raise ScenarioError(f"--to: {args.end} must be later than --from {args.start}")
    out = _figure(args.out or finished.path / f"gantt.{args.format}", "--out")
    plot_gantt(finished.spans, out, finished.name, ranks=_ranks_option(args.ranks, total),
               start=start, end=end, streams=args.streams,
               group=False if args.no_group else None, breakdown=not args.no_breakdown)
    print(out)
    return 0


def cmd_comms(args: argparse.Namespace) -> int:
    from simulator.analysis import comms
    from simulator.outputs import comms_plot

    finished = run_dir.read(args.run_dir)
    table, bins = comms.profile(finished.comms), comms.histogram(finished.comms)
    print(f"communication of {finished.name}: {len(finished.comms):,} calls and messages, "
          f"{format_bytes(float(finished.comms['bytes'].sum()))}")
    print(comms.format_profile(table))
    print()
    print("calls per message size (bins of powers of two):")
    print(comms.format_histogram(bins))
    if args.csv:
        table.to_csv(args.csv, index=False, float_format="%.9g")
    if args.histogram_csv:
        bins.to_csv(args.histogram_csv, index=False, float_format="%.9g")
    if args.plot:
        comms_plot.plot_histogram(bins, _figure(args.plot, "--plot"), finished.name)
    return 0


def _design(args: argparse.Namespace) -> tuple[Path, dict, dict]:
    from simulator.experiments import sweep

    grid = dict(sweep.parse_axis(text, "--grid") for text in args.grid)
    zipped = dict(sweep.parse_axis(text, "--zip") for text in args.zip)
    raw = load_yaml_mapping(args.base)
    if "base" in raw:  # a sweep file; command-line axes add to its own
        base, file_grid, file_zip = sweep.read_design(args.base)
        return base, {**file_grid, **grid}, {**file_zip, **zipped}
    if not grid and not zipped:
        raise ScenarioError("sweep: give --grid KEY=V1,V2 (or --zip), or a sweep file")
    return Path(args.base), grid, zipped


def load_yaml_mapping(path: str) -> dict:
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except (OSError, yaml.YAMLError) as error:
        raise ScenarioError(f"{path}: cannot read ({error})") from None
    return raw if isinstance(raw, dict) else {}


class _Bar:
    """tqdm progress bar: cases done, failed, ETA."""

    def __init__(self, total: int, done: int) -> None:
        from tqdm import tqdm

        self.failed = 0
        self.bar = tqdm(total=total, initial=done, unit="case", dynamic_ncols=True)

    def update(self, row: dict) -> None:
        self.failed += row["status"] != "ok"
        self.bar.set_postfix(failed=self.failed, refresh=False)
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def cmd_sweep(args: argparse.Namespace) -> int:
    from simulator.experiments import sweep

    base, grid, zipped = _design(args)
    if args.workers < 1:
        raise ScenarioError(f"--workers: {args.workers} must be at least 1")
    try:
        results, invalid = sweep.sweep(base, grid, zipped, args.out, args.workers, args.dask,
                                       args.retry_failed, _Bar)
    except KeyboardInterrupt:
        print(f"interrupted: the finished cases are in {args.out}/results.csv; run the same "
              "command again to resume", file=sys.stderr)
        return 130
    table = results.table()
    failed = table[table["status"] != "ok"] if len(table) else table
    print(f"{len(table)} cases in {args.out}/results.csv (and .parquet): "
          f"{len(table) - len(failed)} ok, {len(failed)} failed, {len(invalid)} invalid")
    for error in list(dict.fromkeys(invalid.values()))[:5]:
        print(f"  invalid: {error}")
    for error in failed["error"].head(5) if len(failed) else []:
        print(f"  failed: {error}")
    return 0 if len(failed) == 0 else 1


def cmd_plot(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulator.outputs.sweep_plot import plot

    path = Path(args.sweep_dir) / "results.parquet"
    if not path.exists():
        raise ScenarioError(f"{args.sweep_dir}: no results.parquet (run clustersim sweep)")
    out = _figure(args.out or Path(args.sweep_dir) / "plot.png", "--out")
    if args.hue and args.z:
        raise ScenarioError("--hue: a heatmap (--z) has no hue; give one of them")
    try:
        plot(pd.read_parquet(path), out, args.x, args.y, args.hue, args.z,
             title=Path(args.sweep_dir).name)
    except ValueError as error:
        raise ScenarioError(str(error)) from None
    print(out)
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from simulator.experiments import validate

    cases = validate.select(validate.load_cases(), args.case, args.tag)
    if args.list:
        for case in cases:
            print(f"{case.name:30} {','.join(case.tags):24} {case.metric:16} "
                  f"{case.measured:g} {case.unit}")
        return 0
    table = validate.run_cases(cases, lambda c: print(f"  {c.name} ...", file=sys.stderr))
    groups = validate.by_group(table)
    if args.markdown:
        print(validate.markdown(table))
        print()
        print("| group | cases | mean abs. error | worst |")
        print("|---|---:|---:|---|")
        for g in groups.itertuples(index=False):
            print(f"| {g.group} | {g.cases} | {g.mean_abs_error_pct:.1f} % | "
                  f"{g.worst_abs_error_pct:.1f} % ({g.worst_case}) |")
    else:
        print(f"{'case':30} {'measured':>14} {'simulated':>14} {'error':>9}  basis")
        for r in table.itertuples(index=False):
            print(f"{r.case:30} {r.measured:>9g} {r.unit:<4} {r.simulated:>9.1f} {r.unit:<4} "
                  f"{r.error_pct:>+8.1f}%  {r.basis}")
        print()
        for g in groups.itertuples(index=False):
            print(f"{g.group:14} {g.cases:3} cases  mean |error| {g.mean_abs_error_pct:5.1f} %  "
                  f"worst {g.worst_abs_error_pct:5.1f} % ({g.worst_case})")
    if args.csv:
        table.to_csv(args.csv, index=False, float_format="%.6g")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    from simulator.compute import calibration
    from topologies import GPUS
    from topologies.gpus import CALIBRATION_FIELDS

    if args.gpu not in GPUS:
        raise ScenarioError(f"--gpu: {args.gpu!r} is not one of {', '.join(GPUS)}")
    gpu = GPUS[args.gpu]
    if args.precision not in gpu.peak_flops:
        raise ScenarioError(f"--precision: {args.precision!r} is not one of "
                            f"{', '.join(gpu.peak_flops)} for {gpu.name}")
    try:
        table = calibration.read_kernels(args.kernels)
        values = calibration.fit(table, gpu, args.precision)
    except calibration.CalibrationError as error:
        raise ScenarioError(str(error)) from None
    calibration.write_calibration(args.out, gpu, values, table, str(args.kernels),
                                  args.precision)
    print(f"calibration of {gpu.name} from {len(table)} kernels "
          f"({', '.join(f'{n} {k}' for k, n in table['kind'].value_counts().items())})")
    print(f"{'':22} {'preset':>12} {'fitted':>12}")
    for key in CALIBRATION_FIELDS:
        print(f"{key:22} {getattr(gpu, key):12.6g} {values[key]:12.6g}")
    errors = 100 * (calibration.modelled(table, gpu, values, args.precision)
                    / table["seconds"] - 1)
    for kind, part in errors.groupby(table["kind"]):
        print(f"{kind:10} modelled vs measured: mean |error| {part.abs().mean():.1f} %, "
              f"worst {part.abs().max():.1f} %")
    print(f"written          {args.out}  (use it with cluster.calibration: {args.out})")
    return 0


COMPARED = ("iteration_time_s", "tokens_per_s", "model_tflops_per_gpu", "mfu", "compute_s",
            "exposed_comm_s", "overlapped_comm_s", "comm_wait_s", "bubble_s", "idle_s",
            "peak_memory_gib", "gpus")


def cmd_compare(args: argparse.Namespace) -> int:
    from simulator.outputs.gantt import compare_figure
    from simulator.outputs.style import save

    a, b = run_dir.read(args.run_a), run_dir.read(args.run_b)
    names = (a.name, b.name) if a.name != b.name else (f"A: {a.path.name}", f"B: {b.path.name}")
    print(f"{'':24} {names[0][:20]:>20} {names[1][:20]:>20} {'B / A':>8}")
    for key in COMPARED:
        va, vb = a.summary.get(key), b.summary.get(key)
        if not isinstance(va, (int, float)) or not isinstance(vb, (int, float)):
            continue
        ratio = f"{vb / va:8.3f}" if va else f"{'-':>8}"
        print(f"{key:24} {va:20.6g} {vb:20.6g} {ratio}")
    total = int(max(a.spans["rank"].max(), b.spans["rank"].max())) + 1
    out = _figure(args.out or b.path / "compare.png", "--out")
    save(compare_figure(a.spans, b.spans, names, _ranks_option(args.ranks, total)),
         out)
    print(f"figure           {out}")
    return 0


def cmd_presets(_args: argparse.Namespace) -> int:
    from topologies import CLUSTERS, GPUS
    from workloads.kernels import parameter_count
    from workloads.models import MODELS

    print("clusters (cluster.preset):")
    for c in CLUSTERS.values():
        nvls = ", NVLS" if c.nvls else ""
        print(f"  {c.name:10} {c.gpus_per_node} x {c.gpu}, {c.intra_node.value}{nvls} "
              f"{c.nvlink_bandwidth / 1e9:g} GB/s per GPU (x{c.nvlink_efficiency:g} reached), "
              f"{c.nics_per_node} NICs x {c.nic_bandwidth * 8 / 1e9:g} Gb/s "
              f"(x{c.nic_efficiency:g}), {c.fabric.name}, link latency "
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


def cmd_collective(args: argparse.Namespace) -> int:
    import pandas as pd

    from simulator.base.ir import Collective
    from simulator.collectives import nccl_tests
    from simulator.collectives.tuner import Collectives
    from simulator.config.scenario import apply_overrides, machine_from, network_from
    from simulator.network.fabric import Fabric

    sets = [a if a.startswith("cluster.") else f"cluster.{a}" for a in args.set]
    raw = apply_overrides({"cluster": {"preset": args.cluster, "nodes": args.nodes}}, sets)
    machine = machine_from(raw["cluster"])
    algorithm, protocol, _ = network_from({"algorithm": args.algorithm,
                                           "protocol": args.protocol}, machine)
    try:
        byte_sizes = nccl_tests.sizes(nccl_tests.parse_size(args.min_bytes),
                                      nccl_tests.parse_size(args.max_bytes), args.factor)
        ranks = (nccl_tests.parse_ranks(args.group, machine.gpus) if args.group
                 else list(range(machine.gpus)))
    except ValueError as error:
        raise ScenarioError(f"collective: {error}") from None
    kind = Collective(args.op)
    graph = machine.build_graph()
    fabric = Fabric(graph)
    gpus = [graph.graph["gpus"][r] for r in (ranks[:2] if kind is Collective.SEND_RECV
                                               else ranks)]
    tuner = Collectives(fabric, algorithm, protocol)
    rows, wall = nccl_tests.run_sweep(fabric, tuner, kind, gpus, byte_sizes, args.dtype)
    header = [f"clustersim collective: {kind.value} on {len(gpus)} of {machine.gpus} GPUs "
              f"({machine.nodes} x {machine.cluster.name}, {machine.cluster.fabric.name})",
              f"algorithm {args.algorithm}, protocol {args.protocol}"]
    print(nccl_tests.format_table(rows, header))
    print(f"# simulated {len(rows)} sizes in {wall:.2f} s wall, "
          f"{sum(r.events for r in rows):,} events")
    if args.csv:
        pd.DataFrame([r.__dict__ for r in rows]).to_csv(args.csv, index=False,
                                                         float_format="%.9g")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    handler = {"run": cmd_run, "presets": cmd_presets, "collective": cmd_collective,
               "gantt": cmd_gantt, "comms": cmd_comms, "compare": cmd_compare,
               "sweep": cmd_sweep, "plot": cmd_plot, "calibrate": cmd_calibrate,
               "validate": cmd_validate}[args.command]
    try:
        return handler(args)
    except (ScenarioError, run_dir.RunDirError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except (SimulationError, FabricError, CollectiveError) as error:
        print(f"simulation failed: {error}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # e.g. `clustersim presets | head`: the reader left
        sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - silence the flush at exit
        return 0


if __name__ == "__main__":
    sys.exit(main())
