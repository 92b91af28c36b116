"""A DeepSeek-V3-like model on 2,048 H100 (256 DGX H100), EP 64, PP 16, default
options (issue 17's target: at most 30 s on a 2-core machine).

The layout: 61 layers (the first 3 dense) over 16 stages of 3, 14 x 4 and 2
layers; tp 1, dp 128 (an expert-parallel group of 64 ranks, 2 replicas of each
expert), ZeRO-1, sequence 4096, global batch 15,360 (DeepSeek-V3's), uniform
routing. Prints the whole command's wall time, the simulation's events, what
was simulated, the iteration and what routing came to.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

SCENARIO = {
    "name": "deepseek-v3-like-2048", "seed": 0,
    "cluster": {"preset": "dgx-h100", "nodes": 256},
    "model": {"preset": "deepseek-v3-like"},
    "training": {"seq_len": 4096, "global_batch": 15360, "micro_batch": 1,
                 "precision": "bf16", "recompute": "full"},
    "parallelism": {"tp": 1, "pp": 16, "ep": 64, "zero": 1,
                    "stage_layers": [3] + [4] * 14 + [2]},
}


def run(scenario: dict, layout: str) -> dict:
    """Run ``scenario`` as the whole ``clustersim run`` command in a fresh process;
    print its figures (``layout`` describes it) and return its summary."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "scenario.yaml"
        path.write_text(yaml.safe_dump(scenario))
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "simulator", "run", str(path), "--out",
                               str(Path(folder) / "out")], capture_output=True, text=True)
        wall = time.perf_counter() - start
        peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20  # KiB -> GiB
        if done.returncode:
            sys.exit(f"run failed ({done.returncode}): {done.stderr[-2000:]}")
        s = json.loads((Path(folder) / "out" / "summary.json").read_text())
    print(f"scenario            {scenario['name']}: {s['gpus']:,} GPUs, {layout}, "
          f"{s['micro_batches']} micro-batches per pipeline")
    print(f"simulated iteration {s['iteration_time_s']:.2f} s, MFU {s['mfu']:.1%}, "
          f"exposed comm {s['exposed_comm_s']:.2f} s, bubble {s['bubble_s']:.2f} s")
    print(f"routing             {s['moe_routing']}: busiest EP rank x"
          f"{s['moe_rank_imbalance']:.3f} the mean")
    if "nvlink_domains" in s:
        print(f"nvlink              {s['nvlink_domains']}")
    print(f"ranks               {s['simulation']}")
    print(f"events              {s['events']:,} (simulation {s['wall_s']:.1f} s)")
    print(f"wall time           {wall:.1f} s, the whole command (target 30 s); peak RSS "
          f"{peak:.2f} GiB")
    return s


def main() -> None:
    run(SCENARIO, "EP 64, PP 16")


if __name__ == "__main__":
    main()
