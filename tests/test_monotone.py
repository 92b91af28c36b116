"""Losing capacity never makes a run faster (issue 36): property tests over random
degradations and failures of a four-server fat tree.

- A degradation that keeps the fabric's shape (a link or NIC at a share of its
  rate, a slower GPU, a throttled one) never speeds a run up: strictly, up to
  float rounding.
- A failed NIC moves its GPUs to their server's nearest NIC left and NCCL's
  channels count the NICs left: on a data-parallel job, more failed NICs are
  never faster than fewer.
- Any set of failed parts (links, NICs, spines) changes routes and channels;
  ECMP then places the flows left over the paths left, which may collide less
  than before (two of eight channels share a spine when one of eight is down;
  seven channels, after a NIC fails, do not). So a run with one more failed part
  can be faster than with fewer, but never faster than on the healthy fabric by
  more than ROUTING_TOLERANCE (the README's Stragglers, faults and blame).
"""

from __future__ import annotations

import os

from hypothesis import given, settings
from hypothesis import strategies as st

from simulator import run
from simulator.config.scenario import from_dict

ROUNDING = 1e-9  # relative: the same run's time, summed in another order
ROUTING_TOLERANCE = 0.03  # a failed part's run against the healthy fabric's (README)
HUNT = int(os.environ.get("CLUSTERSIM_FUZZ", "0"))
PROPERTY = settings(max_examples=HUNT or 12, deadline=None, derandomize=not HUNT,
                    database=None)
NODES = 4


