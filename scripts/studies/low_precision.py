"""Study 14: what FP8, MXFP8 and NVFP4 buy, and where the speed-up goes.

Three models trained the Megatron-Core way (distributed optimizer, Transformer
Engine's recipes: FP8 with current scaling, MXFP8 and NVFP4 with parameters
gathered in the format, BF16 gradients): Llama 3 8B on 8 GPUs (data
parallel), Llama 3 70B on 64 (TP 4 x PP 4, interleaved, sequence parallel)
and Qwen3-30B-A3B, a MoE, on 16 (EP 16, balanced routing); sequence 4096. Each
on DGX H100 (BF16, FP8) and on GB200 NVL72 trays (BF16, FP8, MXFP8, NVFP4).
Reported: the iteration time split into GEMMs, attention, casts (the formats'
quantization), other kernels, exposed communication and pipeline bubble on
the rank that finishes last, and the speed-up over BF16.

Then how the speed-up shrinks: Llama 3 8B on GB200 as the sequence grows from
2k to 32k (attention, still BF16, takes over), and on 64 H100 (plain data parallelism
across 8 servers: a BF16 gradient all-reduce after the backward) as the
network slows from 400 to 25 Gb/s per NIC (communication, whose bytes FP8
does not shrink, takes over). Writes low_precision.csv and .png.

    python scripts/studies/low_precision.py [--quick]
"""

from __future__ import annotations

import copy

import pandas as pd
from common import OKABE_ITO, options, run_design, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

NAME = "low_precision"
SYSTEMS = {"H100": ("dgx-h100", 8, ["bf16", "fp8"]),
           "GB200": ("gb200-nvl72", 4, ["bf16", "fp8", "mxfp8", "nvfp4"])}
RECIPE = {"fp8": "tensorwise", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}
PARTS = {"compute_s_by_kind.gemm": "GEMMs", "compute_s_by_kind.attention": "attention",
         "compute_s_by_kind.casts": "casts", "compute_s_by_kind.other": "other kernels",
         "exposed_comm_s": "exposed communication", "bubble_s": "pipeline bubble"}


def models(quick: bool) -> dict[str, tuple[dict, int, int, dict]]:
    """label -> (model, GPUs, global batch, parallelism)."""
    if quick:
        tiny = {"layers": 4, "hidden": 1024, "heads": 16, "kv_heads": 4, "vocab": 8192,
                "ffn_hidden": 4096, "mlp": "swiglu"}
        return {"dense": (tiny, 8, 16, {"zero": 1})}
    return {
        "Llama 3 8B": ({"preset": "llama3-8b"}, 8, 64, {"zero": 1}),
        "Llama 3 70B": ({"preset": "llama3-70b"}, 64, 128,
                        {"tp": 4, "pp": 4, "schedule": "interleaved", "virtual_stages": 5,
                         "sequence_parallel": True, "tp_comm_overlap": True, "zero": 1}),
        "Qwen3-30B-A3B MoE": ({"preset": "qwen3-30b-a3b", "routing": "balanced"}, 16, 128,
                                {"ep": 16, "zero": 1}),
    }


