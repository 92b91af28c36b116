"""Ring all-reduce of 1 GiB on 8, 64, 512 and 4096 GPUs (DGX A100 servers).

Prints, per size: simulated time, bus bandwidth, wall time (building the fabric,
choosing and lowering the collective, simulating it) and SimPy events.
Target: 4096 GPUs in under 10 s of wall time.
"""

from __future__ import annotations

import argparse
import time

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.collectives.nccl_tests import bus_factor, time_alone
from simulator.collectives.states import FabricStates
from topologies import CLUSTERS, build_cluster


def one(gpus: int, size: int) -> None:
    start = time.perf_counter()
    fabrics = FabricStates.build(build_cluster(CLUSTERS["dgx-a100"], max(1, gpus // 8)),
                                 algorithm=Algorithm.RING)
    fabric, tuner, members = fabrics.fabric, fabrics.lowering, fabrics.gpus[:gpus]
    seconds, events, _, protocol = time_alone(fabric, tuner, Collective.ALL_REDUCE, members,
                                              size)
    wall = time.perf_counter() - start
    busbw = size / seconds * bus_factor(Collective.ALL_REDUCE, gpus) / 1e9
    print(f"{gpus:>6} GPUs  simulated {seconds * 1e3:9.3f} ms  busbw {busbw:7.1f} GB/s  "
          f"({protocol})  wall {wall:6.2f} s  events {events}  "
          f"flows {len(tuner(Collective.ALL_REDUCE, members, size).routes):,}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, nargs="*", default=[8, 64, 512, 4096])
    args = parser.parse_args()
    for gpus in args.gpus:
        one(gpus, 2**30)


if __name__ == "__main__":
    main()
