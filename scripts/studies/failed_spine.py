"""Study: what one failed spine link costs on a fat tree and on a
rail-optimized fabric.

32 DGX H100 servers (256 GPUs), 16 leaves and 16 spines either way, every
leaf wired once to every spine: on the fat tree a leaf holds two servers'
eight NICs each; on the rail-optimized fabric a leaf holds NIC k of sixteen
servers (rail k), and NCCL's PXN keeps traffic on its rail. Four states of
the fabric: healthy, one leaf-to-spine link down (the first leaf's link to
spine 0), that link at 25 % of its bandwidth (a flapping port that trained
down), and spine 0 down. Two jobs: GPT-3 1.3B data parallel over all 256 GPUs
(the gradient all-reduce crosses the spines), and GPT-3 13B with tensor 8 x
pipeline 4 x data 8 (only the data-parallel and pipeline traffic leaves the
servers). Routing spreads flows over the equal-cost paths that survive; a
degraded link stays in use at its lower rate. Writes failed_spine.csv and .png.

    python scripts/studies/failed_spine.py [--quick]
"""

from __future__ import annotations

import json

import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "failed_spine"
FABRICS = {"fat_tree": "leaf0", "rail_optimized": "rail0.leaf0"}  # kind -> its first leaf
STATES = ["healthy", "link down", "link at 25%", "spine down"]
JOBS = {  # label -> (model, parallelism, global batch)
    "GPT-3 1.3B, DP 256": ("gpt3-1.3b", {"dp": 256}, 256),
    "GPT-3 13B, TP 8 x PP 4 x DP 8": ("gpt3-13b", {"tp": 8, "pp": 4, "dp": 8}, 64),
}


def faults(state: str, leaf: str) -> list:
    link = [leaf, "spine0"]
    return {"healthy": [], "link down": [{"link": link, "down": True}],
            "link at 25%": [{"link": link, "bandwidth": 0.25}],
            "spine down": [{"switch": "spine0", "down": True}]}[state]


def state_of(written) -> str:
    """A case's state from its faults (as the sweep's table holds them: JSON)."""
    given = json.loads(written) if isinstance(written, str) else written
    if not given:
        return "healthy"
    fault = given[0]
    return ("spine down" if "switch" in fault else "link down" if fault.get("down")
            else "link at 25%")


def job(args, label: str) -> pd.DataFrame:
    model, parallelism, batch = JOBS[label]
    nodes = 4 if args.quick else 32
    if args.quick:
        model, parallelism, batch = "gpt3-125m", {"dp": 32} if "DP 256" in label else {
            "tp": 4, "pp": 2, "dp": 4}, 32
    base = {"name": NAME, "seed": 0, "cluster": {"preset": "dgx-h100", "nodes": nodes},
            "model": {"preset": model},
            "training": {"seq_len": 2048, "global_batch": batch, "micro_batch": 1},
            "parallelism": parallelism}
    cases = [(kind, state) for kind in FABRICS for state in STATES]
    # a fat-tree leaf's ports are NIC ports, a rail leaf's are servers: 16 leaves of
    # 16 ports each way (quick: four servers, one per fat-tree leaf, two per rail leaf)
    ports = {"fat_tree": 8 if args.quick else 16, "rail_optimized": 2 if args.quick else 16}
    zipped = {"cluster.fabric.type": [k for k, _ in cases],
              "cluster.leaf_ports": [ports[k] for k, _ in cases],
              "cluster.fabric.faults": [faults(s, FABRICS[k]) for k, s in cases]}
    slug = "dp" if "DP 256" in label else "3d"
    table = run_design(args, f"{NAME}-{slug}", base, {}, zipped)
    table = table.assign(job=label, fabric=table["cluster.fabric.type"],
                         state=table["cluster.fabric.faults"].map(state_of))
    healthy = table[table["state"] == "healthy"].set_index("fabric")["iteration_time_s"]
    return table.assign(slowdown=table["iteration_time_s"] / table["fabric"].map(healthy))


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(11, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, len(JOBS), sharey=True)
    width = 0.38
    for ax, (label, rows) in zip(axes, table.groupby("job", sort=False), strict=True):
        for n, fabric in enumerate(FABRICS):
            part = rows[rows["fabric"] == fabric].set_index("state").reindex(STATES)
            xs = [i + (n - 0.5) * width for i in range(len(STATES))]
            bars = ax.bar(xs, part["slowdown"], width, color=OKABE_ITO[n],
                          label=fabric.replace("_", " "))
            ax.bar_label(bars, [f"x{v:.2f}" for v in part["slowdown"]], fontsize=7)
        ax.set_xticks(range(len(STATES)), STATES)
        ax.set_title(label, fontsize=9)
        ax.axhline(1.0, color="grey", linewidth=0.8)
        ax.grid(axis="y", alpha=0.3)
    axes[0].set_ylabel("iteration time / healthy")
    axes[0].legend(frameon=False, fontsize=8)
    fig.suptitle("One failed spine link on 256 H100 GPUs: fat tree against rail-optimized")
    return fig


def main() -> None:
    args = options(__doc__)
    table = pd.concat([job(args, label) for label in JOBS], ignore_index=True)
    columns = ["job", "fabric", "state", "iteration_time_s", "slowdown", "exposed_comm_s",
               "comm_wait_s", "bubble_s", "simulated_ranks", "events", "wall_s"]
    table = table[columns]
    write(args, NAME, table, figure(table))
    print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
