"""Study 6: the communication of GPT models under DP, TP, PP and ZeRO-3.

On two DGX A100 servers (16 GPUs), GPT-3 1.3B with data parallelism (dp=16),
tensor parallelism (tp=8 with sequence parallelism, dp=2), a 1F1B pipeline
(pp=4, dp=4) and ZeRO-3 (dp=16); each also with the sequence doubled (4096)
and with a model five times larger (GPT-3 6.7B). From each run's
communication log: message-size histograms (powers of two), calls and
volume per iteration. Writes comm_characteristics.csv (one row per strategy,
variant and size bin) and .png.

    python scripts/studies/comm_characteristics.py [--quick]
"""

from __future__ import annotations

import copy

import numpy as np
import pandas as pd
from common import OKABE_ITO, options, write
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from simulator import run
from simulator.analysis import comms
from simulator.base.units import format_bytes

NAME = "comm_characteristics"
STRATEGIES = {
    "DP": {"dp": 16},
    "TP": {"tp": 8, "dp": 2, "sequence_parallel": True},
    "PP": {"pp": 4, "dp": 4, "schedule": "1f1b"},
    "ZeRO-3": {"dp": 16, "zero": 3},
}


def scenario(strategy: str, model: str, seq: int) -> dict:
    return {
        "name": f"{NAME}-{strategy}", "seed": 0,
        "cluster": {"preset": "dgx-a100", "nodes": 2},
        "model": {"preset": model},
        "training": {"seq_len": seq, "global_batch": 32, "micro_batch": 1},
        "parallelism": copy.deepcopy(STRATEGIES[strategy]),
        "simulation": {"span_detail": "layer"},
    }


def variants(quick: bool) -> dict[str, tuple[str, int]]:
    if quick:
        return {"GPT-3 350M, seq 2048": ("gpt3-350m", 2048)}
    return {"GPT-3 1.3B, seq 2048": ("gpt3-1.3b", 2048),
            "GPT-3 1.3B, seq 4096": ("gpt3-1.3b", 4096),
            "GPT-3 6.7B, seq 2048": ("gpt3-6.7b", 2048)}


def histograms(quick: bool) -> pd.DataFrame:
    """Calls and volume per (strategy, variant, dimension, size bin)."""
    parts = []
    for strategy in STRATEGIES:
        for label, (model, seq) in variants(quick).items():
            log = run(scenario(strategy, model, seq)).comms
            parts.append(comms.histogram(log).assign(strategy=strategy, variant=label))
    table = pd.concat(parts, ignore_index=True)
    return table[["strategy", "variant", "dimension", "from_bytes", "calls", "bytes_total"]]


def figure(table: pd.DataFrame):
    fig = Figure(figsize=(14, 6.5), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(2, len(STRATEGIES))
    labels = list(dict.fromkeys(table["variant"]))
    bins = np.sort(table["from_bytes"].unique())
    for col, strategy in enumerate(STRATEGIES):
        part = table[table["strategy"] == strategy]
        for n, label in enumerate(labels):
            mine = part[part["variant"] == label].groupby("from_bytes")[["calls",
                                                                         "bytes_total"]].sum()
            mine = mine.reindex(bins, fill_value=0)
            x = np.arange(len(bins)) + (n - (len(labels) - 1) / 2) * 0.8 / len(labels)
            axes[0, col].bar(x, mine["calls"], width=0.8 / len(labels), color=OKABE_ITO[n],
                             label=label)
            axes[1, col].bar(x, mine["bytes_total"] / 2**30, width=0.8 / len(labels),
                             color=OKABE_ITO[n])
        dims = ", ".join(sorted(part["dimension"].unique()))
        axes[0, col].set_title(f"{strategy} ({dims})")
        for row in (0, 1):
            axes[row, col].set_xticks(range(len(bins)), [format_bytes(b).replace(".00", "")
                                                         for b in bins],
                                      rotation=60, ha="right", fontsize=6)
            axes[row, col].set_yscale("log")
            axes[row, col].grid(axis="y", alpha=0.3)
        axes[0, col].set_ylim(0.5, part.groupby(["variant", "from_bytes"])["calls"].sum().max() * 3)
        volume = part.groupby(["variant", "from_bytes"])["bytes_total"].sum() / 2**30
        axes[1, col].set_ylim(volume[volume > 0].min() / 3, volume.max() * 3)
        axes[1, col].set_xlabel("message size (bin from)")
    axes[0, 0].set_ylabel("calls per iteration")
    axes[1, 0].set_ylabel("volume per iteration (GiB)")
    axes[0, 0].legend(frameon=False, fontsize=7)
    fig.suptitle("Communication of GPT training on 16 A100: message sizes, counts and volumes")
    return fig


def main() -> None:
    args = options(__doc__)
    table = histograms(args.quick)
    write(args, NAME, table, figure(table))
    summary = table.groupby(["strategy", "variant"]).agg(calls=("calls", "sum"),
                                                         volume=("bytes_total", "sum"))
    summary["volume"] = summary["volume"].map(format_bytes)
    print(summary.to_string())


if __name__ == "__main__":
    main()
