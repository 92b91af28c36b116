"""The layering of docs/ARCHITECTURE.md, checked on the import graph.

Every ``import`` in the project's packages (inside functions too) must point
to the same package or to a lower layer; ``topologies`` and ``workloads``
never import each other or SimPy; the engine never imports either of them;
no module reaches itself through imports, inside a package too.
"""

import ast
from pathlib import Path

import pytest

from tests.conftest import ROOT

LAYERS = {  # package -> layer; a module may import only lower layers or its own package
    "simulator.base": 0,
    "topologies": 1, "workloads": 1,
    "simulator.network": 2,
    "simulator.collectives": 3, "simulator.compute": 3,
    "simulator.engine": 4,
    "simulator.analysis": 5,
    "simulator.outputs": 6,
    "simulator.config": 7,
    "simulator.runner": 8,
    "simulator.experiments": 9,
    "simulator.cli": 10,
    "simulator": 11,  # the package root: the lazy simulator.run and __main__
}
FORBIDDEN = {  # on top of the layering
    "topologies": ("workloads", "simpy"),
    "workloads": ("topologies", "simpy"),
    "simulator.base": ("simpy",),
    "simulator.engine": ("topologies", "workloads"),
}


def package_of(module: str) -> str:
    parts = module.split(".")
    for n in (2, 1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return ""  # not ours: the standard library or a dependency


def imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def modules() -> list[tuple[str, Path]]:
    out = []
    for top in ("simulator", "topologies", "workloads"):
        for path in sorted((ROOT / top).rglob("*.py")):
            dotted = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            out.append((dotted.removesuffix(".__init__"), path))
    return out


def violations(module: str, path: Path) -> list[str]:
    own = package_of(module)
    bad = []
    for line, target in imports(path):
        theirs = package_of(target)
        where = f"{path.relative_to(ROOT)}:{line} imports {target}"
        if theirs and theirs != own and LAYERS[theirs] >= LAYERS[own] and own != "simulator":
            bad.append(f"{where} (layer {LAYERS[theirs]} from layer {LAYERS[own]})")
        if any(target == f or target.startswith(f + ".") for f in FORBIDDEN.get(own, ())):
            bad.append(f"{where} (forbidden for {own})")
    return bad


def test_every_module_belongs_to_a_layer():
    assert [m for m, _ in modules() if not package_of(m)] == []


def test_no_import_points_upward():
    bad = [v for module, path in modules() for v in violations(module, path)]
    assert bad == []


@pytest.mark.parametrize("source, module, expected", [
    ("from simulator.outputs.gantt import OKABE_ITO\n", "simulator.analysis.comms", 1),
    ("def f():\n    from simulator.cli import main\n", "simulator.engine.core", 1),
    ("from simulator.base.ir import Op\n", "simulator.engine.core", 0),
    ("import topologies\n", "simulator.engine.core", 1),
    ("from workloads.models import MODELS\n", "topologies.fabric", 2),
])
def test_the_check_finds_upward_and_forbidden_imports(tmp_path, source, module, expected):
    path = ROOT / "tests" / "_probe.py"
    try:
        path.write_text(source)
        assert len(violations(module, path)) == expected
    finally:
        path.unlink()


def module_graph(found: list[tuple[str, Path]]) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (inside functions too; ``from a.b
    import c`` is a.b.c where that is a module, else a.b)."""
    names = {module for module, _ in found}
    graph: dict[str, set[str]] = {}
    for module, path in found:
        targets = set()
        for _, target in imports(path):
            while target and target not in names:
                target = target.rpartition(".")[0]
            if target and target != module:
                targets.add(target)
        graph[module] = targets
    return graph


def loops(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import loops: strongly connected sets of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                member = stack.pop()
                part.append(member)
                if member == node:
                    break
            if len(part) > 1:
                out.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return out


def test_no_import_loops_even_inside_a_package():
    """No module reaches itself through imports, function-level ones included
    (a loop hidden in a function-level import still ties the modules together)."""
    assert loops(module_graph(modules())) == []


def test_the_loop_check_finds_a_loop_through_a_function_level_import():
    graph = {"a.model": {"a.table"}, "a.table": {"a.fit"}, "a.fit": {"a.model"}, "a.x": set()}
    assert loops(graph) == [["a.fit", "a.model", "a.table"]]
    assert loops({"a": {"b"}, "b": set()}) == []


def unnamed_modules(init: Path) -> list[str]:
    """The modules and subpackages of the package at ``init`` that its docstring
    does not name (as ``name``)."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    here = init.parent
    names = [p.stem for p in here.glob("*.py") if p.stem != "__init__"]
    names += [p.name for p in here.iterdir() if (p / "__init__.py").exists()]
    return sorted(name for name in names if f"``{name}``" not in doc)


def test_every_package_docstring_names_its_modules():
    """Each package's ``__init__`` docstring says what it owns, module by module
    (docs/ARCHITECTURE.md): a module added without a word there fails."""
    missing = {str(init.parent.relative_to(ROOT)): unnamed_modules(init)
               for top in ("simulator", "topologies", "workloads")
               for init in sorted((ROOT / top).rglob("__init__.py"))}
    assert {package: names for package, names in missing.items() if names} == {}


def test_the_docstring_check_finds_an_unnamed_module(tmp_path):
    (tmp_path / "__init__.py").write_text('"""Holds ``a``."""\n')
    (tmp_path / "a.py").write_text("")
    (tmp_path / "b.py").write_text("")
    assert unnamed_modules(tmp_path / "__init__.py") == ["b"]


def test_a_new_fabric_kind_is_one_module_and_one_registry_line(monkeypatch, small):
    """ARCHITECTURE.md's first row, checked: a ``NetworkSpec`` subclass put in the
    ``NETWORKS`` registry and nowhere else is a scenario's ``cluster.fabric.type``,
    its own settings read and checked from its fields, and it runs end to end."""
    from dataclasses import dataclass
    from types import MappingProxyType

    import simulator.config.cluster as cluster_config
    import topologies.builder as builder
    import topologies.networks as networks
    from simulator import run
    from simulator.base.fields import ScenarioError, integer, setting
    from topologies.links import link, switch
    from topologies.networks.base import NetworkSpec

    @dataclass(frozen=True)
    class Star(NetworkSpec):
        """Every NIC on one switch (a toy kind: the test's module)."""

        name = "star"
        hub_level: int = setting(integer(1), 1)

        def build(self, graph, nics, wire) -> None:
            hub = switch(graph, "hub", self.hub_level)
            for _, _, nic in nics:
                link(graph, nic, hub, wire, "network")

    registry = MappingProxyType({**networks.NETWORKS, Star.name: Star})  # the one line
    for module in (networks, cluster_config, builder):  # (each holds the same registry)
        monkeypatch.setattr(module, "NETWORKS", registry)
    small["cluster"]["fabric"] = {"type": "star", "hub_level": 2}
    summary = run(small).summary
    assert summary["gpus"] == 16 and summary["iteration_time_s"] > 0
    small["cluster"]["fabric"] = {"type": "star", "hub_level": 0}
    with pytest.raises(ScenarioError, match=r"^cluster.fabric.hub_level: 0"):
        run(small)


def test_a_runs_steps_are_short_functions():
    """Issue 42's bar for ``simulator/runner``: one run reads as its steps (setup,
    method, loops, result), no function of 40 lines or more (docstring included)."""
    long = []
    for path in sorted((ROOT / "simulator" / "runner").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                    node.end_lineno - node.lineno + 1 >= 40:
                long.append(f"{path.name}:{node.name}")
    assert long == []


def _protected_uses(path: Path) -> tuple[set[str], set[str]]:
    """(protected names a module's classes use on ``self`` or ``super()``, those it
    defines: assigned on ``self`` or as methods)."""
    used, own = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and \
                not node.attr.startswith("__"):
            value = node.value
            if (isinstance(value, ast.Name) and value.id == "self") or (
                    isinstance(value, ast.Call) and getattr(value.func, "id", "") == "super"):
                used.add(node.attr)
                if isinstance(node.ctx, ast.Store):
                    own.add(node.attr)
        if isinstance(node, ast.FunctionDef) and node.name.startswith("_"):
            own.add(node.name)
    return used, own


def test_plug_ins_use_the_cores_published_api_and_no_other_plug_ins_internals():
    """Issue 42, item 3: a plug-in overrides the core's ``HOOKS`` and uses its
    ``PLUGIN_API``, nothing else of the core's protected state; what one plug-in
    offers another is public (no plug-in reaches another's protected names)."""
    from simulator.engine import assemble, core

    _, core_own = _protected_uses(ROOT / "simulator" / "engine" / "core.py")
    assert core_own >= core.HOOKS | core.PLUGIN_API
    for name, plugin in assemble.PLUGINS.items():
        path = ROOT / "simulator" / "engine" / f"{plugin.__module__.rsplit('.', 1)[1]}.py"
        used, own = _protected_uses(path)
        foreign = used - own
        # (another plug-in's protected name would be foreign and not the core's)
        assert foreign <= core.PLUGIN_API | core.HOOKS, (name, foreign - core.PLUGIN_API)
        assert (own & core_own) - {"__init__"} <= core.HOOKS | core.PLUGIN_API, name


def test_a_run_walks_the_runners_modules_in_order():
    """Issue 42's walk: a scenario goes through the runner's modules in the order
    the package docstring gives, each entered first in that order: the set of
    jobs, the setup, the method, the loops, the slow-down's fixed point, the
    result (their helpers are called from the step that needs them)."""
    import sys

    from simulator.config.scenario import load
    from simulator.runner.simulate import run
    from tests.conftest import QUICKSTART

    scenario = load(QUICKSTART)
    first: list[str] = []

    def entered(frame, event, arg):
        name = frame.f_globals.get("__name__", "")
        if event == "call" and name.startswith("simulator.runner.") and name not in first:
            first.append(name)
    sys.setprofile(entered)
    try:
        run(scenario)
    finally:
        sys.setprofile(None)
    assert [n.rsplit(".", 1)[1] for n in first] == [
        "simulate", "jobs", "setup", "symmetry", "loops", "contention", "result",
        "host_waits"]  # (the result's spans' launch waits)
