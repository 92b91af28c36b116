"""Compute jitter, simulated exactly (every rank) and approximately (one rank per
class, ``simulation.jitter: approximate``), on cases small enough to run both.

Prints, per case and jitter: the iteration time without jitter, with exact
jitter and with the approximation, the approximation's error against the exact
run, the share of jitter's cost it reproduces, and both wall times. The README's
jitter table comes from a real run of this script.
"""

from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

from simulator import run
from simulator.config.scenario import read_raw

ROOT = Path(__file__).resolve().parents[1]
SCENARIOS = ROOT / "scripts" / "scenarios"

CASES = {  # name -> (shipped scenario, changes)
    "6.7B TP2 PP4 DP4 (32 A100)": ("gpt3-6.7b-3d.yaml", {}),
    "2.7B DP64 (64 H100)": ("dgx-h100-gpt3-2.7b-dp64.yaml", {}),
    "350M DP32 (32 Polaris A100)": ("polaris-gpt3-350m-dp32.yaml", {}),
    "1.3B DP128, rail fabric (128 A100)": ("dgx-a100-rail-dp128.yaml", {}),
    "6.7B TP8 PP2 DP4 (64 A100)": ("gpt3-6.7b-3d.yaml", {
        "cluster.nodes": 8, "parallelism.tp": 8, "parallelism.pp": 2, "parallelism.dp": 4,
        "training.global_batch": 32}),
    "6.7B TP8 PP4 DP8 (256 A100)": ("gpt3-6.7b-3d.yaml", {
        "cluster.nodes": 32, "parallelism.tp": 8, "parallelism.pp": 4, "parallelism.dp": 8,
        "training.global_batch": 128}),
}


def scenario(file: str, changes: dict, jitter: float, mode: str) -> dict:
    raw = copy.deepcopy(read_raw(SCENARIOS / file))
    for dotted, value in changes.items():
        *path, key = dotted.split(".")
        node = raw
        for part in path:
            node = node.setdefault(part, {})
        node[key] = value
    raw.setdefault("cluster", {})["compute_jitter"] = jitter
    raw["simulation"] = {**raw.get("simulation", {}), "jitter": mode}
    return raw


def timed(raw: dict):
    start = time.perf_counter()
    result = run(raw)
    return result, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jitter", type=float, nargs="+", default=[0.05, 0.2])
    parser.add_argument("--cases", nargs="*", help="substrings of case names to run")
    args = parser.parse_args()
    print("| case | jitter | no jitter | exact | approximate | error | jitter cost "
          "reproduced | wall exact | wall approximate | ranks simulated |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, (file, changes) in CASES.items():
        if args.cases and not any(c in name for c in args.cases):
            continue
        calm = run(scenario(file, changes, 0.0, "exact")).summary["iteration_time_s"]
        for sigma in args.jitter:
            exact, wall_exact = timed(scenario(file, changes, sigma, "exact"))
            approx, wall_approx = timed(scenario(file, changes, sigma, "approximate"))
            e = exact.summary["iteration_time_s"]
            a = approx.summary["iteration_time_s"]
            share = (a - calm) / (e - calm) if e > calm else float("nan")
            print(f"| {name} | {sigma:g} | {calm * 1e3:.2f} ms | {e * 1e3:.2f} ms | "
                  f"{a * 1e3:.2f} ms | {(a - e) / e:+.2%} | {share:.0%} | "
                  f"{wall_exact:.1f} s | {wall_approx:.1f} s | "
                  f"{approx.summary['simulated_ranks']} of {approx.summary['gpus']} |",
                  flush=True)


if __name__ == "__main__":
    main()
