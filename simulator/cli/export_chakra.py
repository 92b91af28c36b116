"""``clustersim export-chakra RUN_OR_SCENARIO --out DIR``: a scenario's program as
Chakra execution traces, one per rank (``base.chakra``), for ASTRA-sim and the
tools around Chakra (several jobs: each training job's into ``DIR/NAME``);
``workload: {chakra: DIR}`` reads them back as a program."""

from __future__ import annotations

import argparse
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
    files = write(setup.program, setup.durations, out,
                  _facts(scenario.source, scenario.workload, scenario.name))
    _say(files, out, f"a scenario's workload: {{chakra: {out}}}")
    return 0


def _facts(source: dict, workload, name: str) -> dict:
    """The traces' facts: the model, training and parallelism sections they came
    from, their name; re-exporting read traces, their own sections and, for
    another tool's, that those are a placeholder and the kernels unknown."""
    if workload is not None:
        lacking = {} if workload.trace.kernels else {"foreign": True}
        return {"scenario": workload.sections(), "name": name, **lacking}
    from simulator.config.workload import SECTIONS

    return {"scenario": {k: source[k] for k in SECTIONS if k in source}, "name": name}


def _jobs(scenario, out: Path) -> int:
    """Each training job's program into ``out``/NAME (background traffic has no
    Chakra form: it stays in the scenario)."""
    from simulator.base.chakra import write
    from simulator.compute.host_costs import HostPlan
    from simulator.compute.model import ComputeModel
    from simulator.runner.setup import durations_of
    from workloads.program import build_program

    for job in scenario.job_section:  # (every folder checked before any is written)
        if job.background is None:
            options.inside(out, job.name, "--out", make=False)
    for job in scenario.job_section:
        if job.background is not None:
            print(f"{job.name}: background traffic, not a program: left in the scenario")
            continue
        program = job.workload.trace.program if job.workload is not None else build_program(
            job.model, job.training, job.parallel, scenario.seed)
        model = ComputeModel.for_training(scenario.gpu, job.training,
                                          job.parallel.framework.value,
                                          scenario.machine.cluster.host_rates())
        recorded = job.workload is not None and job.workload.recorded
        timed = job.workload.trace.durations.__getitem__ if recorded else durations_of(
            program, model, HostPlan.of(job.training, job.parallel.framework.value,
                                        scenario.machine.cluster.host_dispatch))
        folder = options.inside(out, job.name, "--out")
        files = write(program, timed, folder,
                      _facts(scenario.source["jobs"][job.name], job.workload, job.name))
        _say(files, folder, f"the job's workload: {{chakra: {folder}}}")
    return 0


def _say(files: list[Path], out: Path, how: str) -> None:
    size = sum(f.stat().st_size for f in files) / 2**20
    print(f"wrote {len(files)} Chakra traces ({size:.1f} MiB) and comm_groups.json to {out}; "
          f"simulate them with {how}")
