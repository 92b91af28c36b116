"""Blame: the critical path's time beyond the ideal charged to stragglers and
to congested or degraded links; the last rank to arrive at each call; the
``clustersim blame`` command and its heat map."""

import numpy as np
import pandas as pd
import pytest
import yaml

from simulator import run
from simulator.analysis.blame import LinkLoad, last_arrivals, ranks_to_blame
from simulator.cli import main
from tests.test_fault_times import SLOW_LINK
from tests.test_faults import scenario as fabric_scenario
from tests.test_stragglers import scenario as straggler_scenario


def test_the_last_to_arrive_is_the_member_that_waited_least():
    spans = pd.DataFrame({
        "rank": [0, 0, 1, 1, 2, 0, 1],
        "kind": ["wait", "comm", "wait", "comm", "comm", "comm", "comm"],
        "start": [0.0, 3.0, 1.0, 3.0, 3.0, 5.0, 5.0],
        "end": [3.0, 4.0, 3.0, 4.0, 4.0, 6.0, 6.0],
        "call": [7, 7, 7, 7, 7, 8, 8]})
    last = last_arrivals(spans)
    assert last.to_dict("records") == [{"call": 7, "rank": 2, "members": 3, "waited_s": 5.0}]
    table = ranks_to_blame(last)
    assert table.to_dict("records") == [{"rank": 2, "calls_last": 1, "caused_wait_s": 5.0}]


def test_link_load_spreads_each_calls_bytes_over_its_run():
    load = LinkLoad({3: (np.array([0.0, 1.0]), np.array([2.0, 3.0]), np.array([4.0, 2.0]))})
    assert load.bytes(3, 0.0, 3.0) == pytest.approx(6.0)
    assert load.bytes(3, 1.0, 2.0) == pytest.approx(2.0 + 1.0)
    assert load.bytes(5, 0.0, 3.0) == 0.0
    assert load.matrix([3], np.array([0.0, 1.5, 3.0]))[0].tolist() == pytest.approx(
        [(3.0 + 0.5) / 1.5, (1.0 + 1.5) / 1.5])


def test_a_healthy_run_alone_on_its_fabric_has_nothing_to_blame():
    assert run(fabric_scenario()).summary["blame"] == []


def test_a_slow_gpu_is_blamed_for_what_it_adds():
    healthy = run(straggler_scenario()).summary
    slow = run(straggler_scenario(slow={"gpu 5": 1.5}))
    added = slow.summary["iteration_time_s"] - healthy["iteration_time_s"]
    (first, *_) = slow.summary["blame"]
    assert (first["kind"], first["cause"]) == ("straggler", "rank 5")
    # an upper bound: the slower kernels fill the time the healthy GPU waited for
    # the host to launch them, which blame counts as slowed too
    assert added <= first["seconds"] <= added + healthy["host_stall_s"]


def test_a_degraded_link_is_blamed_for_what_it_adds():
    healthy = run(fabric_scenario()).summary["iteration_time_s"]
    degraded = run(fabric_scenario(SLOW_LINK))
    added = degraded.summary["iteration_time_s"] - healthy
    (first, *_) = degraded.summary["blame"]
    assert (first["kind"], first["cause"]) == ("link", "n1.nic0 -> leaf1")
    assert "at 10% of its bandwidth" in first["detail"]
    assert first["seconds"] == pytest.approx(added, rel=0.1)


def test_a_link_that_degrades_during_the_run_is_measured_against_what_it_carried_then():
    healthy = run(fabric_scenario())
    last = healthy.comms.iloc[-1]
    at = last["start"] + 0.25 * (last["end"] - last["start"])
    late = run(fabric_scenario({**SLOW_LINK, "at": f"{at * 1e3} ms"}))
    (first, *_) = late.summary["blame"]
    assert first["cause"] == "n1.nic0 -> leaf1"


def test_clustersim_blame_prints_the_causes_and_draws_the_links(tmp_path, capsys):
    raw = fabric_scenario(SLOW_LINK)
    raw["cluster"]["slow"] = {"gpu 3": 1.3}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(raw))
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == 0
    capsys.readouterr()
    assert main(["blame", str(tmp_path / "run"), "--top", "3"]) == 0
    printed = capsys.readouterr().out
    assert "1. link      n1.nic0 -> leaf1" in printed
    assert "straggler rank 3" in printed
    assert "rank 3" in printed.split("slowest rank per collective call")[1]
    assert (tmp_path / "run" / "links.png").stat().st_size > 10_000
    assert main(["blame", str(tmp_path / "nothing")]) == 2
