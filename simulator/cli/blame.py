"""``clustersim blame``: what set a finished run's iteration time beyond the ideal.

Prints the ranked causes the run's summary names (stragglers, congested or
degraded links, other jobs: ``analysis.blame``), the ranks that arrived last
at collective calls with the time their peers waited for them, and draws the
links' utilisation over time as a heat map (the run's scenario is read again
to lower its calls; nothing is simulated).
"""

from __future__ import annotations

import argparse

from simulator.base.units import format_time
from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs import run_dir
from simulator.outputs.out_dirs import guarded
from simulator.outputs.style import FORMATS


def add_parser(sub) -> None:
    blame = sub.add_parser("blame", help="what set a finished run's iteration time",
                           description="Ranked causes of the time beyond the ideal, the "
                                       "slowest rank per collective call, and a heat map of "
                                       "link utilisation over time, from RUN_DIR.")
    blame.add_argument("run_dir", help="a directory written by clustersim run")
    blame.add_argument("--out", help="heat map file (default: RUN_DIR/links.FORMAT)")
    blame.add_argument("--format", choices=FORMATS, default="png")
    blame.add_argument("--top", type=int, default=8, help="ranks and links to list (8)")


def run(args: argparse.Namespace) -> int:
    from simulator.analysis.blame import last_arrivals, ranks_to_blame

    if args.top < 1:
        raise ScenarioError(f"--top: {args.top} must be at least 1")
    finished = run_dir.read(args.run_dir)
    out = options.figure(args.out or finished.path / f"links.{args.format}", "--out")
    summary = finished.summary
    print(f"blame for {finished.name}: iteration {format_time(summary['iteration_time_s'])}")
    print(*cause_lines(summary), sep="\n")
    spans = finished.spans
    trained = [j for j in summary.get("jobs", ()) if j["kind"] == "training"]
    if len(trained) < len(summary.get("jobs", ())):  # background traffic's ranks come last
        spans = spans[spans["rank"] < max(j["first_rank"] + j["gpus"] for j in trained)]
    late = ranks_to_blame(last_arrivals(spans))
    print("slowest rank per collective call (the last to arrive; the others waited for it):")
    if finished.comms.empty:
        print("  none: the run has no collective calls")
    elif late.empty:
        print("  none: every call's members arrived together")
    for row in late.head(args.top).itertuples(index=False):
        print(f"  rank {int(row.rank):<6} last at {int(row.calls_last):,} call(s); its peers "
              f"waited {format_time(row.caused_wait_s)} in all")
    drawn = _heat_map(finished, out, args.top * 3)
    print(f"link utilisation over time: {drawn}")
    return 0


def cause_lines(summary: dict) -> list[str]:
    """The summary's ranked causes, one line each."""
    causes = summary.get("blame")
    if causes is None:
        return ["  (this run's summary has no blame: run it again with this version)"]
    total = sum(c["seconds"] for c in causes)
    lines = [f"beyond the ideal on the critical path: {format_time(total)} "
             f"({total / summary['iteration_time_s']:.1%} of the iteration)"]
    if not causes:
        lines.append("  nothing: every span on it took its ideal time")
    for k, cause in enumerate(causes, start=1):
        lines.append(f"  {k}. {cause['kind']:<9} {cause['cause']:<28} "
                     f"{format_time(cause['seconds']):>12}  {cause['detail']}")
    return lines


def _heat_map(finished, out, top: int) -> str:
    """Draw the heat map; what was drawn, or why not."""
    from simulator.analysis.link_load import Context, utilisation
    from simulator.config.scenario import from_dict
    from simulator.outputs.link_heatmap import plot_link_heatmap
    from simulator.runner import jobs

    try:
        scenario = from_dict(finished.scenario, base_dir=finished.path)
    except ScenarioError as error:
        return f"not drawn: the run's scenario no longer loads ({error})"
    # (the groups do not depend on how long background traffic runs)
    program = jobs.programs(scenario, 0.0)[0]
    context = Context(program.groups, finished.placement, scenario.fabric_states())
    use, names = utilisation(finished.comms, context, finished.summary["iteration_time_s"],
                             top=top)
    if not names:
        return "not drawn: no traffic crossed a link"
    guarded(out, lambda: plot_link_heatmap(use, names, finished.summary["iteration_time_s"],
                                           out, f"{finished.name}: the {len(names)} busiest "
                                                "links"))
    return f"{out} ({len(names)} busiest links)"
