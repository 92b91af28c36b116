"""``clustersim search``: the fastest parallel layout that fits, found with the
simulator, and why it wins."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from simulator.base.user_files import file_name, read_yaml
from simulator.cli import options
from simulator.config.scenario import ScenarioError
from simulator.outputs import out_dirs
from simulator.outputs.out_dirs import guarded


def add_parser(sub) -> None:
    search = sub.add_parser(
        "search", help="find the fastest parallel layout that fits",
        description="Enumerate the layouts of a search space, drop those that do not fit "
                    "in GPU memory, estimate the rest without simulating, simulate the "
                    "--top ones and rank them; writes search.parquet, search.png, "
                    "best.yaml and the best layout's run directory. Re-run to resume.")
    search.add_argument("scenario", help="base scenario YAML (its model, cluster, training)")
    search.add_argument("--out", help="output directory (default: runs/<name>-search)")
    search.add_argument("--space", help="'default' (every valid layout) or a YAML file "
                                        "mapping dimensions to lists of values")
    from simulator.experiments.layouts import flags

    for dim, (flag, _, text) in flags().items():
        search.add_argument(flag, dest=dim, help=text)
    search.add_argument("--top", type=int, default=8,
                        help="layouts to simulate, best estimates first (default 8)")
    search.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                        help="local worker processes (default: the number of cores)")
    search.add_argument("--dask", metavar="ADDRESS",
                        help="simulate on an existing Dask scheduler, e.g. tcp://host:8786")
    search.add_argument("--compare", action="store_true",
                        help="also simulate the runner-up and explain the difference")
    search.add_argument("--show", type=int, default=15, help="table rows to print")


def space_from(args: argparse.Namespace, world: int, layers: int, heads: int,
               domain: int, batch: int, experts: int = 0) -> dict[str, list]:
    """The search space: ``--space default`` (or nothing given) is every valid
    layout, a file gives dimensions, and flags replace a dimension's values."""
    from simulator.experiments import layouts as L

    declared = L.flags()
    given = {dim: getattr(args, dim, None) for dim in declared}
    if args.space in (None, "default"):
        space = L.default_space(world, layers, heads, domain, batch, experts)
    else:
        raw = read_yaml(args.space, "search space file")
        if not isinstance(raw, dict):
            raise ScenarioError(f"--space: {args.space} must map dimensions to value lists")
        space = {k: (v if isinstance(v, list) else [v]) for k, v in raw.items()}
    most = {d.name: world for d in L.sizes()} | {"mbs": batch, "virtual_stages": layers}
    for dim, text in given.items():
        if text is not None:
            flag, kind, _ = declared[dim]
            space[dim] = L.parse_values(text, flag, kind, most.get(dim))
    return space


class _Bar:
    """tqdm bars: the first pass's layouts, then the simulations."""

    def __init__(self, what: str, total: int, done: int) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, initial=done, desc=what, unit="layout",
                        dynamic_ncols=True, file=sys.stderr)

    def update(self, row) -> None:
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def run(args: argparse.Namespace) -> int:
    from simulator.config.scenario import machine_from, model_from, read_raw, training_from
    from simulator.experiments import layouts as L

    if args.top < 1 or args.workers < 1:
        raise ScenarioError(f"--top {args.top} and --workers {args.workers} must be at least 1")
    base = read_raw(args.scenario)
    if base.get("jobs") is not None:
        raise ScenarioError(f"{args.scenario}: jobs: the layout search takes one job (a "
                            "scenario with model, training and parallelism); search each job's "
                            "layout on its own scenario")
    base_dir = Path(args.scenario).parent
    machine = machine_from(base.get("cluster"), base_dir)
    model = model_from(base.get("model"), base_dir)
    training = training_from(base.get("training"), machine.gpu)
    space = space_from(args, machine.gpus, model.layers, model.heads,
                       L.domain_of(machine), training.global_batch, model.experts)
    name = str(base.get("name") or Path(args.scenario).stem)
    out = options.output_dir(args.out or Path("runs") / f"{file_name(name)}-search", "--out")
    with out_dirs.exclusive(out, "--out"):  # a second search into out is refused
        return _search(args, base, base_dir, machine, space, name, out)


