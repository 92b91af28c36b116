"""A scenario's fabric in each state with its lowering, built in one place
(``simulator.collectives.states``, ``Scenario.fabric_states``) and used alike by
the run, blame, the layout estimate, validation and the ``collective`` command."""

import ast
from pathlib import Path

from simulator.base.ir import Collective
from simulator.collectives.nccl import Algorithm
from simulator.config.scenario import from_dict
from simulator.experiments.estimate import Estimator
from tests.test_faults import scenario

SLOW_LINK = {"link": ["n1.nic0", "leaf1"], "bandwidth": 0.1}
ROOT = Path(__file__).resolve().parents[1]


def test_each_state_lowers_on_its_own_fabric_with_its_own_keys():
    """A fault at 1 ms: two states; the second's fabric has the link at a tenth of
    its bandwidth, its calls' keys carry its number, and the healthy lowering is
    a third fabric with the link whole."""
    fabrics = from_dict(scenario({**SLOW_LINK, "at": "1 ms"})).fabric_states()
    (start, first, low0), (at, later, low1) = fabrics.states
    assert (start, at) == (0.0, 1e-3) and fabrics.changes == fabrics.states[1:]
    link = first.link("n1.nic0", "leaf1")
    assert later.capacity[link] == first.capacity[link] * 0.1
    gpus = fabrics.gpus[:16]
    assert low0(Collective.ALL_REDUCE, gpus, 1e6).key[1] == 0
    assert low1(Collective.ALL_REDUCE, gpus, 1e6).key[1] == 1
    healthy = fabrics.healthy
    assert healthy is fabrics.healthy and healthy.epoch == -1
    assert healthy.fabric.capacity[healthy.fabric.link("n1.nic0", "leaf1")] == \
        first.capacity[link]


def test_without_faults_the_healthy_lowering_is_the_runs():
    fabrics = from_dict(scenario()).fabric_states()
    assert fabrics.changes == [] and fabrics.healthy is fabrics.lowering


def test_the_network_settings_reach_every_user():
    """``network.algorithm`` and ``network.step_model`` set the run's lowering and
    the layout estimate's tuner alike (the estimate once ignored the step model)."""
    raw = scenario()
    raw["network"] = {"algorithm": "ring", "step_model": "lockstep"}
    s = from_dict(raw)
    for tuner in (s.fabric_states().lowering, Estimator(s).tuner):
        assert (tuner.algorithm, tuner.protocol, tuner.lockstep) == (Algorithm.RING, None, True)


def test_only_the_states_module_builds_fabrics_and_lowerings():
    """No other module of the simulator, the benchmarks or the scripts constructs
    a ``Fabric`` or a ``Collectives`` (the fabric's own ``after`` aside)."""
    allowed = {"simulator/collectives/states.py", "simulator/network/fabric.py"}
    found = []
    for folder in ("simulator", "benchmarks", "scripts"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name in allowed:
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Call) and getattr(node.func, "id", None) in (
                        "Fabric", "Collectives"):
                    found.append(f"{name}:{node.lineno}")
    assert found == []
