"""Memory formulas (ZeRO paper; Korthikanti et al. 2022) and bucket packing."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads.buckets import make_buckets
from workloads.memory import Recompute, activation_bytes_per_layer, model_state_bytes

S, B, H, A = 2048, 4, 4096, 32


def test_model_states_are_16_bytes_per_parameter():
    states = model_state_bytes(1e9)
    assert sum(states.values()) == 16e9
    assert states == {"parameters": 2e9, "gradients": 2e9, "optimizer_states": 12e9}


@pytest.mark.parametrize(("tp", "sp", "recompute", "expected"), [
    (1, False, Recompute.NONE, S * B * H * (34 + 5 * A * S / H)),
    (8, False, Recompute.NONE, S * B * H * (10 + 24 / 8 + 5 * A * S / (H * 8))),
    (8, True, Recompute.NONE, S * B * H * (34 + 5 * A * S / H) / 8),
    (8, True, Recompute.SELECTIVE, 34 * S * B * H / 8),
    (1, False, Recompute.SELECTIVE, 34 * S * B * H),
    (8, True, Recompute.FULL, 2 * S * B * H),
])
def test_korthikanti_activation_memory(tp, sp, recompute, expected):
    got = activation_bytes_per_layer(S, B, H, A, tp=tp, sequence_parallel=sp,
                                     recompute=recompute)
    assert got == pytest.approx(expected, rel=1e-12)


def test_bucket_never_splits_a_tensor():
    buckets = make_buckets([(0, 100.0), (1, 1.0), (2, 1.0)], 25.0)
    assert [b.bytes for b in buckets] == [100.0, 2.0]
    assert [b.ready_after for b in buckets] == [0, 2]


@given(st.lists(st.floats(min_value=0.0, max_value=1e9), max_size=60),
       st.floats(min_value=1.0, max_value=1e9))
def test_buckets_conserve_bytes_and_order(sizes, cap):
    grads = list(enumerate(sizes))
    buckets = make_buckets(grads, cap)
    assert sum(b.bytes for b in buckets) == pytest.approx(sum(sizes))
    assert all(b.bytes >= cap for b in buckets[:-1])
    ready = [b.ready_after for b in buckets]
    assert ready == sorted(ready)


@pytest.mark.parametrize(("zero", "per_param"), [
    (0, lambda d: 16), (1, lambda d: 4 + 12 / d), (2, lambda d: 2 + 14 / d),
    (3, lambda d: 16 / d)])
@pytest.mark.parametrize("d", [1, 2, 8, 64])
def test_zero_model_state_memory(zero, per_param, d):
    psi = 7.5e9
    assert sum(model_state_bytes(psi, zero, d).values()) == pytest.approx(per_param(d) * psi)
