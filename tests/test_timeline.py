"""Interval algebra of the timeline on hand-built traces with known answers."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator.analysis.timeline import breakdown, union_length


def iv(*pairs):
    return np.array([p[0] for p in pairs], float), np.array([p[1] for p in pairs], float)


def test_union_length():
    assert union_length(*iv((0, 2), (1, 3), (5, 6))) == 4.0
    assert union_length(*iv((0, 10), (2, 3))) == 10.0
    assert union_length(*iv()) == 0.0


def test_hand_built_rank():
    # compute [0,4) and [6,8); comm [3,7); wait [2,3) hidden by compute, [9,10) exposed.
    b = breakdown(iv((0, 4), (6, 8)), iv((3, 7)), iv((2, 3), (9, 10)), iteration_time=12.0)
    assert b["compute_s"] == 6.0
    assert b["comm_busy_s"] == 4.0
    assert b["overlapped_comm_s"] == 2.0
    assert b["exposed_comm_s"] == 2.0
    assert b["comm_wait_s"] == 1.0
    assert b["comm_wait_total_s"] == 2.0
    assert b["bubble_s"] == 0.0
    assert b["idle_s"] == 3.0


def test_bubble_is_idle_before_last_compute():
    b = breakdown(iv((0, 1), (3, 4)), iv(), iv(), iteration_time=4.0)
    assert b["bubble_s"] == 2.0 and b["idle_s"] == 0.0


spans = st.lists(st.tuples(st.floats(0, 100), st.floats(0, 20)), max_size=12).map(
    lambda xs: iv(*[(s, s + d) for s, d in xs]))


@given(spans, spans, spans)
def test_categories_partition_the_iteration(compute, comm, wait):
    end = max([100.0 + 20.0] + [float(x[1].max()) for x in (compute, comm, wait) if len(x[1])])
    b = breakdown(compute, comm, wait, end)
    total = b["compute_s"] + b["exposed_comm_s"] + b["comm_wait_s"] + b["bubble_s"] + b["idle_s"]
    assert total == pytest.approx(end)
    assert b["overlapped_comm_s"] <= min(b["compute_s"], b["comm_busy_s"]) + 1e-9
    assert min(b.values()) >= -1e-9
