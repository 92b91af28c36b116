"""``clustersim export-chakra RUN_OR_SCENARIO --out DIR``: a scenario's program as
Chakra execution traces, one per rank (``base.chakra``), for ASTRA-sim and the
tools around Chakra; ``workload: {chakra: DIR}`` reads them back as a program."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.cli import options
from simulator.config.scenario import ScenarioError, load


def add_parser(sub) -> None:
    export = sub.add_parser(
        "export-chakra", help="write a scenario's program as Chakra execution traces",
        description="Write one Chakra execution trace per rank (trace.RANK.et: compute, "
                    "collective and send/receive nodes with their dependencies, sizes and "
                    "durations) and comm_groups.json into --out, for ASTRA-sim; a scenario's "
                    "workload: {chakra: DIR} reads them back.")
    export.add_argument("source", help="a scenario YAML file, or a run directory (its "
                                       "scenario.yaml)")
    export.add_argument("--out", required=True, help="the folder to write the traces into")
    export.add_argument("--set", action="append", default=[], metavar="KEY.PATH=VALUE",
                        help="override a scenario key (repeatable)")


def run(args: argparse.Namespace) -> int:
    from simulator.base.chakra import write
    from simulator.runner.setup import prepare

    source = Path(args.source)
    path = source / "scenario.yaml" if source.is_dir() else source
    scenario = load(path, args.set)
    if scenario.job_section:
        raise ScenarioError(f"{args.source}: jobs: export-chakra takes one job (a scenario "
                            "with model, training and parallelism sections)")
    out = options.output_dir(args.out, "--out")
    setup = prepare(scenario, batch_compute=True)
    sections = {k: scenario.source[k] for k in ("model", "training", "parallelism")
                if k in scenario.source}
    if scenario.workload is not None:  # re-exporting read traces: their own sections
        sections = scenario.workload.sections()
    files = write(setup.program, setup.durations, out,
                  {"scenario": sections, "name": scenario.name, "notes": _notes(setup.program)})
    print(f"wrote {len(files)} Chakra traces ({sum(f.stat().st_size for f in files) / 2**20:.1f} "
          f"MiB) and comm_groups.json to {out}; simulate them with a scenario's workload: "
          f"{{chakra: {out}}}")
    return 0


def _notes(program) -> dict:
    """The program's notes that are plain values (its summary keys)."""
    out = {}
    for key, value in program.notes.items():
        try:
            json.dumps(value)
        except TypeError:
            continue
        out[key] = value
    return out
