"""``clustersim validate``: the validation set against published measurements."""

from __future__ import annotations

import argparse
import math
import sys

import pandas as pd

from simulator.cli import options
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    validate = sub.add_parser("validate", help="compare with published measurements",
                              description="Run the validation set (published measurements "
                                          "rebuilt as scenarios, collectives and kernels) and "
                                          "print measured, simulated and error per case, then "
                                          "the mean absolute and mean signed error (positive: "
                                          "simulated faster) per group and per half (fit, "
                                          "check) with the gap between the halves.")
    validate.add_argument("--case", action="append", default=[], help="a case (repeatable)")
    validate.add_argument("--tag", action="append", default=[],
                          help="cases with this tag, e.g. megatron, nccl-tests (repeatable)")
    validate.add_argument("--csv", help="write the per-case table to this CSV file")
    validate.add_argument("--markdown", action="store_true", help="print Markdown tables")
    validate.add_argument("--summary", action="store_true",
                          help="print only the per-group and per-half tables, not each case")
    validate.add_argument("--list", action="store_true", help="list the cases and stop")


def run(args: argparse.Namespace) -> int:
    from simulator.experiments import validate

    csv = options.output_file(args.csv, "--csv") if args.csv else None

    cases = validate.select(validate.load_cases(), args.case, args.tag)
    if args.list:
        for case in cases:
            print(f"{case.name:30} {','.join(case.tags):24} {case.metric:16} "
                  f"{case.measured:g} {case.unit}  {case.basis}")
        return 0
    table = validate.run_cases(cases, lambda c: print(f"  {c.name} ...", file=sys.stderr))
    sys.stdout.write(report(table, args.markdown, args.summary))
    if csv:
        guarded(csv, lambda: table.to_csv(csv, index=False, float_format="%.6g"))
    return 0


def block(table: pd.DataFrame, cases: list, args: list[str]) -> str:
    """What ``clustersim validate ARGS`` prints, from ``table``: the rows of a
    run of (at least) the cases ``ARGS`` selects, so that one run of the whole
    set renders every table of the accuracy page."""
    from simulator.experiments import validate

    parser = argparse.ArgumentParser(prog="clustersim")
    add_parser(parser.add_subparsers())
    ns = parser.parse_args(["validate", *args])
    names = [c.name for c in validate.select(cases, ns.case, ns.tag)]
    part = table.set_index("case").loc[names].reset_index()
    return report(part, ns.markdown, ns.summary)


def report(table: pd.DataFrame, markdown: bool, summary: bool) -> str:
    """The command's output for a run's per-case table."""
    from simulator.experiments import validate
    from simulator.experiments.validation_stats import by_half

    groups, halves = validate.by_group(table), by_half(table)
    if markdown:
        parts = ([] if summary else [validate.markdown(table)]) + [
            _markdown_groups(groups), _markdown_halves(halves)]
        return "\n\n".join(parts) + "\n"
    parts = ([] if summary else [_text_cases(table)]) + [_text_groups(groups),
                                                          _text_halves(halves)]
    return "\n\n".join(parts) + "\n"


def _pct(value: float, signed: bool = False, unit: str = " %") -> str:
    if math.isnan(value):
        return "—"
    return f"{value:+.1f}{unit}" if signed else f"{value:.1f}{unit}"


def _text_cases(table: pd.DataFrame) -> str:
    lines = [f"{'case':30} {'measured':>14} {'simulated':>14} {'error':>9}  basis"]
    for r in table.itertuples(index=False):
        digits = 3 if r.unit == "x" else 1  # a speed-up's, a throughput's
        lines.append(f"{r.case:30} {r.measured:>9g} {r.unit:<4} {r.simulated:>9.{digits}f} "
                     f"{r.unit:<4} {r.error_pct:>+8.1f}%  {r.basis}")
    return "\n".join(lines)


def _text_groups(groups: pd.DataFrame) -> str:
    return "\n".join(
        f"{g.group:14} {g.cases:3} cases  mean |error| {g.mean_abs_error_pct:5.1f} %  "
        f"mean signed {g.mean_signed_error_pct:+6.1f} %  "
        f"worst {g.worst_abs_error_pct:5.1f} % ({g.worst_case})"
        for g in groups.itertuples(index=False))


def _text_halves(halves: pd.DataFrame) -> str:
    lines = ["halves (mean signed: positive is simulated faster; gap: check minus fit)",
             f"{'group':14} {'fit: cases':>10} {'|error|':>8} {'signed':>8}  "
             f"{'check: cases':>12} {'|error|':>8} {'signed':>8}  {'gap: |error|':>12} "
             f"{'signed':>10}"]
    for h in halves.itertuples(index=False):
        lines.append(f"{h.group:14} {h.fit_cases:>10} {_pct(h.fit_mae):>8} "
                     f"{_pct(h.fit_signed, True):>8}  {h.check_cases:>12} "
                     f"{_pct(h.check_mae):>8} {_pct(h.check_signed, True):>8}  "
                     f"{_pct(h.gap_mae, True, ' pts'):>12} {_pct(h.gap_signed, True, ' pts'):>10}")
    return "\n".join(lines)


def _markdown_groups(groups: pd.DataFrame) -> str:
    lines = ["| group | cases | mean abs. error | mean signed | worst |",
             "|---|---:|---:|---:|---|"]
    lines += [f"| {g.group} | {g.cases} | {g.mean_abs_error_pct:.1f} % | "
              f"{g.mean_signed_error_pct:+.1f} % | "
              f"{g.worst_abs_error_pct:.1f} % ({g.worst_case}) |"
              for g in groups.itertuples(index=False)]
    return "\n".join(lines)


def _markdown_halves(halves: pd.DataFrame) -> str:
    lines = ["| group | fit: cases | fit: mean abs. | fit: mean signed | check: cases | "
             "check: mean abs. | check: mean signed | gap: mean abs. | gap: mean signed |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {h.group} | {h.fit_cases} | {_pct(h.fit_mae)} | {_pct(h.fit_signed, True)} | "
              f"{h.check_cases} | {_pct(h.check_mae)} | {_pct(h.check_signed, True)} | "
              f"{_pct(h.gap_mae, True, ' pts')} | {_pct(h.gap_signed, True, ' pts')} |"
              for h in halves.itertuples(index=False)]
    return "\n".join(lines)
