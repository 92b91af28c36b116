"""``clustersim validate``: the validation set against published measurements."""

from __future__ import annotations

import argparse
import sys

from simulator.cli import options
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
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


def run(args: argparse.Namespace) -> int:
    from simulator.experiments import validate

    csv = options.output_file(args.csv, "--csv") if args.csv else None

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
            digits = 3 if r.unit == "x" else 1  # a speed-up's, a throughput's
            print(f"{r.case:30} {r.measured:>9g} {r.unit:<4} {r.simulated:>9.{digits}f} "
                  f"{r.unit:<4} "
                  f"{r.error_pct:>+8.1f}%  {r.basis}")
        print()
        for g in groups.itertuples(index=False):
            print(f"{g.group:14} {g.cases:3} cases  mean |error| {g.mean_abs_error_pct:5.1f} %  "
                  f"worst {g.worst_abs_error_pct:5.1f} % ({g.worst_case})")
    if csv:
        guarded(csv, lambda: table.to_csv(csv, index=False, float_format="%.6g"))
    return 0
