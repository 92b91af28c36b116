"""Three tenants on 1,024 GPUs (128 DGX H100, two per leaf, leaf uplinks 2:1):
two 3D GPT-3 13B jobs (TP 8 x PP 4 x DP 16, 512 GPUs each) that the scheduler
scattered over the leaves, beside a storage stream (checkpoint writes at
5 GB/s per client GPU). Every training job also runs alone for its slow-down.

Prints each job's iteration time and slow-down, wall time, events and what was
simulated. Target: under 20 s on a 2-core machine, with default options.
"""

from __future__ import annotations

import argparse
import time

from simulator import run

TARGET_S = 20.0


def job(nodes: int) -> dict:
    return {"nodes": nodes, "placement": "scattered", "model": {"preset": "gpt3-13b"},
            "training": {"seq_len": 2048, "global_batch": 128, "micro_batch": 1},
            "parallelism": {"tp": 8, "pp": 4, "dp": nodes * 8 // 32}}


def scenario(nodes: int) -> dict:
    per_job = (nodes - 8) // 2
    return {"name": f"shared-{nodes * 8}", "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": nodes, "leaf_ports": 16,
                        "oversubscription": 2},
            "jobs": {"a": job(per_job), "b": job(per_job),
                     "checkpoints": {"kind": "background", "traffic": "storage",
                                     "rate": "5 GB/s", "message": "64 MiB", "servers": 2,
                                     "nodes": list(range(nodes - 8, nodes))}}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=136, help="servers (8 for storage)")
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(scenario(args.nodes))
    wall = time.perf_counter() - start
    s = result.summary
    for j in s["jobs"]:
        if j["kind"] == "training":
            print(f"job {j['name']:<15} {j['gpus']:,} GPUs: {j['iteration_time_s'] * 1e3:.2f} ms, "
                  f"x{j['slowdown']:.3f} its {j['alone_s'] * 1e3:.2f} ms alone")
        else:
            print(f"job {j['name']:<15} background {j['traffic']}: {j['delivered_gb_s']:.2f} of "
                  f"{j['offered_gb_s']:.2f} GB/s per stream, {j['messages']:,} messages")
    print(f"ranks               {s['simulation']}")
    print(f"events              {s['events']:,} over {s['job_runs']} runs "
          f"(simulation {s['wall_s']:.1f} s)")
    print(f"wall time           {wall:.1f} s, the whole command (target {TARGET_S:.0f} s)")


if __name__ == "__main__":
    main()
