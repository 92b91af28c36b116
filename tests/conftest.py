"""Shared fixtures: small scenarios that simulate in well under a second."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
QUICKSTART = ROOT / "scripts" / "scenarios" / "quickstart.yaml"

SMALL = {
    "name": "small",
    "seed": 3,
    "cluster": {"preset": "dgx-a100", "nodes": 2, "compute_jitter": 0.05},
    "model": {"layers": 4, "hidden": 512, "heads": 8, "vocab": 8192},
    "training": {"seq_len": 512, "global_batch": 32, "micro_batch": 1},
    "parallelism": {"dp": 16, "bucket_size": "4 MB"},
}


@pytest.fixture
def small() -> dict:
    """A fresh copy of a small 16-GPU data-parallel scenario dict."""
    return copy.deepcopy(SMALL)
