"""GPT-3 1.3B with pure data parallelism on 512 GPUs (64 DGX A100 nodes).

Prints simulated iteration time, wall time, events and events per second.
Every rank is simulated (no folding of identical ranks).
"""

from __future__ import annotations

import argparse
import time

from simulator import run


def scenario(nodes: int) -> dict:
    gpus = 8 * nodes
    return {
        "name": f"gpt3-1.3b-dp{gpus}",
        "seed": 0,
        "cluster": {"preset": "dgx-a100", "nodes": nodes},
        "model": {"preset": "gpt3-1.3b"},
        "training": {"seq_len": 2048, "global_batch": gpus, "micro_batch": 1},
        "parallelism": {"dp": gpus, "bucket_size": "25 MB"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=64)
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(scenario(args.nodes))
    wall = time.perf_counter() - start
    s = result.summary
    print(f"scenario            {result.scenario.name} ({s['gpus']} GPUs, "
          f"{s['buckets']} buckets, {len(result.spans):,} spans)")
    print(f"simulated iteration {s['iteration_time_s'] * 1e3:.2f} ms, MFU {s['mfu']:.1%}, "
          f"exposed comm {s['exposed_comm_s'] * 1e3:.2f} ms")
    print(f"wall time           {wall:.2f} s (engine and summary {s['wall_s']:.2f} s)")
    print(f"events              {s['events']:,} SimPy events, "
          f"{s['network_recomputes']:,} bandwidth-sharing recomputes")
    print(f"events per second   {s['events'] / s['wall_s']:,.0f}")


if __name__ == "__main__":
    main()
