"""A DeepSeek-V3-like MoE on 56 GB200 NVL72 racks (4,032 GPUs, 1,008 trays), EP 64,
default options (issue 38's target: the whole command within 30 s and 2 GiB on
a 2-core machine, exact by symmetry).

EP 64 as NVIDIA's GB200 recipe for DeepSeek-V3 runs it (Megatron-Bridge,
tp 1, ep 64, bf16, sequence 4096, micro-batch 1). Groups of 64 cannot tile a
72-GPU rack, so the job takes 16 of each rack's 18 trays (3,584 GPUs; the
scheduler keeps the other two, as a rack-aware placement would) and every
expert-parallel group stays inside one NVLink domain; pp 7 (61 layers as
9 x 5 and 8 x 2: 512 ranks a stage, 8 EP groups), ZeRO-1, full recompute,
global batch 16,384, uniform routing. ``--all-gpus`` runs the recipe on all
4,032 GPUs instead, where 49 of 63 EP groups straddle two racks (their
all-to-alls cross the scale-out network, and far fewer ranks share a
timeline: minutes, not seconds).
"""

from __future__ import annotations

import argparse

from moe_deepseek_2048 import run

RACKS, TRAYS, USED = 56, 18, 16
TRAINING = {"seq_len": 4096, "global_batch": 16384, "micro_batch": 1, "precision": "bf16",
            "recompute": "full"}
PARALLELISM = {"tp": 1, "pp": 7, "ep": 64, "zero": 1, "stage_layers": [9] * 5 + [8] * 2}


def scenario(all_gpus: bool) -> dict:
    """The benchmark's scenario: a job on 16 trays of each rack, or on every GPU."""
    job = {"model": {"preset": "deepseek-v3-like"}, "training": dict(TRAINING),
           "parallelism": dict(PARALLELISM)}
    base = {"name": "deepseek-v3-like-gb200-56-racks", "seed": 0,
            "cluster": {"preset": "gb200-nvl72", "nodes": RACKS * TRAYS}}
    if all_gpus:
        job["training"]["global_batch"] = 18432  # 576 replicas a stage, 32 micro-batches
        return {**base, **job}
    nodes = [rack * TRAYS + tray for rack in range(RACKS) for tray in range(USED)]
    return {**base, "jobs": {"deepseek": {"nodes": nodes, **job}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--all-gpus", action="store_true",
                        help="every GPU of the 56 racks (EP groups straddle racks)")
    args = parser.parse_args()
    run(scenario(args.all_gpus), "EP 64, PP 7, " + (
        "all 4,032 GPUs" if args.all_gpus else "16 trays a rack"))


if __name__ == "__main__":
    main()
