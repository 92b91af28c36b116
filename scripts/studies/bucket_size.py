"""Study 2: gradient bucket (communication block) size.

GPT-3 1.3B, pure data parallelism on four DGX A100 servers (32 GPUs), kernels
slowed by a seeded 5 % random jitter so ranks reach each all-reduce at
different times. The bucket grows from 1 MB to 1 GB, at the servers' full
200 Gb/s per NIC and at 25 Gb/s: iteration time, exposed communication and
the time ranks wait for each other. Writes bucket_size.csv and .png.

    python scripts/studies/bucket_size.py [--quick]
"""

from __future__ import annotations

from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.sweep_plot import magnitude

NAME = "bucket_size"
METRICS = {"iteration_time_s": "iteration time", "exposed_comm_s": "exposed communication",
           "comm_wait_total_s": "waiting for peers"}


def design(quick: bool) -> tuple[dict, dict]:
    base = {
        "name": NAME, "seed": 7,
        "cluster": {"preset": "dgx-a100", "nodes": 2 if quick else 4, "compute_jitter": 0.05},
        "model": {"preset": "gpt3-350m" if quick else "gpt3-1.3b"},
        "training": {"seq_len": 2048, "global_batch": 32 if quick else 64, "micro_batch": 1},
        "parallelism": {"dp": 16 if quick else 32},
    }
    sizes = (["1 MB", "64 MB"] if quick else
             ["1 MB", "4 MB", "16 MB", "64 MB", "256 MB", "1 GB"])
    return base, {"cluster.nic_bandwidth": ["200 Gb/s", "25 Gb/s"],
                  "parallelism.bucket_size": sizes}


def figure(table):
    fig = Figure(figsize=(10, 3.4), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    for ax, (metric, label) in zip(axes, METRICS.items(), strict=True):
        for n, (bw, part) in enumerate(sorted(table.groupby("cluster.nic_bandwidth"),
                                              key=lambda g: -magnitude(g[0]))):
            part = part.assign(mb=part["parallelism.bucket_size"].map(magnitude) / 1e6)
            part = part.sort_values("mb")
            ax.plot(part["mb"], part[metric] * 1e3, marker="o", color=OKABE_ITO[n],
                    label=f"NIC {bw}")
        ax.set_xscale("log")
        ax.set_xlabel("bucket size (MB)")
        ax.set_ylabel(f"{label} (ms)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend(frameon=False)
    fig.suptitle("GPT-3 data parallelism: gradient bucket size")
    return fig


def main() -> None:
    args = options(__doc__)
    base, grid = design(args.quick)
    table = run_design(args, NAME, base, grid)
    columns = ["cluster.nic_bandwidth", "parallelism.bucket_size", "buckets", *METRICS,
               "overlapped_comm_s", "comm_wait_s", "model_tflops_per_gpu"]
    write(args, NAME, table[columns], figure(table))
    print(table[columns].round(4).to_string(index=False))


if __name__ == "__main__":
    main()
