"""Study: what slow GPUs cost at 1,024 GPUs.

128 DGX H100 servers (1,024 GPUs). (a) GPT-3 1.3B, pure data parallelism, and
(b) GPT-3 13B with tensor 8 x pipeline 4 x data 32: the iteration time as 0
to 32 GPUs run 5 % to 50 % slow (``cluster.slow``; the slow GPUs spread evenly
over the cluster, so they fall in different servers and pipeline stages).
(c) Every GPU at a speed of its own, log-normal with spread sigma
(``cluster.gpu_speed_spread``), three seeds each.

The closed form beside each case: data parallelism waits for its slowest
member at every bucket, so its iteration should take T0 + (f_max - 1) x C,
where T0 is the healthy iteration, C the healthy critical rank's compute and
f_max the slowest GPU's factor, whatever the number of slow GPUs. A pipeline
is paced by its slowest stage but fills and drains through every stage, so
slow GPUs in different stages add up there. Writes stragglers.csv and .png.

    python scripts/studies/stragglers.py [--quick]
"""

from __future__ import annotations

import numpy as np
import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "stragglers"
COUNTS = [0, 1, 2, 4, 8, 16, 32]
FACTORS = [1.05, 1.1, 1.2, 1.5]
SPREADS = [0.0, 0.005, 0.01, 0.02, 0.05]
SEEDS = [1, 2, 3]
LAYOUTS = {  # part -> (model, parallelism, global batch)
    "a: data parallel, GPT-3 1.3B": ("gpt3-1.3b", {"dp": 1024}, 1024),
    "b: TP 8 x PP 4 x DP 32, GPT-3 13B": ("gpt3-13b", {"tp": 8, "pp": 4, "dp": 32}, 256),
}


def base(model: str, parallelism: dict, batch: int, gpus: int) -> dict:
    return {"name": NAME, "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": gpus // 8},
            "model": {"preset": model},
            "training": {"seq_len": 2048, "global_batch": batch, "micro_batch": 1},
            "parallelism": parallelism}


def slow(count: int, factor: float, gpus: int) -> dict | None:
    """``count`` GPUs at ``factor``, spread evenly (GPU 5 of every gpus/count)."""
    if count == 0:
        return None
    return {f"gpu {(i * gpus) // count + 5}": factor for i in range(count)}


def counts(args, part: str, gpus: int) -> pd.DataFrame:
    model, parallelism, batch = LAYOUTS[part]
    if args.quick:
        model, parallelism, batch = "gpt3-125m", {"dp": gpus} if "data" in part else {
            "tp": 4, "pp": 2, "dp": 2}, 16
    cases = [(0, 1.0)] + [(c, f) for f in FACTORS for c in COUNTS if c > 0 and c <= gpus // 8]
    zipped = {"cluster.slow": [slow(c, f, gpus) for c, f in cases]}
    table = run_design(args, f"{NAME}-{part[0]}",
                       base(model, parallelism, batch, gpus), {}, zipped)
    return table.assign(part=part, count=_column(table, "straggler_count", 0),
                        factor=_column(table, "slowest_gpu_factor", 1.0))


def _column(table: pd.DataFrame, name: str, healthy: float) -> pd.Series:
    """A summary key that healthy runs do not have, theirs filled in."""
    return table[name].fillna(healthy) if name in table else pd.Series(healthy, table.index)


def spread(args, gpus: int) -> pd.DataFrame:
    model, parallelism, batch = LAYOUTS["a: data parallel, GPT-3 1.3B"]
    if args.quick:
        model, parallelism, batch = "gpt3-125m", {"dp": gpus}, 16
    grid = {"cluster.gpu_speed_spread": SPREADS[:3] if args.quick else SPREADS,
            "seed": SEEDS[:1] if args.quick else SEEDS}
    table = run_design(args, f"{NAME}-c",
                       base(model, parallelism, batch, gpus), grid)
    return table.assign(part="c: every GPU its own speed", count=np.nan,
                        factor=_column(table, "slowest_gpu_factor", 1.0))


def closed_form(table: pd.DataFrame) -> pd.DataFrame:
    """T0 + (f_max - 1) x C per case, from its part's healthy run (data parallelism)."""
    out = []
    for part, rows in table.groupby("part", sort=False):
        if part.startswith("b"):  # a pipeline has no such closed form
            out.append(rows)
            continue
        healthy = rows[rows["factor"].fillna(1.0) <= 1.0].iloc[0]
        predicted = healthy["iteration_time_s"] + (rows["factor"] - 1.0) * healthy["compute_s"]
        out.append(rows.assign(closed_form_s=predicted,
                               error=rows["iteration_time_s"] / predicted - 1.0))
    return pd.concat(out, ignore_index=True)


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(12, 3.6), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for ax, (part, rows) in zip(axes[:2], table[table["count"].notna()].groupby(
            "part", sort=False), strict=True):
        healthy = rows[rows["count"] == 0]["iteration_time_s"].iloc[0]
        for n, factor in enumerate(FACTORS):
            line = rows[rows["factor"] == factor].sort_values("count")
            if line.empty:
                continue
            ax.plot(line["count"], line["iteration_time_s"] / healthy, marker="o",
                    color=OKABE_ITO[n], label=f"x{factor:g} slow")
        ax.set_xscale("symlog", linthresh=1)
        ticks = sorted(rows["count"][rows["count"] > 0].unique())
        ax.set_xticks(ticks, [str(int(t)) for t in ticks])
        ax.set_xlabel("slow GPUs (of 1,024)")
        ax.set_ylabel("iteration time / healthy")
        ax.set_title(part, fontsize=9)
        ax.grid(alpha=0.3)
    axes[0].legend(frameon=False, fontsize=8)
    rows = table[table["count"].isna()]
    if not rows.empty:
        ax = axes[2]
        healthy = rows[rows["cluster.gpu_speed_spread"] == 0]["iteration_time_s"].mean()
        mean = rows.groupby("cluster.gpu_speed_spread")[["iteration_time_s",
                                                         "closed_form_s"]].mean()
        ax.plot(mean.index, mean["iteration_time_s"] / healthy, marker="o",
                color=OKABE_ITO[0], label="simulated (mean of seeds)")
        ax.plot(mean.index, mean["closed_form_s"] / healthy, linestyle="--",
                color=OKABE_ITO[1], label="T0 + (f_max - 1) C")
        ax.set_xlabel("GPU speed spread (sigma of log-normal)")
        ax.set_ylabel("iteration time / healthy")
        ax.set_title("c: every GPU its own speed (data parallel)", fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(frameon=False, fontsize=8)
    fig.suptitle("Stragglers on 1,024 H100 GPUs: the slowest member sets the pace")
    return fig


def main() -> None:
    args = options(__doc__)
    gpus = 16 if args.quick else 1024
    table = pd.concat([*(counts(args, part, gpus) for part in LAYOUTS), spread(args, gpus)],
                      ignore_index=True)
    table = closed_form(table)
    columns = ["part", "count", "factor", "cluster.gpu_speed_spread", "seed",
               "slowest_gpu_factor", "iteration_time_s", "closed_form_s", "error",
               "compute_s", "exposed_comm_s", "comm_wait_s", "bubble_s", "simulated_ranks",
               "events", "wall_s"]
    table = table[[c for c in columns if c in table]]
    write(args, NAME, table, figure(table))
    print(table.round(4).to_string(index=False))


if __name__ == "__main__":
    main()
