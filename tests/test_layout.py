"""Rank groups against a brute-force enumeration (Megatron's rank generator)."""

from itertools import product

import pytest
from hypothesis import given
from hypothesis import strategies as st

from workloads.layout import DIMENSIONS, Layout, parse_order


def brute_force(sizes, order, dim):
    """Enumerate every rank's coordinates by nested loops, slowest dimension outermost."""
    coords = {}
    for rank, values in enumerate(product(*(range(sizes[d]) for d in reversed(order)))):
        coords[rank] = dict(zip(reversed(order), values, strict=True))
    groups = {}
    for r, c in coords.items():
        key = tuple(c[d] for d in DIMENSIONS if d != dim)
        groups.setdefault(key, []).append((c[dim], r))
    return sorted(tuple(r for _, r in sorted(g)) for g in groups.values())


@given(st.fixed_dictionaries({d: st.integers(1, 4) for d in DIMENSIONS}),
       st.permutations(list(DIMENSIONS)), st.sampled_from(DIMENSIONS))
def test_groups_match_brute_force(sizes, order, dim):
    layout = Layout(sizes, tuple(order))
    assert list(layout.groups(dim)) == brute_force(sizes, order, dim)
    for r in range(layout.world):
        assert layout.rank(layout.coords(r)) == r


def test_megatron_example():
    layout = Layout({"tp": 2, "cp": 1, "dp": 2, "pp": 2})
    assert layout.groups("tp") == ((0, 1), (2, 3), (4, 5), (6, 7))
    assert layout.groups("dp") == ((0, 2), (1, 3), (4, 6), (5, 7))
    assert layout.groups("pp") == ((0, 4), (1, 5), (2, 6), (3, 7))


def test_order_must_name_every_dimension():
    assert parse_order("dp-tp-pp-cp") == ("dp", "tp", "pp", "cp")
    with pytest.raises(ValueError, match="must name tp, cp, dp and pp once each"):
        parse_order("tp-dp-pp")
