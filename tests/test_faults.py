"""Degraded and failed fabric parts (``cluster.fabric.faults``): routes avoid
what failed, a failed NIC's GPUs move to the others, a cut is an error naming
the servers, a slower link never makes a run faster, and no faults is today's
run exactly."""

import pytest

from simulator import run
from simulator.base.fields import ScenarioError
from simulator.collectives.plan import channels_for
from simulator.config.scenario import from_dict
from simulator.network.fabric import Fabric
from tests.test_symmetry import assert_same_run


def scenario(*faults, nodes: int = 2, leaf_ports: int = 8) -> dict:
    """Two DGX H100 servers on a fat tree of two leaves (8 ports each) and their
    spines; a data-parallel job whose gradient all-reduce crosses the spines."""
    fabric = {"faults": list(faults)} if faults else {}
    return {"name": "faults", "seed": 0,
            "cluster": {"preset": "dgx-h100", "nodes": nodes, "leaf_ports": leaf_ports,
                        **({"fabric": fabric} if faults else {})},
            "model": {"preset": "gpt3-125m"},
            "training": {"seq_len": 1024, "global_batch": 8 * nodes, "micro_batch": 1},
            "parallelism": {"dp": 8 * nodes}}


def graph_of(raw: dict):
    return from_dict(raw).machine.build_graph()


def test_no_faults_is_todays_run():
    raw = scenario()
    empty = {**raw, "cluster": {**raw["cluster"], "fabric": {"faults": []}}}
    assert_same_run(run(empty), run(raw))


def test_routes_avoid_a_failed_switch():
    graph = graph_of(scenario({"switch": "spine-0", "down": True}))
    assert "spine0" not in graph and graph.graph["faults"] == ["switch spine0 down"]
    fabric = Fabric(graph)
    gpus = graph.graph["gpus"]
    for a in gpus[:8]:
        for b in gpus[8:]:
            assert fabric.route(a, b).links  # (every pair still reaches the other)


def test_a_failed_nics_gpus_move_to_the_servers_other_nics():
    graph = graph_of(scenario({"nic": "node 1 nic 2", "down": True}))
    fabric = Fabric(graph)
    assert "n1.nic2" not in graph
    moved = graph.nodes["n1.gpu2"]["nic"]
    assert moved.startswith("n1.nic") and moved != "n1.nic2"
    assert channels_for(fabric, graph.graph["gpus"]) == 7  # NCCL: one channel per NIC left
    assert fabric.route("n1.gpu2", "n0.gpu0").links


def test_a_server_without_nics_is_an_error_naming_its_gpus():
    faults = [{"nic": f"n1.nic{k}", "down": True} for k in range(8)]
    with pytest.raises(ScenarioError, match="GPU n1.gpu0 cannot reach its peers"):
        from_dict(scenario(*faults))


def test_a_cut_fabric_is_an_error_naming_the_gpus_cut_off():
    graph = graph_of(scenario())
    spines = sorted(n for n in graph if n.startswith("spine"))
    with pytest.raises(ScenarioError, match="GPU n1.gpu0 cannot reach its peers: every NIC "
                                            "of server 1 is down or cut off"):
        from_dict(scenario(*[{"switch": s, "down": True} for s in spines]))


def test_a_leaf_cut_off_moves_its_nics_gpus_to_nics_still_reached():
    """Leaves of 4 ports: each server's 8 NICs hang off two leaves. A leaf that
    loses its uplinks takes its NICs with it, and their GPUs move to their
    server's NICs on the other leaf (two GPUs a NIC), which slows the job."""
    graph = graph_of(scenario(leaf_ports=4))
    uplinks = [{"link": ["leaf1", s], "down": True} for s in graph.successors("leaf1")
               if s.startswith("spine")]
    broken = graph_of(scenario(*uplinks, leaf_ports=4))
    lost = {n for n in graph.predecessors("leaf1") if graph.nodes[n]["kind"] == "nic"}
    assert lost == {"n0.nic4", "n0.nic5", "n0.nic6", "n0.nic7"}
    assert {broken.nodes[f"n0.gpu{g}"]["nic"] for g in range(8)} == {
        "n0.nic0", "n0.nic1", "n0.nic2", "n0.nic3"}
    assert run(scenario(*uplinks, leaf_ports=4)).summary["iteration_time_s"] > \
        run(scenario(leaf_ports=4)).summary["iteration_time_s"]


def test_a_slower_link_never_makes_the_run_faster():
    times = [run(scenario({"link": ["n1.nic0", "leaf1"], "bandwidth": share}) if share < 1
                 else scenario()).summary["iteration_time_s"] for share in (0.1, 0.5, 1.0)]
    assert times == sorted(times, reverse=True) and times[0] > times[-1]


def test_symmetry_stays_exact_with_faults():
    raw = scenario({"link": ["n1.nic3", "leaf1"], "bandwidth": 0.5},
                   {"switch": "spine1", "down": True})
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert fast.summary["faults"] == ["link n1.nic3 - leaf1 at 50% of its bandwidth",
                                      "switch spine1 down"]
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))


@pytest.mark.parametrize(("faults", "match"), [
    ({"switch": "spine0"}, "either down: true or bandwidth"),
    ({"switch": "spine0", "down": True, "bandwidth": 0.5}, "either down: true or bandwidth"),
    ({"nic": "n0.nic0", "bandwidth": 1.5}, r"faults\[0\].bandwidth.*from 0.001 to 1"),
    ({"nic": "n0.nic0", "switch": "leaf0", "down": True}, "must name one part"),
    ({"switch": "spine99", "down": True}, "'spine99' is not a part of this fabric"),
    ({"nic": "leaf0", "down": True}, "leaf0 is a switch, not a nic"),
    ({"link": ["n0.nic0", "leaf1"], "down": True}, "no link between n0.nic0 and leaf1"),
    ({"link": "n0.nic0", "down": True}, "must name its two ends"),
])
def test_bad_faults_name_the_field(faults, match):
    with pytest.raises(ScenarioError, match=match):
        from_dict(scenario(faults))
