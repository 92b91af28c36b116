"""``clustersim gantt``: re-draw a finished run's Gantt chart without simulating."""

from __future__ import annotations

import argparse

from simulator.base.units import format_time
from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs import run_dir
from simulator.outputs.out_dirs import guarded
from simulator.outputs.style import FORMATS


def add_parser(sub) -> None:
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


def run(args: argparse.Namespace) -> int:
    from simulator.outputs.gantt import plot_gantt

    finished = run_dir.read(args.run_dir)
    total = len(finished.placement)
    start, end = options.time_option(args.start, "--from"), options.time_option(args.end, "--to")
    if start is not None and end is not None and end <= start:
        raise ScenarioError(f"--to: {args.end} must be later than --from {args.start}")
    out = options.figure(args.out or finished.path / f"gantt.{args.format}", "--out")
    ranks = options.ranks_option(args.ranks, total)
    spans = finished.spans if ranks is None else finished.spans_of(ranks)
    if end is None and "jobs" in finished.summary:  # background traffic runs on past them
        end = finished.summary["iteration_time_s"]
    _check_window(start, end, spans)
    guarded(out, lambda: plot_gantt(
        spans, out, finished.name, ranks=ranks, start=start, end=end, streams=args.streams,
        group=False if args.no_group else None, breakdown=not args.no_breakdown,
        classes=finished.classes() if ranks is None else None))
    print(out)
    return 0


def _check_window(start: float | None, end: float | None, spans) -> None:
    """A window that holds no part of the run is a mistake, not an empty chart."""
    if not len(spans):
        return
    first, last = float(spans["start"].min()), float(spans["end"].max())
    if start is not None and start >= last:
        raise ScenarioError(f"--from: {format_time(start)} is at or after the run's end "
                            f"({format_time(last)})")
    if end is not None and end <= first:
        raise ScenarioError(f"--to: {format_time(end)} is at or before the run's start "
                            f"({format_time(first)})")
