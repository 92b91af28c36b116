"""Study: where run-to-run variability on a shared Polaris-like system comes from.

Cheng et al. report run-to-run variability of training on Polaris. The
project's reference set holds none of their figures, so this study cannot
compare numbers with theirs; it measures what a simulator can attribute such
variability to: how much each source spreads one job's iteration time, seed by
seed, and whether it shows in communication or in compute.

128 Polaris nodes (4 A100-40GB, 2 Slingshot NICs each; dragonfly groups of 64
nodes). GPT-3 1.3B, data parallel over 16 nodes (64 GPUs). Eight seeds per
source of variability:

- placement: the scheduler draws the job's 16 nodes at random (the seed), alone
  on the system: how many dragonfly groups, routers and global links its ring
  crosses;
- placement and neighbours: the same, beside another tenant's all-to-all on 8
  other random nodes at 2 GB/s per GPU (open-loop, 32 MiB messages);
- compute jitter: contiguous nodes, every kernel 2 % slower or faster at random;
- GPU speed spread: contiguous nodes, every GPU at its own log-normal speed
  (sigma 0.02).

Reports each source's mean, coefficient of variation and range of the iteration
time, and of its exposed communication and compute. Writes
polaris_variability.csv and .png.

    python scripts/studies/polaris_variability.py [--quick]
"""

from __future__ import annotations

import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "polaris_variability"
SEEDS = list(range(1, 9))
SHORT = {"placement and neighbours": "placement\n+ neighbours",
         "compute jitter 2 %": "compute\njitter 2 %",
         "GPU speed spread 0.02": "GPU speed\nspread 0.02"}
NEIGHBOURS = {"kind": "background", "traffic": "all_to_all", "rate": "2 GB/s",
              "message": "32 MiB", "nodes": 8, "placement": "random"}


def sources(quick: bool) -> dict[str, dict]:
    """Each source of variability as the scenario it changes."""
    nodes, job_nodes, model = (16, 4, "gpt3-125m") if quick else (128, 16, "gpt3-1.3b")
    job = {"nodes": job_nodes, "placement": "random", "model": {"preset": model},
           "training": {"seq_len": 2048, "global_batch": 4 * job_nodes, "micro_batch": 1},
           "parallelism": {"dp": 4 * job_nodes}}
    neighbours = {**NEIGHBOURS, "nodes": 2 if quick else 8}

    def scenario(placement: str, cluster: dict | None = None, others: bool = False) -> dict:
        jobs = {"train": {**job, "placement": placement}}
        if others:
            jobs["neighbours"] = neighbours
        return {"name": NAME, "seed": 1,
                "cluster": {"preset": "polaris", "nodes": nodes, **(cluster or {})},
                "jobs": jobs}
    return {"placement": scenario("random"),
            "placement and neighbours": scenario("random", others=True),
            "compute jitter 2 %": scenario("contiguous", {"compute_jitter": 0.02}),
            "GPU speed spread 0.02": scenario("contiguous", {"gpu_speed_spread": 0.02})}


def variability(table: pd.DataFrame) -> pd.DataFrame:
    """Per source: mean, coefficient of variation and range (max / min) of each figure."""
    rows = []
    for source, part in table.groupby("source", sort=False):
        row = {"source": source}
        for figure in ("iteration_time_s", "exposed_comm_s", "compute_s"):
            values = part[figure]
            row[f"{figure}_mean"] = values.mean()
            row[f"{figure}_cv"] = values.std(ddof=0) / values.mean() if values.mean() else 0.0
            row[f"{figure}_range"] = values.max() / values.min() if values.min() else 1.0
        rows.append(row)
    return pd.DataFrame(rows)


def figure(table: pd.DataFrame, summary: pd.DataFrame):
    fig = Figure(figsize=(11, 3.8), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3, sharey=False)
    labels = list(summary["source"])
    for ax, (column, title) in zip(axes, [("iteration_time_s", "iteration time"),
                                          ("exposed_comm_s", "exposed communication"),
                                          ("compute_s", "compute (last rank)")], strict=True):
        data = [table[table["source"] == s][column].to_numpy() * 1e3 for s in labels]
        box = ax.boxplot(data, patch_artist=True, widths=0.6)
        for n, patch in enumerate(box["boxes"]):
            patch.set_facecolor(OKABE_ITO[n % len(OKABE_ITO)])
            patch.set_alpha(0.6)
        ax.set_xticks(range(1, len(labels) + 1), [SHORT.get(s, s) for s in labels], fontsize=7)
        cvs = summary[f"{column}_cv"].to_numpy()
        for n, cv in enumerate(cvs, start=1):
            ax.annotate(f"CV {cv:.1%}", (n, 0), xycoords=("data", "axes fraction"),
                        xytext=(0, 3), textcoords="offset points", ha="center", fontsize=7)
        ax.set_ylabel("ms")
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", alpha=0.3)
    fig.suptitle("GPT-3 1.3B on 64 Polaris GPUs: what each source of variability spreads "
                 "(8 seeds each)")
    return fig


def main() -> None:
    args = options(__doc__)
    seeds = SEEDS[:3] if args.quick else SEEDS
    parts = []
    for n, (source, scenario) in enumerate(sources(args.quick).items()):
        table = run_design(args, f"{NAME}-{n}", scenario, {"seed": seeds})
        parts.append(table.assign(source=source))
    table = pd.concat(parts, ignore_index=True)
    columns = ["source", "seed", "iteration_time_s", "exposed_comm_s", "compute_s",
               "comm_wait_s", "simulated_ranks", "events", "wall_s"]
    table = table[columns]
    summary = variability(table)
    write(args, NAME, table, figure(table, summary))
    print(summary.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
