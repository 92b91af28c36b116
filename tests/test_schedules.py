"""Pipeline schedules against their invariants and bubble-fraction closed forms."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads.schedules import (
    Schedule,
    ScheduleError,
    interleaved,
    makespan,
    one_f_one_b,
    steps_for,
)

shapes = st.tuples(st.integers(1, 8), st.integers(1, 6), st.integers(1, 4)).map(
    lambda t: (t[0], t[0] * t[1], t[2]))  # (p, m multiple of p, v)


@given(shapes, st.sampled_from(list(Schedule)))
def test_every_step_once_and_forward_before_backward(shape, schedule):
    p, m, v = shape
    v = v if schedule is Schedule.INTERLEAVED else 1
    for stage in range(p):
        steps = steps_for(schedule, p, m, v, stage)
        assert len(steps) == 2 * m * v
        assert len(set(steps)) == len(steps)
        position = {s: i for i, s in enumerate(steps)}
        for s in steps:
            if not s.forward:
                assert position[type(s)(True, s.microbatch, s.chunk)] < position[s]


@given(st.integers(1, 8), st.integers(1, 20))
def test_1f1b_warmup_is_p_minus_stage_minus_1(p, m):
    for stage in range(p):
        steps = one_f_one_b(p, m, stage)
        warmup = min(p - stage - 1, m)
        leading_forwards = next(i for i, s in enumerate(steps) if not s.forward)
        # warm-up forwards, then the steady state opens with one more forward
        assert leading_forwards == warmup + (1 if m > warmup else 0)
        in_flight = peak = 0
        for s in steps:
            in_flight += 1 if s.forward else -1
            peak = max(peak, in_flight)
        assert peak == min(p - stage, m)


@pytest.mark.parametrize("schedule", [Schedule.GPIPE, Schedule.ONE_F_ONE_B])
@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 4), (4, 8), (8, 8), (4, 16)])
def test_bubble_fraction_gpipe_and_1f1b(schedule, p, m):
    tf, tb = 1.0, 2.0
    total = makespan(schedule, p, m, 1, tf, tb)
    bubble = (total - m * (tf + tb)) / total
    assert bubble == pytest.approx((p - 1) / (m + p - 1))


@pytest.mark.parametrize(("p", "m", "v"), [(2, 4, 2), (4, 8, 2), (4, 8, 4), (8, 16, 3)])
def test_bubble_fraction_interleaved(p, m, v):
    tf, tb = 1.0, 2.0
    total = makespan(Schedule.INTERLEAVED, p, m, v, tf, tb)
    bubble = (total - m * (tf + tb)) / total
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1))
    assert total == pytest.approx(m * (tf + tb) * (1 + (p - 1) / (v * m)))


def test_interleaved_constraints():
    with pytest.raises(ScheduleError, match=r"micro-batches \(6\) to be a multiple of "
                                            r"pipeline stages \(4\)"):
        interleaved(4, 6, 2, 0)
    with pytest.raises(ScheduleError, match="need the interleaved schedule"):
        steps_for(Schedule.ONE_F_ONE_B, 4, 8, 2, 0)