def _search(args, base: dict, base_dir: Path, machine, space: dict, name: str,
            out: Path) -> int:
    """The search into ``out`` (held by this command), its table, figure, best
    layout's scenario and run, and the comparison with the runner-up."""
    from simulator.config.scenario import from_dict, resolved
    from simulator.experiments import search, search_best
    from simulator.experiments.estimate import unmodelled
    from simulator.outputs import run_dir, search_plot

    table, refused = search.run_search(args.scenario, space, out, args.top, args.workers,
                                       args.dask, _Bar)
    left_out = unmodelled(from_dict(search.layout_of(table.iloc[0]).scenario(
        search._searchable(base)), base_dir=base_dir))
    if left_out:
        print(f"note: the first pass's estimates leave out {' and '.join(left_out)}; the "
              "simulated layouts include them", file=sys.stderr)
    capacity = machine.gpu.memory_bytes / 2**30
    _print_table(table, refused, args.show)
    sim = table[table["status"] == "simulated"]
    if sim.empty:
        print("no layout could be simulated; see search.csv", file=sys.stderr)
        return 1
    guarded(out / "search.png", lambda: search_plot.plot(table, capacity, out / "search.png",
                                                         f"{name}: {machine.gpus} GPUs"))
    best = search.layout_of(sim.iloc[0])
    scenario = search_best.scenario_of(resolved(search._searchable(base), base_dir), best,
                                       f"{name}-best")  # (its files' paths made absolute)
    scenario_path = out / "best.yaml"
    guarded(scenario_path, lambda: search_best.write_scenario(scenario, scenario_path))
    result = search_best.run_layout(search._searchable(base), best, base_dir, f"{name}-best")
    run_dir.write(result, out / "best")
    print(f"best layout      {best.label}: {result.summary['iteration_time_s']:.4g} s, "
          f"MFU {result.summary['mfu']:.1%}")
    _print_error(sim)
    if args.compare and len(sim) > 1:
        second = search.layout_of(sim.iloc[1])
        other = search_best.run_layout(search._searchable(base), second, base_dir,
                                       f"{name}-runner-up")
        explained = search_best.explain(result, other, (best.label, second.label))
        print(f"\nwinner against runner-up ({second.label}), seconds on the critical rank:")
        print(explained.to_string(index=False, float_format=lambda v: f"{v:.4f}"))
        print(search_best.summary_line(explained))
        guarded(out / "compare.csv", lambda: explained.to_csv(out / "compare.csv", index=False))
    print(f"outputs          {out}/ (search.parquet, search.csv, search.png, best.yaml, "
          f"best/)\nrun it           clustersim run {scenario_path}")
    return 0


def _print_table(table, refused: dict, show: int) -> None:
    counts = table["status"].value_counts().to_dict()
    print(f"layouts          {len(table)} valid ({', '.join(f'{n} {k}' for k, n in counts.items())}"
          f"), {len(refused)} left out (refused by the scenario checks, or the same run as "
          "another: search.csv has only the valid ones)")
    columns = ["rank", "layout", "status", "iteration_time_s", "tokens_per_s", "mfu",
               "peak_memory_gib", "exposed_comm_s", "bubble_s", "estimate_s"]
    print(table[columns].head(show).to_string(index=False, float_format=lambda v: f"{v:.4g}"))


def _print_error(sim) -> None:
    errors = sim["estimate_error_pct"].abs()
    print(f"estimate error   mean {errors.mean():.1f} %, worst {errors.max():.1f} % over "
          f"{len(sim)} simulated layouts (the first pass ranks, the simulation decides)")
