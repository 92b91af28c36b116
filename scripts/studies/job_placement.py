"""Study: two jobs on one fabric, placed contiguously or interleaved.

16 DGX H100 servers, two per leaf switch (8 leaves), leaf uplinks 1:1, 2:1
or 4:1 oversubscribed. Two equal jobs, GPT-3 2.7B data parallel over 8
servers (64 GPUs) each, placed by the scheduler's policy:

- contiguous: job A on servers 0-7, job B on 8-15, so each leaf serves one job;
- scattered (interleaved): A on the even servers, B on the odd ones, so every
  leaf's uplinks carry both jobs' all-reduces;
- random: servers drawn with the seed (three seeds), as a busy scheduler
  hands them out.

Each job's time together, its time alone on the same servers, and their
ratio (the slow-down that sharing the fabric costs it). Writes
job_placement.csv and .png.

    python scripts/studies/job_placement.py [--quick]
"""

from __future__ import annotations

import json

import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "job_placement"
POLICIES = ["contiguous", "scattered", "random"]
SEEDS = [1, 2, 3]
OVERSUBSCRIPTION = [1, 2, 4]


def design(quick: bool) -> tuple[dict, dict]:
    nodes, model = (4, "gpt3-125m") if quick else (16, "gpt3-2.7b")
    per_job = nodes // 2
    job = {"nodes": per_job, "model": {"preset": model},
           "training": {"seq_len": 2048, "global_batch": 8 * per_job, "micro_batch": 1},
           "parallelism": {"dp": 8 * per_job}}
    base = {"name": NAME, "seed": 1,
            "cluster": {"preset": "dgx-h100", "nodes": nodes, "leaf_ports": 16},
            "jobs": {"A": dict(job), "B": dict(job)}}
    grid = {"cluster.oversubscription": OVERSUBSCRIPTION[::2] if quick else OVERSUBSCRIPTION,
            "placement": POLICIES, "seed": SEEDS[:1] if quick else SEEDS}
    return base, grid


def cases(base: dict, grid: dict) -> dict:
    """The grid as zipped lists: both jobs take the same policy; the seed matters
    to random placement only (one seed for the others)."""
    rows = [(o, p, s) for o in grid["cluster.oversubscription"] for p in grid["placement"]
            for s in (grid["seed"] if p == "random" else grid["seed"][:1])]
    return {"cluster.oversubscription": [o for o, _, _ in rows],
            "jobs.A.placement": [p for _, p, _ in rows],
            "jobs.B.placement": [p for _, p, _ in rows], "seed": [s for _, _, s in rows]}


def per_job(table: pd.DataFrame) -> pd.DataFrame:
    """One row per job of each case, from the summary's jobs."""
    rows = []
    for case in table.to_dict("records"):
        jobs = case["jobs"]
        for job in json.loads(jobs) if isinstance(jobs, str) else jobs:
            rows.append({"oversubscription": case["cluster.oversubscription"],
                         "placement": case["jobs.A.placement"], "seed": case["seed"],
                         "job": job["name"], "nodes": " ".join(map(str, job["nodes"])),
                         "iteration_time_s": job["iteration_time_s"],
                         "alone_s": job["alone_s"], "slowdown": job["slowdown"]})
    return pd.DataFrame(rows)


def figure(jobs: pd.DataFrame):
    fig = Figure(figsize=(10, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    ax_time, ax_slow = fig.subplots(1, 2)
    for n, policy in enumerate(POLICIES):
        rows = jobs[jobs["placement"] == policy].groupby("oversubscription")
        mean = rows[["iteration_time_s", "alone_s", "slowdown"]].mean()
        ax_time.plot(mean.index, mean["iteration_time_s"] * 1e3, marker="o",
                     color=OKABE_ITO[n], label=f"{policy}, together")
        ax_time.plot(mean.index, mean["alone_s"] * 1e3, marker="s", linestyle="--",
                     color=OKABE_ITO[n], label=f"{policy}, alone")
        ax_slow.plot(mean.index, mean["slowdown"], marker="o", color=OKABE_ITO[n],
                     label=policy + (" (mean of jobs and seeds)" if policy == "random" else ""))
        if policy == "random":
            ax_slow.fill_between(mean.index, rows["slowdown"].min(), rows["slowdown"].max(),
                                 color=OKABE_ITO[n], alpha=0.2)
    for ax in (ax_time, ax_slow):
        ax.set_xscale("log", base=2)
        ax.set_xticks(OVERSUBSCRIPTION, [f"{o}:1" for o in OVERSUBSCRIPTION])
        ax.minorticks_off()
        ax.set_xlabel("leaf uplink oversubscription")
        ax.grid(alpha=0.3)
    ax_time.set_ylabel("iteration time (ms)")
    ax_time.set_title("each job's iteration (mean of both)", fontsize=9)
    ax_slow.set_ylabel("together / alone")
    ax_slow.set_title("slow-down from sharing the fabric", fontsize=9)
    ax_time.legend(frameon=False, fontsize=7)
    ax_slow.legend(frameon=False, fontsize=7)
    fig.suptitle("Two GPT-3 2.7B jobs on 16 DGX H100: contiguous against interleaved")
    return fig


def main() -> None:
    args = options(__doc__)
    base, grid = design(args.quick)
    table = run_design(args, NAME, base, {}, cases(base, grid))
    jobs = per_job(table)
    write(args, NAME, jobs, figure(jobs))
    print(jobs.round(5).to_string(index=False))


if __name__ == "__main__":
    main()