def base(preset: str, per_node: int, model: dict, gpus: int, batch: int, parallel: dict,
         seq: int) -> dict:
    return {"name": NAME, "seed": 0, "cluster": {"preset": preset, "nodes": gpus // per_node},
            "model": copy.deepcopy(model),
            "training": {"seq_len": seq, "global_batch": batch, "micro_batch": 1,
                         "precision": "bf16", "fp8_param_gather": False},
            "parallelism": {**parallel, "grad_reduce_in_fp32": False}}


def precisions(names: list[str], params: bool = True) -> dict:
    """The zipped keys of each precision (its recipe; with ``params``, parameters
    kept and gathered in the format where it has one)."""
    return {"training.precision": names,
            "training.fp8_recipe": [RECIPE.get(p) for p in names],
            "training.fp8_param_gather": [params and p != "bf16" for p in names]}


def breakdown(args) -> pd.DataFrame:
    seq = 1024 if args.quick else 4096
    tables = []
    for label, (model, gpus, batch, parallel) in models(args.quick).items():
        for system, (preset, per_node, names) in SYSTEMS.items():
            scenario = base(preset, per_node, model, gpus, batch, parallel, seq)
            table = run_design(args, f"{NAME}-{system}-{label.split()[-1]}", scenario, {},
                               precisions(names))
            tables.append(table.assign(study="breakdown", model=label, system=system))
    return pd.concat(tables, ignore_index=True)


def shrinking(args) -> pd.DataFrame:
    """The 8B's speed-up against sequence length (GB200) and NIC bandwidth (H100)."""
    small = args.quick
    model = models(small)["dense" if small else "Llama 3 8B"][0]
    seqs = [1024, 4096] if small else [2048, 4096, 8192, 16384, 32768]
    long = base("gb200-nvl72", 4, model, 8, 8 if small else 64, {"zero": 1}, 4096)
    by_seq = run_design(args, f"{NAME}-sequence", long, {"training.seq_len": seqs},
                        precisions(["bf16", "fp8"]))
    slow = base("dgx-h100", 8, model, 16 if small else 64, 16 if small else 128,
                {"zero": 0, "overlap_grad_reduce": False}, 1024 if small else 4096)
    nics = ["400 Gb/s", "25 Gb/s"] if small else ["400 Gb/s", "200 Gb/s", "100 Gb/s",
                                                   "50 Gb/s", "25 Gb/s"]
    by_nic = run_design(args, f"{NAME}-network", slow, {"cluster.nic_bandwidth": nics},
                        precisions(["bf16", "fp8"], params=False))
    return pd.concat([by_seq.assign(study="sequence", model="Llama 3 8B", system="GB200"),
                      by_nic.assign(study="network", model="Llama 3 8B", system="H100")],
                     ignore_index=True)


def with_speedups(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Each row's speed-up over the BF16 row with the same ``keys``."""
    bf16 = table[table["training.precision"] == "bf16"].set_index(keys)["iteration_time_s"]
    index = pd.MultiIndex.from_frame(table[keys])
    return table.assign(speedup=bf16.reindex(index).to_numpy() / table["iteration_time_s"])


def figure(parts: pd.DataFrame, curves: pd.DataFrame):
    fig = Figure(figsize=(14, 8), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(2, 2)
    ax = fig.add_subplot(grid[0, :])
    labels, bottom = [], None
    rows = parts.reset_index(drop=True)
    bf16 = rows[rows["training.precision"] == "bf16"].set_index(["model", "system"])
    norm = bf16["iteration_time_s"].reindex(
        pd.MultiIndex.from_frame(rows[["model", "system"]])).to_numpy()
    for n, (column, name) in enumerate(PARTS.items()):
        values = rows[column].fillna(0.0).to_numpy() / norm
        ax.bar(range(len(rows)), values, bottom=bottom, color=OKABE_ITO[n % len(OKABE_ITO)],
               label=name, width=0.8)
        bottom = values if bottom is None else bottom + values
    for i, row in rows.iterrows():
        short = row["model"].replace("Llama 3 ", "L3 ").replace("Qwen3-30B-A3B MoE", "Q3 30B")
        labels.append(f"{short}\n{row['system']}\n{row['training.precision']}")
        ax.annotate(f"{row['speedup']:.2f}x", (i, bottom[i]), ha="center", va="bottom",
                    fontsize=7, xytext=(0, 2), textcoords="offset points")
    ax.set_xticks(range(len(rows)), labels, fontsize=7)
    ax.set_ylabel("time, in BF16 iterations")
    ax.set_ylim(0, 1.12)
    ax.set_title("Where the time goes (the rank that finishes last); label: speed-up over BF16",
                 fontsize=10)
    ax.legend(frameon=False, fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    for col, (study, xkey, xlabel) in enumerate((
            ("sequence", "training.seq_len", "sequence length (GB200, 8 GPUs)"),
            ("network", "cluster.nic_bandwidth", "NIC bandwidth, Gb/s (64 H100, DP)"))):
        axis = fig.add_subplot(grid[1, col])
        part = curves[(curves["study"] == study) & (curves["training.precision"] == "fp8")]
        x = part[xkey].map(lambda v: float(str(v).split()[0]))
        axis.plot(x, part["speedup"], marker="o", color=OKABE_ITO[0], label="FP8 over BF16")
        share = part["compute_s_by_kind.attention"] / part["iteration_time_s"] if \
            study == "sequence" else part["exposed_comm_s"] / part["iteration_time_s"]
        twin = axis.twinx()
        twin.plot(x, 100 * share, marker="s", ls="--", color=OKABE_ITO[1],
                  label="attention's share of the FP8 iteration" if study == "sequence"
                  else "exposed communication's share of the FP8 iteration")
        twin.set_ylabel("share (%)", color=OKABE_ITO[1])
        twin.set_ylim(0, 100)
        axis.set_xscale("log", base=2)
        axis.set_xticks(sorted(set(x)), [f"{v:g}" for v in sorted(set(x))])
        axis.set_xlabel(xlabel)
        axis.set_ylabel("speed-up over BF16", color=OKABE_ITO[0])
        axis.grid(alpha=0.3)
        axis.legend(frameon=False, fontsize=8, loc="upper left")
        twin.legend(frameon=False, fontsize=8, loc="upper right")
        axis.set_title("FP8's speed-up as " + ("attention" if study == "sequence" else
                                               "communication") + " takes over", fontsize=10)
    fig.suptitle("Low-precision training: FP8, MXFP8 and NVFP4 against BF16", fontsize=11)
    return fig


def main() -> None:
    args = options(__doc__)
    parts = with_speedups(breakdown(args), ["model", "system"])
    curves = shrinking(args)
    curves = pd.concat([with_speedups(curves[curves["study"] == "sequence"],
                                      ["training.seq_len"]),
                        with_speedups(curves[curves["study"] == "network"],
                                      ["cluster.nic_bandwidth"])], ignore_index=True)
    keep = ["study", "model", "system", "training.precision", "training.seq_len",
            "cluster.nic_bandwidth", "iteration_time_s", "speedup", "mfu", "mfu_lowp",
            "lowp_overhead_s", *PARTS, "peak_memory_gib"]
    table = pd.concat([parts, curves], ignore_index=True)
    table = table[[k for k in keep if k in table.columns]]
    write(args, NAME, table, figure(parts, curves))
    print(table.to_string(index=False, float_format=lambda v: f"{v:.4g}"))


if __name__ == "__main__":
    main()
