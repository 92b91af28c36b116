"""Study 1: pipeline versus data parallelism as the inter-node bandwidth falls.

GPT-3 2.7B on four DGX A100 servers (32 GPUs), global batch 128: pure data
parallelism (dp=32, gradient all-reduce across servers) against a 4-stage 1F1B
pipeline with data parallelism inside each server (pp=4, dp=8, so only
activations cross servers), for NIC bandwidths from 400 Gb/s down to 3.125
Gb/s. Writes pp_vs_dp_bandwidth.csv and .png.

    python scripts/studies/pp_vs_dp_bandwidth.py [--quick]
"""

from __future__ import annotations

from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.sweep_plot import magnitude

NAME = "pp_vs_dp_bandwidth"


def design(quick: bool) -> tuple[dict, dict, dict]:
    base = {
        "name": NAME, "seed": 0,
        "cluster": {"preset": "dgx-a100", "nodes": 2 if quick else 4},
        "model": {"preset": "gpt3-350m" if quick else "gpt3-2.7b"},
        "training": {"seq_len": 2048, "global_batch": 32 if quick else 128, "micro_batch": 1},
        "parallelism": {"bucket_size": "25 MB"},
        "simulation": {"span_detail": "layer"},
    }
    bandwidths = (["200 Gb/s", "12.5 Gb/s"] if quick else
                  ["400 Gb/s", "200 Gb/s", "100 Gb/s", "50 Gb/s", "25 Gb/s", "12.5 Gb/s",
                   "6.25 Gb/s", "3.125 Gb/s"])
    gpus = 16 if quick else 32
    strategies = {"parallelism.pp": [1, 4], "parallelism.dp": [gpus, gpus // 4]}
    return base, {"cluster.nic_bandwidth": bandwidths}, strategies


def figure(table):
    fig = Figure(figsize=(6.5, 4), layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for n, (pp, part) in enumerate(table.groupby("parallelism.pp")):
        part = part.assign(bw=part["cluster.nic_bandwidth"].map(magnitude) * 8 / 1e9)
        part = part.sort_values("bw")
        dp = part["parallelism.dp"].iloc[0]
        label = f"data parallel (dp={dp})" if pp == 1 else f"1F1B pipeline (pp={pp}, dp={dp})"
        ax.plot(part["bw"], part["model_tflops_per_gpu"], marker="o", label=label,
                color=OKABE_ITO[n])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("NIC bandwidth per port (Gb/s), 8 ports per server")
    ax.set_ylabel("model TFLOP/s per GPU")
    ax.set_title("GPT-3: pipeline vs data parallelism as bandwidth falls")
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return fig


def main() -> None:
    args = options(__doc__)
    base, grid, zipped = design(args.quick)
    table = run_design(args, NAME, base, grid, zipped)
    columns = ["cluster.nic_bandwidth", "parallelism.pp", "parallelism.dp", "iteration_time_s",
               "model_tflops_per_gpu", "mfu", "exposed_comm_s", "bubble_s", "peak_memory_gib"]
    write(args, NAME, table[columns], figure(table))
    pivot = table.pivot_table(index="cluster.nic_bandwidth", columns="parallelism.pp",
                              values="model_tflops_per_gpu")
    print(pivot.loc[sorted(pivot.index, key=magnitude, reverse=True)].round(1).to_string())


if __name__ == "__main__":
    main()
