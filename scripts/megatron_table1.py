"""Megatron-LM SC21 Table 1: simulated against published TFLOP/s per GPU.

    python scripts/megatron_table1.py            # every row (the largest take minutes)
    python scripts/megatron_table1.py --rows 1.7b 3.6b --csv out.csv

Each row is a scenario in ``scripts/scenarios/megatron/``. The simulated figure
is counted the paper's way: Eq. 3 of Narayanan et al. (SC21),
96 B s l h^2 (1 + s/6h + V/16lh) FLOPs per iteration (full recompute included),
over the simulated iteration time and the GPU count. Published values are
transcribed from the paper's Table 1 (``shared/reference/measurements.csv``).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import pandas as pd

from simulator import run
from simulator.scenario import load
from workloads.kernels import megatron_hardware_flops

HERE = Path(__file__).resolve().parent / "scenarios" / "megatron"
PUBLISHED = {  # Narayanan et al., SC21, Table 1: achieved TFLOP/s per GPU
    "1.7b": 137, "3.6b": 138, "7.5b": 142, "18.4b": 135, "39.1b": 138, "76.1b": 140,
    "145.6b": 148, "310.1b": 155, "529.6b": 163, "1t": 163,
}


def simulate_row(name: str) -> dict[str, object]:
    path = HERE / f"megatron-{name}.yaml"
    scenario = load(path)
    start = time.perf_counter()
    summary = run(path).summary
    t = scenario.training
    flops = megatron_hardware_flops(scenario.model, t.global_batch, t.seq_len)
    simulated = flops / summary["iteration_time_s"] / scenario.gpus / 1e12
    p = scenario.parallel
    return {
        "row": name, "gpus": scenario.gpus, "tp": p.tp, "pp": p.pp, "dp": p.dp,
        "virtual_stages": p.virtual_stages, "measured": PUBLISHED[name],
        "simulated": simulated, "error_pct": 100 * (simulated - PUBLISHED[name]) / PUBLISHED[name],
        "iteration_s": summary["iteration_time_s"], "bubble_s": summary["bubble_s"],
        "exposed_comm_s": summary["exposed_comm_s"], "peak_memory_gib": summary["peak_memory_gib"],
        "wall_s": time.perf_counter() - start,
    }


def markdown(rows: list[dict[str, object]]) -> str:
    lines = ["| model | GPUs | tp | pp | dp | v | published TFLOP/s | simulated | error |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        label = "1008B" if r["row"] == "1t" else str(r["row"]).upper()
        lines.append(f"| GPT {label} | {r['gpus']} | {r['tp']} | {r['pp']} | {r['dp']} | "
                     f"{r['virtual_stages']} | {r['measured']} | {r['simulated']:.1f} | "
                     f"{r['error_pct']:+.1f} % |")
    mean = sum(abs(float(r["error_pct"])) for r in rows) / len(rows)
    lines.append(f"\nMean absolute error {mean:.1f} %, worst "
                 f"{max(abs(float(r['error_pct'])) for r in rows):.1f} %.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", nargs="*", default=list(PUBLISHED), choices=list(PUBLISHED))
    parser.add_argument("--csv", help="also write the table to this CSV file")
    args = parser.parse_args()
    rows = []
    for name in args.rows:
        rows.append(simulate_row(name))
        r = rows[-1]
        print(f"# {name}: {r['simulated']:.1f} vs {r['measured']} TFLOP/s "
              f"({r['error_pct']:+.1f} %), simulated in {r['wall_s']:.1f} s", flush=True)
    print(markdown(rows))
    if args.csv:
        pd.DataFrame(rows).to_csv(args.csv, index=False, float_format="%.6g")


if __name__ == "__main__":
    main()
