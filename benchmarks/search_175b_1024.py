"""Layout search for GPT-3 175B on 1024 A100 (128 DGX A100, global batch 1536),
the whole default space, as the ``clustersim search`` command runs it.

Prints wall time (whole command, first pass, simulations), the layouts
(valid, fitting, simulated), the simulations' events, the estimate's error
and the chosen layout. Target (issue 16): under 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import yaml

SCENARIO = {"name": "gpt3-175b-1024", "seed": 0,
            "cluster": {"preset": "dgx-a100", "nodes": 128},
            "model": {"preset": "gpt3-175b"},
            "training": {"seq_len": 2048, "global_batch": 1536}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--top", type=int, default=8)
    parser.add_argument("--nodes", type=int, default=128)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        base = Path(folder) / "gpt3.yaml"
        scenario = {**SCENARIO, "cluster": {**SCENARIO["cluster"], "nodes": args.nodes}}
        base.write_text(yaml.safe_dump(scenario))
        out = Path(folder) / "out"
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "simulator", "search", str(base),
                               "--out", str(out), "--workers", str(args.workers),
                               "--top", str(args.top)], capture_output=True, text=True)
        wall = time.perf_counter() - start
        if done.returncode:
            sys.exit(f"search failed ({done.returncode}): {done.stderr[-2000:]}")
        table = pd.read_csv(out / "search.csv")
        runs = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
        sim = table[table["status"] == "simulated"]
        best = sim.iloc[0]
        print(f"scenario            {scenario['name']}: {8 * args.nodes} GPUs, default space")
        fit = int((table["status"] != "does not fit").sum())
        print(f"layouts             {len(table)} valid, {fit} fit, {len(sim)} simulated")
        print(f"best                {best['layout']}: {best['iteration_time_s']:.2f} s, "
              f"MFU {best['mfu']:.1%}, {best['peak_memory_gib']:.1f} GiB")
        errors = sim["estimate_error_pct"].abs()
        print(f"estimate error      mean {errors.mean():.1f} %, worst {errors.max():.1f} %")
        walls = ", ".join(f"{r.get('wall_s', 0):.0f}" for r in runs)
        print(f"events              {sum(r.get('events', 0) for r in runs):,} over the "
              f"{len(runs)} simulations (each run's wall: {walls} s)")
        print(f"wall time           {wall:.0f} s, {args.workers} workers (target 300 s)")


if __name__ == "__main__":
    main()
