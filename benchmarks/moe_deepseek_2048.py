"""A DeepSeek-V3-like model on 2,048 H100 (256 DGX H100), EP 64, PP 16, default
options (issue 17's target: at most 30 s on a 2-core machine).

The layout: 61 layers (the first 3 dense) over 16 stages of 3, 14 x 4 and 2
layers; tp 1, dp 128 (an expert-parallel group of 64 ranks, 2 replicas of each
expert), ZeRO-1, sequence 4096, global batch 15,360 (DeepSeek-V3's), uniform
routing. Prints the whole command's wall time, the simulation's events, what
was simulated, the iteration and what routing came to.

``--recipe`` runs DeepSeek-V3 as its report trains it instead (issue 41, item
7; target 30 s: median 20.7 s over seven runs on a 2-core machine, 30.4 s on a slower,
noisier one; see benchmarks/README.md):
multi-head latent attention, one MTP depth, the RMSNorms and MLA
up-projections recomputed, DeepEP (EP 64 over 8 servers: two hops), and
DualPipe over the 16 stages (each rank holds the stages r and 15 - r, the
shallowest and deepest layers together), batch 15,360 (120 micro-batches), in
BF16 on H100 (the report's FP8 on H800 is a validation case).
"""

from __future__ import annotations

import argparse
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


RECIPE = {
    "name": "deepseek-v3-2048", "seed": 0,
    "cluster": {"preset": "dgx-h100", "nodes": 256},
    "model": {"preset": "deepseek-v3", "mtp_layers": 1},
    "training": {"seq_len": 4096, "global_batch": 15360, "micro_batch": 1,
                 "precision": "bf16", "recompute_modules": ["layernorm", "mla_up_proj"]},
    "parallelism": {"tp": 1, "pp": 16, "ep": 64, "zero": 1, "moe_token_dispatcher_type": "flex",
                    "moe_overlap": "dualpipe", "stage_layers": [3] + [4] * 14 + [2]},
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", action="store_true",
                        help="DeepSeek-V3's recipe (MLA, MTP, DeepEP, all-to-all overlap)")
    if parser.parse_args().recipe:
        s = run(RECIPE, "EP 64 (DeepEP), PP 16, DualPipe")
        print(f"all-to-all          {s['moe_a2a_s']:.2f} s, {s['moe_a2a_hidden_s']:.2f} s of "
              f"it under compute; peak memory {s['peak_memory_gib']:.1f} GiB"
              + (" (over the GPU's)" if s["oom"] else ""))
        return
    run(SCENARIO, "EP 64, PP 16")


if __name__ == "__main__":
    main()
