"""Faults that start during the iteration (``at`` on a ``cluster.fabric.faults``
entry): the network's capacities change at that time, flows in flight on a
failed part move to routes over the survivors, and everything before the
change is untouched."""

import numpy as np
import pytest
import simpy
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.config.scenario import from_dict
from simulator.network.batches import BatchNetwork
from simulator.network.flows import Network
from simulator.runner import simulate as runner
from tests.test_faults import scenario
from tests.test_symmetry import assert_same_run

SPINE = {"switch": "spine-0", "down": True}
SLOW_LINK = {"link": ["n1.nic0", "leaf1"], "bandwidth": 0.1}


def ends_with_change(sizes, capacity, at, new, reroute=None, network=Network):
    """When each of ``sizes`` (one flow each: flow i on link i) ends if the
    capacities become ``new`` at ``at``."""
    env = simpy.Environment()
    net = network(env, np.asarray(capacity, dtype=float))
    ends = []
    for i, size in enumerate(sizes):
        net.transfer([[i]], [size]).callbacks.append(lambda _e: ends.append(env.now))
    env.timeout(at).callbacks.append(
        lambda _e: net.change(np.asarray(new, dtype=float), reroute or (lambda r: r)))
    env.run()
    return ends


@settings(max_examples=40, deadline=None)
@given(st.floats(1.0, 100.0), st.floats(1.0, 10.0), st.floats(0.0, 2.0), st.floats(0.1, 10.0))
def test_a_flow_moves_at_the_old_rate_then_the_new(size, capacity, at, new):
    """One flow of ``size`` bytes on a link whose capacity changes at ``at``."""
    (end,) = ends_with_change([size], [capacity], at, [new])
    alone = size / capacity
    expected = alone if alone <= at else at + (size - capacity * at) / new
    assert end == pytest.approx(expected, rel=1e-9)


def test_flows_on_a_failed_link_finish_over_the_route_given_for_it():
    """Link 0 fails at 1 s with 5 of 10 bytes left: its flow moves to link 1,
    which it then shares with link 1's own flow (8 bytes left; 1 byte/s each)."""
    (first, second) = ends_with_change([10.0, 10.0], [5.0, 2.0], 1.0, [0.0, 2.0],
                                       reroute=lambda route: [1])
    assert first == pytest.approx(1.0 + 5.0 / 1.0)  # 5 bytes at half of link 1
    assert second == pytest.approx(6.0 + 3.0 / 2.0)  # then 3 bytes alone at 2 bytes/s


def test_a_batch_network_changes_as_the_plain_one():
    plain = ends_with_change([10.0, 4.0], [5.0, 2.0], 0.5, [1.0, 4.0])
    batch = ends_with_change([10.0, 4.0], [5.0, 2.0], 0.5, [1.0, 4.0], network=BatchNetwork)
    assert batch == pytest.approx(plain, rel=1e-12)


def test_a_fault_from_the_start_is_the_fault_without_a_time():
    assert_same_run(run(scenario({**SPINE, "at": 0})), run(scenario(SPINE)))


def test_a_fault_after_the_iteration_changes_nothing():
    healthy = run(scenario())
    late = run(scenario({**SLOW_LINK, "at": "1 s"}))
    assert late.summary["iteration_time_s"] == healthy.summary["iteration_time_s"]
    assert late.summary["faults"] == ["link n1.nic0 - leaf1 at 10% of its bandwidth from "
                                      "1000 ms"]


@pytest.mark.parametrize("fault", [SPINE, SLOW_LINK, {"nic": "node 1 nic 2", "down": True}])
def test_a_fault_costs_from_when_it_starts(fault):
    """From the start it costs; after the iteration nothing. (A failed part's
    flows take the surviving fabric's routes, which may even collide less than
    the healthy fabric's did, so a later failure is not always cheaper.)"""
    healthy = run(scenario()).summary["iteration_time_s"]
    times = [run(scenario({**fault, "at": f"{share * healthy * 1e3} ms"}))
             .summary["iteration_time_s"] for share in (0.0, 0.7, 0.9, 1.5)]
    assert times[0] > healthy and times[-1] == healthy


def test_the_later_a_link_degrades_the_less_it_costs():
    healthy = run(scenario()).summary["iteration_time_s"]
    times = [run(scenario({**SLOW_LINK, "at": f"{share * healthy * 1e3} ms"}))
             .summary["iteration_time_s"] for share in (0.0, 0.7, 0.8, 0.9, 0.95, 1.5)]
    assert times == sorted(times, reverse=True)


def test_during_the_gradient_all_reduce_it_costs_part_of_the_whole():
    """The slow link from a quarter into the last gradient all-reduce: only the
    rest of that call's traffic over it crawls."""
    healthy = run(scenario())
    last = healthy.comms.iloc[-1]
    at = last["start"] + 0.25 * (last["end"] - last["start"])
    whole = run(scenario(SLOW_LINK)).summary["iteration_time_s"]
    part = run(scenario({**SLOW_LINK, "at": f"{at * 1e3} ms"}))
    assert healthy.summary["iteration_time_s"] < part.summary["iteration_time_s"] < whole
    before = part.comms[part.comms["end"] <= at]
    assert before[["start", "end"]].equals(healthy.comms[healthy.comms["end"] <= at][
        ["start", "end"]])  # what ended before the fault is untouched


@pytest.mark.parametrize("fault", [SPINE, SLOW_LINK])
def test_symmetry_stays_exact_with_a_fault_during_the_run(fault):
    raw = scenario({**fault, "at": "5 ms"}, nodes=4)
    raw["parallelism"] = {"tp": 2, "dp": 16}
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    full = {**raw, "simulation": {"symmetry": "full"}}
    assert_same_run(fast, run(full))
    assert_same_run(fast, runner.run(from_dict(full), batch_compute=False))


@pytest.mark.parametrize(("at", "match"), [
    ("soon", r"cluster.fabric.faults\[0\].at: 'soon'"),
    ("-2 ms", r"cluster.fabric.faults\[0\].at.*from the iteration's start"),
])
def test_bad_fault_times_name_the_field(at, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(scenario({**SPINE, "at": at}))


def test_a_fault_before_any_traffic_over_it_is_the_fault_from_the_start():
    """Tensor-parallel calls (NVLink only) run when the link degrades; the
    gradient all-reduce over it comes later, and takes what it would take had
    the link been slow all along (calls lowered for each state of the fabric
    keep apart in the network's caches)."""
    def one(fault: dict) -> float:
        raw = scenario(fault, nodes=4)
        raw["parallelism"] = {"tp": 2, "dp": 16}
        return run(raw).summary["iteration_time_s"]
    assert one({**SLOW_LINK, "at": "10 ms"}) == pytest.approx(one(SLOW_LINK), rel=1e-12)
