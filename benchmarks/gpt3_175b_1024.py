"""GPT-3 175B on 1024 A100 GPUs (128 DGX A100): tp=8, pp=8, dp=16, 1F1B,
global batch 1536 (96 micro-batches per pipeline), one iteration, every rank.

Every rank's timeline is computed and every collective and pipeline message
of every group runs on the fabric; by default (``simulation.symmetry: auto``)
the ranks of each pipeline stage share one process in lockstep, split where
the fat tree treats some replicas differently (the run says how), and compute
spans are kept per layer (``simulation.span_detail: layer``). ``--exact``
simulates every rank instead (minutes and several GiB).

Prints wall time, SimPy events, spans and peak resident memory.
Targets: under 30 s and under 4 GiB on one core.
"""

from __future__ import annotations

import argparse
import resource
import time

from simulator import run


def scenario(dp: int, full: bool = False) -> dict:
    return {
        "name": f"gpt3-175b-tp8-pp8-dp{dp}",
        "cluster": {"preset": "dgx-a100", "nodes": 8 * dp},
        "model": {"preset": "gpt3-175b"},
        "training": {"seq_len": 2048, "global_batch": 96 * dp, "micro_batch": 1},
        "parallelism": {"tp": 8, "pp": 8, "dp": dp, "schedule": "1f1b"},
        "simulation": ({"symmetry": "full"} if full else {}) | {"span_detail": "layer"},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dp", type=int, default=16, help="data-parallel degree (16: 1024 GPUs)")
    parser.add_argument("--exact", action="store_true",
                        help="one process per rank: exact, much slower")
    args = parser.parse_args()
    start = time.perf_counter()
    result = run(scenario(args.dp, full=args.exact))
    wall = time.perf_counter() - start
    s = result.summary
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # KiB -> GiB
    print(f"scenario            {result.scenario.name}: {s['gpus']} GPUs, "
          f"{s['micro_batches']} micro-batches per pipeline")
    print(f"simulated iteration {s['iteration_time_s']:.2f} s, MFU {s['mfu']:.1%}, "
          f"bubble {s['bubble_s']:.2f} s, exposed comm {s['exposed_comm_s']:.2f} s")
    print(f"ranks               {s['simulation']}")
    print(f"timeline            {len(result.spans):,} spans, {len(result.comms):,} collective "
          "calls and messages")
    print(f"wall time           {wall:.1f} s (simulation {s['wall_s']:.1f} s)")
    print(f"events              {s['events']:,} SimPy events "
          f"({s['events'] / s['wall_s']:,.0f} per second)")
    print(f"peak RSS            {rss:.2f} GiB")


if __name__ == "__main__":
    main()
