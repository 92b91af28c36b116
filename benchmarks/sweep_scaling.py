"""A sweep of 64 small cases with 1 worker and with 2 worker processes.

The cases: GPT-3 350M and 760M, data parallel on one or two DGX A100 servers,
over four NIC bandwidths, two sequence lengths and two bucket sizes (the
kind of grid users sweep). Prints each wall time, the cases per second and the
speed-up (target: at least 1.8x with 2 workers on a 2-core machine). Each
setting runs ``--repeat`` times from nothing (a fresh temporary directory) and
the best time counts, as timing benchmarks do to shed a busy machine's noise.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import yaml

import simulator.runner.simulate  # noqa: F401 - imported before timing, as the workers have it
from simulator.experiments.sweep import sweep

BASE = {
    "name": "sweep-benchmark",
    "seed": 0,
    "cluster": {"preset": "dgx-a100", "nodes": 1},
    "model": {"preset": "gpt3-125m"},
    "training": {"seq_len": 1024, "global_batch": 64, "micro_batch": 1},
    "parallelism": {"dp": 8},
}
GRID = {
    "model.preset": ["gpt3-350m", "gpt3-760m"],
    "cluster.nic_bandwidth": ["25 Gb/s", "50 Gb/s", "100 Gb/s", "200 Gb/s"],
    "training.seq_len": [1024, 2048],
    "parallelism.bucket_size": ["10 MB", "40 MB"],
}
ZIP = {"cluster.nodes": [1, 2], "parallelism.dp": [8, 16]}


def timed(base: Path, workers: int, repeat: int) -> tuple[float, int]:
    """Best wall time of ``repeat`` sweeps from nothing, and the cases run."""
    best, cases = float("inf"), 0
    for _ in range(repeat):
        with tempfile.TemporaryDirectory() as out:
            start = time.perf_counter()
            results, invalid = sweep(base, GRID, ZIP, out, workers=workers)
            best = min(best, time.perf_counter() - start)
            table = results.table()
            assert not invalid and (table["status"] == "ok").all(), "every case must run"
            cases = len(table)
    return best, cases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workers", type=int, default=2, help="the parallel run's workers")
    parser.add_argument("--repeat", type=int, default=3, help="runs per setting (best counts)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base.yaml"
        base.write_text(yaml.safe_dump(BASE))
        serial, cases = timed(base, 1, args.repeat)
        parallel, _ = timed(base, args.workers, args.repeat)
    print(f"cases               {cases}")
    print(f"1 worker            {serial:.1f} s wall ({cases / serial:.1f} cases/s)")
    label = f"{args.workers} workers"
    print(f"{label:<20}{parallel:.1f} s wall ({cases / parallel:.1f} cases/s)")
    print(f"speed-up            {serial / parallel:.2f}x (target >= 1.8x with 2 workers)")


if __name__ == "__main__":
    main()
