"""``clustersim run``: simulate one iteration of a scenario and write its run
directory; given several scenarios, each into its own folder (named after the
scenario) and one table comparing them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from simulator.base.clock import STARTED
from simulator.base.units import format_bytes, format_time
from simulator.base.user_files import file_name
from simulator.cli import options
from simulator.cli.failures import failure
from simulator.config.scenario import ScenarioError, load
from simulator.outputs import out_dirs, run_dir
from simulator.outputs.out_dirs import OutputError
from simulator.outputs.style import FORMATS


def add_parser(sub) -> None:
    run = sub.add_parser("run", help="simulate one training iteration of a scenario")
    run.add_argument("scenario", nargs="+", help="scenario YAML file(s); several: each "
                                                 "runs in turn and a table compares them")
    run.add_argument("--out", help="output directory (default: runs/<scenario name>); with "
                                   "several scenarios, the folder holding each one's run, "
                                   "named after it (default: runs)")
    run.add_argument("--format", choices=FORMATS, default="png", help="Gantt figure format")
    run.add_argument("--json", action="store_true", help="print summary.json to stdout")
    run.add_argument("--spans-csv", action="store_true",
                     help="also write spans.csv and comms.csv for a large run (the Parquet "
                          "tables are always written; the CSVs by default only up to "
                          "100,000 rows)")
    run.add_argument("--trace", action=argparse.BooleanOptionalAction, default=None,
                     help="write trace.json (default: for runs of at most 1,000,000 spans, "
                          "every rank's; clustersim trace RUN_DIR --ranks ... writes any "
                          "ranks' later)")
    run.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                     help="override a scenario key (repeatable)")


def _human(summary: dict, out: Path, command_s: float, traced: bool = True,
           asked: bool = False) -> str:
    """The summary for a person (``traced``: whether trace.json was written;
    ``asked``: left out because --no-trace said so)."""
    lines = [
        f"iteration time   {format_time(summary['iteration_time_s'])}",
        f"throughput       {summary['tokens_per_s']:,.0f} tokens/s, "
        f"{summary['model_tflops_per_gpu']:.1f} model TFLOP/s per GPU, "
        f"MFU {summary['mfu']:.1%} on {summary['gpus']} GPU{'s' * (summary['gpus'] != 1)}",
        *([f"precision        {summary['precision']}: MFU {summary['mfu_lowp']:.1%} of its "
           f"dense peak ({summary['mfu']:.1%} of BF16's); casts "
           f"{format_time(summary['lowp_overhead_s'])} on the last rank"]
          if "precision" in summary else []),
        f"last rank {summary['critical_rank']:<6} compute {format_time(summary['compute_s'])}, "
        f"exposed comm {format_time(summary['exposed_comm_s'])}, "
        f"overlapped comm {format_time(summary['overlapped_comm_s'])}, "
        f"waiting {format_time(summary['comm_wait_s'])}, "
        f"bubble {format_time(summary['bubble_s'])}",
        _critical_line(summary["critical_path"]),
        *_memory_lines(summary),
        *_job_lines(summary),
        *_moe_lines(summary),
        *_straggler_lines(summary),
        *([f"nvlink           {summary['nvlink_domains']}"] if "nvlink_domains" in summary
          else []),
        *([f"faults           {'; '.join(summary['faults'])}"] if "faults" in summary else []),
        *(["blame            " + "; ".join(
            f"{c['kind']} {c['cause']} {format_time(c['seconds'])}" for c in summary["blame"][:3])
           + " beyond the ideal (clustersim blame RUN_DIR)"] if summary.get("blame") else []),
        *_simulated_lines(summary, command_s),
        f"outputs          {out}/" + _untraced(out, traced, asked),
    ]
    return "\n".join(lines)


def _memory_lines(summary: dict) -> list[str]:
    """Peak GPU memory by category (and the OOM), and host memory where used."""
    mem = summary["memory_gib"]
    return [
        f"peak memory      {summary['peak_memory_gib']:.2f} GiB of "
        f"{summary['gpu_memory_gib']:.0f} GiB"
        + (f" (OOM: rank {summary['oom_rank']} by {summary['oom_excess_gib']:.2f} GiB"
           + (" of host memory" if summary.get("oom_memory") == "host" else "") + ")"
           if summary["oom"] else "")
        + "  [" + ", ".join(f"{k} {format_bytes(v * 2**30)}" for k, v in mem.items()) + "]",
        *([f"host memory      {summary['host_peak_memory_gib']:.2f} GiB of "
           f"{summary['host_memory_capacity_gib']:.0f} GiB per GPU  [" + ", ".join(
               f"{k} {format_bytes(v * 2**30)}" for k, v in summary["host_memory_gib"].items())
           + "]"] if "host_peak_memory_gib" in summary else []),
    ]


def _simulated_lines(summary: dict, command_s: float) -> list[str]:
    """How the run was simulated: the method, what timed the kernels, the host,
    the token exchanges, NCCL beside compute, events and wall time."""
    return [
        f"simulated        {summary['simulation']}",
        f"                 kernels timed by the {summary['compute_model']}; "
        f"host-bound launches add {format_time(summary['host_stall_s'])} of compute",
        *([f"                 token exchanges: {summary['token_exchange']}"]
          if summary.get("token_exchange") else []),
        f"                 NCCL beside compute adds {format_time(summary['overlap_slowdown_s'])}"
        f" to it: {summary['overlap_slowdown']}",
        f"                 {summary['events']:,} events in {summary['wall_s']:.2f} s wall"
        + (f" over {summary['job_runs']} runs (each training job alone, then all together)"
           if summary.get("job_runs", 1) > 1 else "") + "; "
        f"whole command with its outputs {command_s:.2f} s",
    ]


def _untraced(out: Path, traced: bool, asked: bool) -> str:
    """Why trace.json is missing, and how to write it, where it is."""
    if traced:
        return ""
    if asked:
        return f" (no trace.json, as --no-trace asked: clustersim trace {out} --ranks 0-7)"
    return f" (no trace.json for a run this large: clustersim trace {out} --ranks 0-7, or --trace)"


def _job_lines(summary: dict) -> list[str]:
    """Each job's time and slow-down against running alone, or what its background
    traffic delivered (the lines above are the slowest training job's and the
    training GPUs' together)."""
    lines = []
    several = sum(job["kind"] == "training" for job in summary.get("jobs", ())) > 1
    for job in summary.get("jobs", ()):
        nodes = ", ".join(map(str, job["nodes"][:8])) + (" ..." if len(job["nodes"]) > 8 else "")
        if job["kind"] == "training":
            text = (f"{job['name']} on nodes {nodes} ({job['gpus']} GPUs): "
                    f"{format_time(job['iteration_time_s'])}, x{job['slowdown']:.3f} its "
                    f"{format_time(job['alone_s'])} alone, MFU {job['mfu']:.1%}"
                    + (f" ({job['precision']}: MFU {job['mfu_lowp']:.1%} of its dense peak)"
                       if "precision" in job else ""))
            if several and "moe_routing" in job:  # (one training job's are the run's lines)
                text += "; " + _moe_text(job)
        else:
            text = (f"{job['name']} on nodes {nodes}: background {job['traffic']}, "
                    f"{job['delivered_gb_s']:.1f} of {job['offered_gb_s']:.1f} GB/s per stream "
                    f"delivered, {job['messages']:,} messages of "
                    f"{format_time(job['message_time_s'])} on average")
        lines.append(f"{'jobs' if not lines else '':<17}{text}")
    return lines


def _straggler_lines(summary: dict) -> list[str]:
    """The slowest GPUs, where some compute slower than others, and the throttled."""
    lines = []
    if "stragglers" in summary:
        slowest = ", ".join(f"rank {r} x{f:.3f}" for r, f in summary["stragglers"][:4])
        more = summary["straggler_count"] - min(4, len(summary["stragglers"]))
        lines.append(f"stragglers       {summary['straggler_count']:,} GPU(s) slower than the "
                     f"kernel table: {slowest or 'none'}"
                     + (f" and {more:,} more" if more > 0 else ""))
    if "throttled" in summary:
        shown = "; ".join(f"rank {r} " + ", ".join(f"x{f:g} from {format_time(t)}"
                                                     for t, f in steps)
                          for r, steps in summary["throttled"][:3])
        more = summary["throttled_count"] - min(3, len(summary["throttled"]))
        lines.append(f"throttled        {summary['throttled_count']:,} GPU(s): {shown}"
                     + (f" and {more:,} more" if more > 0 else ""))
    return lines


def _moe_lines(summary: dict) -> list[str]:
    """What routing came to, in a model with experts (the MoE keys come all
    together: ``analysis.summary.moe_keys``)."""
    if "moe_routing" not in summary:
        return []
    dropped = summary["moe_dropped_fraction"]
    return [f"experts          {summary['moe_routing']} routing: the busiest expert-parallel "
            f"rank gets x{summary['moe_rank_imbalance']:.3f} the mean rank's tokens, the "
            f"busiest expert x{summary['moe_expert_imbalance']:.3f} the mean expert's"
            + (f"; {dropped:.1%} of token copies dropped at capacity" if dropped else ""),
            f"                 imbalance costs the last rank about "
            f"{format_time(summary['moe_imbalance_s'])} of expert kernels and all-to-alls",
            f"                 its token all-to-alls take {format_time(summary['moe_a2a_s'])}, "
            f"{format_time(summary['moe_a2a_hidden_s'])} of it under its own compute"]


def _moe_text(job: dict) -> str:
    """A job's MoE keys in a few words."""
    dropped = job["moe_dropped_fraction"]
    return (f"experts {job['moe_routing']}, busiest rank x{job['moe_rank_imbalance']:.3f}, "
            f"imbalance {format_time(job['moe_imbalance_s'])}"
            + (f", {dropped:.1%} dropped" if dropped else ""))


def _critical_line(path: dict) -> str:
    parts = [f"{name} {format_time(path[f'{name}_s'])}"
             for name in ("compute", "communication", "waiting", "bubble", "idle")
             if path[f"{name}_s"] > 0]
    where = f"{path['ranks']} rank(s)" + (f", {path['stages']} stage(s)" if "stages" in path
                                          else "")
    return f"critical path    {', '.join(parts)} over {path['spans']:,} spans on {where}"


_STARTS = [STARTED]  # the process's first command started at the package's import


def run(args: argparse.Namespace) -> int:
    if len(args.scenario) > 1:
        return _several(args)
    started = _STARTS.pop() if _STARTS else time.perf_counter()
    scenario = load(args.scenario[0], args.set)
    option = "--out" if args.out else "name (the default --out runs/NAME)"
    out = Path(args.out) if args.out else Path("runs") / file_name(scenario.name)
    summary, traced = _one(args, scenario, out, option, started)
    _print(args, summary, out, started, traced)
    return 0


def _one(args: argparse.Namespace, scenario, out: Path, option: str, started: float
         ) -> tuple[dict, bool]:
    """Run ``scenario`` into the run directory ``out``: (its summary, whether a
    trace was written)."""
    from simulator.runner.simulate import run as simulate

    with options.removed_if_failed(out):
        out = options.output_dir(out, option)
        held = out_dirs.replaceable(out, option)
        # an internal error's traceback goes beside the run directory (which a run
        # replaces whole, and where a file of its own would make it no longer a run's)
        args.crash_dir = str(out.absolute().parent)
        with out_dirs.exclusive(out, option):  # a second run into out is refused meanwhile
            result = simulate(scenario)
            try:
                run_dir.write(result, out, args.format, spans_csv=args.spans_csv,
                              trace=args.trace)
            except OutputError:  # the results are not lost: they go to the terminal
                _print(args, result.summary, out, started, True)
                raise
    if held not in (None, scenario.name):
        print(f"note: {out} held a run of the scenario {held!r}; it now holds this one",
              file=sys.stderr)
    return result.summary, run_dir.writes_trace(result, args.trace)


def _several(args: argparse.Namespace) -> int:
    """Every scenario checked first, then each run into ``--out``/NAME in turn
    (one that fails, in any way, is a row of the table with its error, and
    leaves no folder; the others still run); the table, or the summaries as a
    JSON list. Exit as the worst failure would alone (``failures``), else 0."""
    scenarios = [load(path, args.set) for path in args.scenario]
    folders = [file_name(s.name) for s in scenarios]
    for k, name in enumerate(folders):
        if name in folders[:k]:
            first = args.scenario[folders.index(name)]
            raise ScenarioError(f"{args.scenario[k]}: its name {scenarios[k].name!r} is "
                                f"also {first}'s; each run needs a folder of its own: give "
                                "the scenarios different names")
    parent = Path(args.out or "runs")
    rows, codes = [], [0]
    for path, scenario, name in zip(args.scenario, scenarios, folders, strict=True):
        started = time.perf_counter()
        try:
            summary, _ = _one(args, scenario, parent / name, "--out", started)
            rows.append((path, scenario.name, parent / name, summary, ""))
        except Exception as error:  # noqa: BLE001 - its row says it; the others still run
            code, line = failure(error, getattr(args, "crash_dir", None))
            codes.append(code)
            rows.append((path, scenario.name, parent / name, None, line))
            print(f"{path}: {line}", file=sys.stderr)
    if args.json:
        print(json.dumps([{"scenario": path, "name": name, "run_dir": str(out),
                           **({"summary": s} if s else {"error": why})}
                          for path, name, out, s, why in rows], indent=2))
    else:
        print(comparison(rows))
    return max(codes)


COLUMNS = ("scenario", "GPUs", "iteration", "tokens/s", "MFU", "peak memory", "exposed comm",
           "bubble", "run directory")


def comparison(rows: list[tuple]) -> str:
    """A text table of several runs' headline figures, one row per scenario."""
    table = [COLUMNS]
    for _, name, out, s, why in rows:
        if s is None:
            table.append((name, "-", why[:60], "", "", "", "", "", ""))  # (no folder left)
            continue
        table.append((name, f"{s['gpus']:,}", format_time(s["iteration_time_s"]),
                      f"{s['tokens_per_s']:,.0f}", f"{s['mfu']:.1%}",
                      f"{s['peak_memory_gib']:.1f} GiB" + (" OOM" if s["oom"] else ""),
                      format_time(s["exposed_comm_s"]), format_time(s["bubble_s"]), str(out)))
    widths = [max(len(str(row[k])) for row in table) for k in range(len(COLUMNS))]
    lines = ["  ".join(str(cell).ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
             for row in table]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def _print(args, summary: dict, out: Path, started: float, traced: bool) -> None:
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        print(_human(summary, out, time.perf_counter() - started, traced,
                     asked=args.trace is False))
