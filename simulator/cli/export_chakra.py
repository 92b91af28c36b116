"""``clustersim export-chakra RUN_OR_SCENARIO --out DIR``: a scenario's program as
Chakra execution traces, one per rank (``base.chakra``), for ASTRA-sim and the
tools around Chakra (several jobs: each training job's into ``DIR/NAME``);
``workload: {chakra: DIR}`` reads them back as a program."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.cli import options
from simulator.config.scenario import load


def add_parser(sub) -> None:
    export = sub.add_parser(
        "export-chakra", help="write a scenario's program as Chakra execution traces",
        description="Write one Chakra execution trace per rank (trace.RANK.et: compute, "
                    "collective and send/receive nodes with their dependencies, sizes and "
                    "durations) and comm_groups.json into --out, for ASTRA-sim (several jobs: "
                    "each training job's into --out/NAME); a scenario's workload: "
                    "{chakra: DIR} reads them back.")
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
    out = options.output_dir(args.out, "--out")
    if scenario.job_section:  # each training job into a folder of its own
        return _jobs(scenario, out)
    setup = prepare(scenario, batch_compute=True)
    sections = _sections(scenario.source, scenario.workload)
    files = write(setup.program, setup.durations, out,
                  {"scenario": sections, "name": scenario.name, "notes": _notes(setup.program)})
    _say(files, out, f"a scenario's workload: {{chakra: {out}}}")
    return 0


def _sections(source: dict, workload) -> dict:
    """The model, training and parallelism sections the traces came from."""
    if workload is not None:  # re-exporting read traces: their own sections
        return workload.sections()
    from simulator.config.workload import SECTIONS

    return {k: source[k] for k in SECTIONS if k in source}


def _jobs(scenario, out: Path) -> int:
    """Each training job's program into ``out``/NAME (background traffic has no
    Chakra form: it stays in the scenario)."""
    from simulator.base.chakra import write
    from simulator.compute.model import ComputeModel
    from simulator.runner.setup import durations_of
    from workloads.program import build_program

    for job in scenario.job_section:
        if job.background is not None:
            print(f"{job.name}: background traffic, not a program: left in the scenario")
            continue
        program = job.workload.trace.program if job.workload is not None else build_program(
            job.model, job.training, job.parallel, scenario.seed)
        model = ComputeModel.for_training(scenario.gpu, job.training,
                                          job.parallel.framework.value,
                                          scenario.machine.cluster.host_rates())
        folder = options.output_dir(out / job.name, "--out")
        files = write(program, durations_of(program, model, job.training.host_launch), folder,
                      {"scenario": _sections(scenario.source["jobs"][job.name], job.workload),
                       "name": job.name, "notes": _notes(program)})
        _say(files, folder, f"the job's workload: {{chakra: {folder}}}")
    return 0


def _say(files: list[Path], out: Path, how: str) -> None:
    size = sum(f.stat().st_size for f in files) / 2**20
    print(f"wrote {len(files)} Chakra traces ({size:.1f} MiB) and comm_groups.json to {out}; "
          f"simulate them with {how}")


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
