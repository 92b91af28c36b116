"""Study 4: FSDP thresholds, interconnect bandwidth x GPU memory x model size.

PyTorch FSDP (full_shard, prefetch) on two DGX A100 servers (16 GPUs),
sequence 2048, global batch 64 in micro-batches of 2: for each GPU
memory (A100 40 GB and 80 GB), model size (1.3B to 39B) and NIC
bandwidth (12.5 to 400 Gb/s per port), the MFU. A cell is marked where the
model does not fit (peak memory over the GPU's, "OOM") and where bandwidth
is the bottleneck (exposed communication over a quarter of the iteration,
"BW"). Writes fsdp_thresholds.csv and .png.

    python scripts/studies/fsdp_thresholds.py [--quick]
"""

from __future__ import annotations

import numpy as np
from common import options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator.outputs.sweep_plot import magnitude

NAME = "fsdp_thresholds"
BANDWIDTH_BOUND = 0.25  # exposed communication share of the iteration


def design(quick: bool) -> tuple[dict, dict]:
    base = {
        "name": NAME, "seed": 0,
        "cluster": {"preset": "dgx-a100", "nodes": 2},
        "model": {"preset": "gpt3-1.3b"},
        "training": {"seq_len": 2048, "global_batch": 64, "micro_batch": 2},
        "parallelism": {"dp": 16, "fsdp": {"sharding": "full_shard", "prefetch": True}},
        "simulation": {"span_detail": "layer"},
    }
    if quick:
        return base, {"cluster.gpu": ["a100-sxm-40gb"], "model.preset": ["gpt3-350m"],
                      "cluster.nic_bandwidth": ["200 Gb/s", "12.5 Gb/s"]}
    return base, {
        "cluster.gpu": ["a100-sxm-40gb", "a100-sxm-80gb"],
        "model.preset": ["gpt3-1.3b", "gpt3-6.7b", "gpt3-13b", "gpt-neox-20b",
                         "megatron-39.1b"],
        "cluster.nic_bandwidth": ["12.5 Gb/s", "25 Gb/s", "50 Gb/s", "100 Gb/s", "200 Gb/s",
                                  "400 Gb/s"],
    }


def classify(row) -> str:
    if row["oom"]:
        return "OOM"
    return "BW" if row["exposed_comm_s"] > BANDWIDTH_BOUND * row["iteration_time_s"] else ""


def figure(table):
    gpus = list(dict.fromkeys(table["cluster.gpu"]))
    models = sorted(set(table["model.preset"]), key=lambda m: float(m.split("-")[-1][:-1]))
    bandwidths = sorted(set(table["cluster.nic_bandwidth"]), key=magnitude)
    fig = Figure(figsize=(5.2 * len(gpus) + 0.8, 0.7 * len(models) + 2.2), layout="constrained")
    FigureCanvasAgg(fig)
    axes = np.atleast_1d(fig.subplots(1, len(gpus), sharey=True))
    for ax, gpu in zip(axes, gpus, strict=True):
        part = table[table["cluster.gpu"] == gpu]
        grid = np.full((len(models), len(bandwidths)), np.nan)
        marks = {}
        for row in part.to_dict("records"):
            i, j = models.index(row["model.preset"]), bandwidths.index(
                row["cluster.nic_bandwidth"])
            grid[i, j] = row["mfu"] * 100
            marks[(i, j)] = classify(row)
        image = ax.imshow(grid, cmap="viridis", vmin=0, vmax=np.nanmax(table["mfu"]) * 100,
                          aspect="auto", origin="lower")
        for (i, j), value in np.ndenumerate(grid):
            mark = marks.get((i, j), "")
            ax.text(j, i, f"{value:.0f}%" + (f"\n{mark}" if mark else ""), ha="center",
                    va="center", fontsize=7, color="white" if value < 30 else "black")
        ax.set_xticks(range(len(bandwidths)), [b.replace(" ", "\n") for b in bandwidths],
                      fontsize=7)
        ax.set_yticks(range(len(models)), models)
        ax.set_xlabel("NIC bandwidth per port")
        ax.set_title(f"{gpu} ({part['gpu_memory_gib'].iloc[0]:.0f} GiB)")
    fig.colorbar(image, ax=list(axes), label="MFU (%)")
    fig.suptitle("FSDP full_shard on 16 A100: MFU; OOM = does not fit, "
                 f"BW = exposed communication > {BANDWIDTH_BOUND:.0%} of the iteration")
    return fig


def main() -> None:
    args = options(__doc__)
    base, grid = design(args.quick)
    table = run_design(args, NAME, base, grid)
    table = table.assign(bottleneck=[classify(r) for r in table.to_dict("records")])
    columns = ["cluster.gpu", "model.preset", "cluster.nic_bandwidth", "mfu",
               "model_tflops_per_gpu", "iteration_time_s", "exposed_comm_s", "peak_memory_gib",
               "gpu_memory_gib", "oom", "bottleneck"]
    write(args, NAME, table[columns], figure(table))
    print(table[columns].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
