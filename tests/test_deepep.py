"""DeepEP's two hops (``moe_token_dispatcher_type: flex`` across NVLink
domains, ``workloads.strategies.expert.hops``): the groups of each hop, their
bytes against the closed form, both hops at once, one hop inside a domain, and
the domain a job's ranks share (an NVL72 rack)."""

import math

import pytest

from simulator import run
from simulator.config.scenario import from_dict
from tests.test_moe import scenario
from workloads.program import build_program
from workloads.strategies import expert

TOKENS, HIDDEN, TOP_K, EXPERTS = 128, 256, 2, 16  # tests.test_moe's tiny MoE, 16 experts


def _raw(**parallelism) -> dict:
    raw = scenario(**{"moe_token_dispatcher_type": "flex", **parallelism})
    raw["model"]["experts"] = EXPERTS
    return raw


def _held(holders: int) -> float:
    """Holders (of ``EXPERTS`` // holders consecutive experts each) of one of a
    token's ``TOP_K`` experts, on average: hypergeometric."""
    return holders * (1 - math.comb(EXPERTS - EXPERTS // holders, TOP_K)
                      / math.comb(EXPERTS, TOP_K))


def test_across_two_servers_a_token_goes_once_per_server_then_once_per_rank():
    """EP 16 over two DGX H100: the RDMA hop's groups are the two ranks of one
    local index, the NVLink hop's the eight ranks of a server; a rank sends each
    token (256 wide, BF16) once to each server holding its experts (1.53 of 2)
    and, inside, once to each rank holding them (2 of 16)."""
    raw = _raw(ep=16)
    s = from_dict(raw)
    program = build_program(s.model, s.training, s.parallel, s.seed)
    assert program.groups["ep_rdma"][0] == (0, 8)
    assert program.groups["ep_nvl"][0] == tuple(range(8))
    comms = run(raw).comms
    per_token = TOKENS * HIDDEN * 2
    rdma = comms[comms["group"] == "ep_rdma"]["bytes"].unique()
    nvl = comms[comms["group"] == "ep_nvl"]["bytes"].unique()
    assert rdma == pytest.approx([per_token * _held(2)], rel=1e-12)
    assert nvl == pytest.approx([per_token * _held(16)], rel=1e-12)
    # only DeepEP's notify (the token counts) runs over the whole EP group
    assert set(comms[comms["group"] == "ep"]["name"]) == {expert.COUNTS}


def test_both_hops_run_at_once():
    """Each exchange's two hops start together, after the same kernel."""
    spans = run(_raw(ep=16)).spans
    spans = spans[(spans["rank"] == 0) & (spans["kind"] == "comm")]
    for name in ("dispatch", "combine"):
        nvl = spans[spans["name"] == name].sort_values(["phase", "microbatch", "layer"])
        rdma = spans[spans["name"] == f"{name}_rdma"].sort_values(
            ["phase", "microbatch", "layer"])
        assert len(nvl) == len(rdma) > 0
        assert nvl["start"].to_numpy() == pytest.approx(rdma["start"].to_numpy(), abs=1e-12)


@pytest.mark.parametrize("parallelism", [dict(ep=8), dict(ep=16, moe_token_dispatcher_type=
                                                               "alltoall")])
def test_one_hop_inside_a_server_or_without_deepep(parallelism):
    raw = _raw(**parallelism)
    s = from_dict(raw)
    assert expert.domains(s.parallel) == 1
    groups = set(run(raw).comms["group"])
    assert "ep" in groups and not groups & {"ep_rdma", "ep_nvl"}


def test_a_rack_is_one_domain():
    """On GB200 NVL72 racks an EP group of a whole rack (72) takes one NVLink hop;
    a job on 16 trays of each of two racks shares 64 GPUs a rack, and its EP
    group of 128 takes two."""
    raw = _raw(ep=72)
    raw["cluster"] = {"preset": "gb200-nvl72", "nodes": 18}
    raw["training"]["global_batch"] = 72
    raw["model"]["experts"] = 72
    s = from_dict(raw)
    assert s.parallel.ranks_per_domain == 72
    assert expert.domains(s.parallel) == 1
    jobs = {"name": "two-racks", "seed": 0, "cluster": {"preset": "gb200-nvl72", "nodes": 36},
            "jobs": {"a": {"nodes": list(range(16)) + list(range(18, 34)),
                           "model": {**raw["model"], "experts": 128},
                           "training": {**raw["training"], "global_batch": 128},
                           "parallelism": {"ep": 128, "moe_token_dispatcher_type": "flex"}}}}
    job = from_dict(jobs).jobs[0]
    assert job.parallel.ranks_per_domain == 64
    assert expert.domains(job.parallel) == 2


@pytest.mark.parametrize("overlap", ["none", "1f1b"])
def test_two_hops_by_symmetry_equal_a_full_simulation(overlap):
    from tests.test_symmetry import assert_same_run
    raw = _raw(ep=16, moe_overlap=overlap)
    fast = run(raw)
    assert fast.summary["simulation_exact"]
    assert_same_run(fast, run({**raw, "simulation": {"symmetry": "full"}}))
    if overlap == "1f1b":
        assert fast.summary["moe_a2a_hidden_s"] > 0


def test_every_communication_stream_has_a_gantt_colour():
    """(The offload streams' spans are host copies, not communication.)"""
    from simulator.base.ir import COMMUNICATION_STREAMS, OFFLOAD_STREAM, RELOAD_STREAM
    from simulator.outputs.gantt import CATEGORIES, category
    for stream in COMMUNICATION_STREAMS:
        kind = "copy" if stream in (OFFLOAD_STREAM, RELOAD_STREAM) else "comm"
        assert category(kind, "forward", stream) in CATEGORIES, stream


def test_the_gantt_draws_both_hops(tmp_path):
    from simulator.outputs.gantt import figure
    spans = run(_raw(ep=16)).spans
    assert {"ep", "ep_rdma"} <= set(spans["stream"])
    figure(spans, "deepep").savefig(tmp_path / "gantt.png")
    assert (tmp_path / "gantt.png").stat().st_size > 0


def test_the_log_names_each_hops_dispatch_and_combine():
    """A dispatch and a combine of one size on one hop are logged under their own
    names, every member of a group's call under the name its ranks gave it (a
    batch of groups' calls once took the first call's name for all of them)."""
    comms = run(_raw(ep=16)).comms
    spans = run(_raw(ep=16)).spans
    for group, names in (("ep_nvl", ("dispatch", "combine")),
                         ("ep_rdma", ("dispatch_rdma", "combine_rdma"))):
        logged = comms[comms["group"] == group]["name"].astype(str).value_counts()
        assert set(logged.index) == set(names)
        assert logged[names[0]] == logged[names[1]]
    mine = spans[(spans["kind"] == "comm") & spans["name"].isin(["dispatch", "combine"])]
    assert (comms.loc[mine["call"].astype(int), "name"].astype(str).to_numpy()
            == mine["name"].astype(str).to_numpy()).all()