def scenario(faults=(), tp: int = 1, **cluster) -> dict:
    """GPT-3 125M (two layers) on four DGX H100 servers, leaves of eight ports
    (four leaves, eight spines), data parallel over every GPU or beside tp."""
    gpus = 8 * NODES
    fabric = {"fabric": {"faults": list(faults)}} if faults else {}
    return {"name": "monotone", "cluster": {"preset": "dgx-h100", "nodes": NODES,
                                            "leaf_ports": 8, **cluster, **fabric},
            "model": {"preset": "gpt3-125m", "layers": 2},
            "training": {"seq_len": 512, "global_batch": gpus // tp, "micro_batch": 1},
            "parallelism": {"tp": tp, "dp": gpus // tp}}


_TIMES: dict[str, float] = {}


def time_of(raw: dict) -> float:
    key = repr(raw)
    if key not in _TIMES:
        _TIMES[key] = run(raw).summary["iteration_time_s"]
    return _TIMES[key]


_GRAPH = from_dict(scenario()).machine.build_graph()
NICS = sorted(n for n, d in _GRAPH.nodes(data=True) if d["kind"] == "nic")
UPLINKS = sorted((u, v) for u, v in _GRAPH.edges() if _GRAPH.nodes[u]["kind"] in ("nic", "switch")
                 and _GRAPH.nodes[v]["kind"] == "switch")
SPINES = sorted(n for n in _GRAPH if n.startswith("spine"))
SHARES = st.sampled_from([0.1, 0.25, 0.5, 0.9])


def _degradation(kind: str, index: int, share: float) -> tuple[str, dict]:
    """One degradation as (scenario section, entry): a link or NIC at ``share``,
    a GPU 1/share slower, or throttled to that from 1 ms on."""
    if kind == "link":
        return "faults", {"link": list(UPLINKS[index % len(UPLINKS)]), "bandwidth": share}
    if kind == "nic":
        return "faults", {"nic": NICS[index % len(NICS)], "bandwidth": share}
    gpu = f"gpu {index % (8 * NODES)}"
    if kind == "slow":
        return "slow", {gpu: 1 / share}
    return "throttle", {gpu: {"1 ms": 1 / share}}


def _with(degradations: list[tuple[str, dict]], tp: int) -> dict:
    raw = scenario(tp=tp)
    faults = [e for section, e in degradations if section == "faults"]
    if faults:
        raw["cluster"]["fabric"] = {"faults": faults}
    for section in ("slow", "throttle"):
        entries = [e for s, e in degradations if s == section]
        if entries:
            raw["cluster"][section] = {k: v for e in entries for k, v in e.items()}
    return raw


def _part(degradation: tuple[str, int, float]) -> tuple:
    kind, index, _ = degradation
    count = {"link": len(UPLINKS), "nic": len(NICS)}.get(kind, 8 * NODES)
    return ("gpu" if kind in ("slow", "throttle") else kind, index % count, kind)


DEGRADATIONS = st.lists(st.tuples(st.sampled_from(["link", "link", "nic", "slow", "throttle"]),
                                  st.integers(0, 10**6), SHARES),
                        min_size=1, max_size=3, unique_by=_part)


@PROPERTY
@given(DEGRADATIONS, st.booleans(), st.sampled_from([1, 2]))
def test_a_degradation_never_speeds_a_run_up(degradations, deepen, tp):
    """Adding a degradation to others, or halving the share of one, never
    shortens the iteration: the fabric's shape and the channels stay, only rates
    fall."""
    if deepen:
        kind, index, share = degradations[-1]
        before, worse = degradations, [*degradations[:-1], (kind, index, share / 2)]
    else:
        before, worse = degradations[:-1], degradations
    slower = time_of(_with([_degradation(*d) for d in worse], tp))
    assert slower >= time_of(_with([_degradation(*d) for d in before], tp)) * (1 - ROUNDING)


@PROPERTY
@given(st.lists(st.sampled_from(NICS), min_size=1, max_size=6, unique=True))
def test_more_failed_nics_are_never_faster(nics):
    times = [time_of(scenario([{"nic": n, "down": True} for n in nics[:k]]))
             for k in range(len(nics) + 1)]
    for fewer, more in zip(times, times[1:], strict=False):
        assert more >= fewer * (1 - ROUNDING), times


FAILURE = st.one_of(
    st.builds(lambda link: {"link": list(link), "down": True}, st.sampled_from(UPLINKS)),
    st.builds(lambda nic: {"nic": nic, "down": True}, st.sampled_from(NICS)),
    st.builds(lambda spine: {"switch": spine, "down": True}, st.sampled_from(SPINES)))


@PROPERTY
@given(st.lists(FAILURE, min_size=1, max_size=4, unique_by=repr), st.sampled_from([1, 2, 4]),
       st.sampled_from([{}, {"ecmp": "hash"}, {"oversubscription": 2.0}]))
def test_failed_parts_never_beat_the_healthy_fabric(failures, tp, cluster):
    from simulator.base.fields import ScenarioError
    try:
        broken = time_of(scenario(failures, tp, **cluster))
    except ScenarioError:  # a server cut off: an error, nothing to compare
        return
    assert broken >= time_of(scenario((), tp, **cluster)) * (1 - ROUTING_TOLERANCE)


def _issue_cluster(*faults) -> dict:
    """The issue's case: two servers of four A100 with two NICs each."""
    cluster = {"preset": "dgx-a100", "nodes": 2, "gpus_per_node": 4, "nics_per_node": 2}
    if faults:
        cluster["fabric"] = {"faults": list(faults)}
    return {"name": "nics", "cluster": cluster, "model": {"preset": "gpt3-125m"},
            "training": {"seq_len": 1024, "global_batch": 16, "micro_batch": 1},
            "parallelism": {"dp": 8}}


def test_a_failed_nic_costs_what_its_bandwidth_carried():
    """With two GPUs per NIC the channels enter and leave each server through
    different NICs (they used to share one, so losing the other cost nothing):
    a failed NIC halves the inter-server bandwidth, as the NIC at half its rate
    does; at 90 % it costs less."""
    healthy = run(_issue_cluster())
    down = run(_issue_cluster({"nic": "n0.nic0", "down": True}))
    half = run(_issue_cluster({"nic": "n0.nic0", "bandwidth": 0.5}))
    most = run(_issue_cluster({"nic": "n0.nic0", "bandwidth": 0.9}))
    times = [r.summary["iteration_time_s"] for r in (healthy, most, down, half)]
    assert times[0] < times[1] < times[2] <= times[3] * (1 + ROUNDING)
    assert set(healthy.comms["channels"]) == {2} and set(down.comms["channels"]) == {1}
    exchanged = healthy.comms[healthy.comms["collective"] == "all_reduce"]
    lost = down.comms[down.comms["collective"] == "all_reduce"]
    assert (lost["end"] - lost["start"]).median() > 1.3 * (
        exchanged["end"] - exchanged["start"]).median()


def test_every_channel_crosses_its_own_nic():
    """A ring of four GPUs per server on two NICs: each channel enters a server
    through one NIC and leaves through the other, the two channels through
    different ones (the channel's run starts at a GPU of NIC c)."""
    from simulator.collectives.ring import ring_orders
    nodes, nics = [0] * 4 + [1] * 4, ["a", "a", "b", "b", "c", "c", "d", "d"]
    orders = ring_orders(nodes, 2, nics)
    for order in orders:
        assert nics[order[0]] != nics[order[3]] and nics[order[4]] != nics[order[7]]
    assert {nics[o[0]] for o in orders} == {"a", "b"}  # entries on different NICs
    assert {nics[o[3]] for o in orders} == {"a", "b"}  # and exits


@PROPERTY
@given(st.sampled_from(["nic_bandwidth", "nvlink_bandwidth", "pcie_bandwidth"]),
       st.floats(0.05, 1.0), st.floats(0.05, 1.0), st.sampled_from([1, 2]))
def test_lower_bandwidth_never_speeds_a_run_up(key, a, b, tp):
    """Any of the cluster's bandwidths lowered (each call's algorithm and
    protocol chosen again by the tuner) never shortens the iteration."""
    from topologies import CLUSTERS
    base = getattr(CLUSTERS["dgx-h100"], key)
    high, low = max(a, b), min(a, b)
    unit = "B/s"
    slower = time_of(scenario(tp=tp, **{key: f"{base * low:.6g} {unit}"}))
    assert slower >= time_of(scenario(tp=tp, **{key: f"{base * high:.6g} {unit}"})) * (
        1 - ROUNDING)
