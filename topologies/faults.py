"""Degraded and failed fabric parts (``cluster.fabric.faults``), applied to a
built fabric graph before the run.

Each fault names one part, as the graph names it (``clustersim`` prints the
names in its errors; ``n3.nic2``, ``leaf0``, ``spine4``) or in words
(``node 3 nic 2``, ``spine-4``), and what is wrong with it:

- ``{link: [a, b], bandwidth: 0.5}``: a link (both directions) at half its rate
  (a flapping or mis-negotiated port); ``{link: [a, b], down: true}``: gone;
- ``{nic: "node 3 nic 2", down: true}`` (or ``bandwidth``): a NIC. Its GPUs
  move to their server's nearest surviving NIC (by index), as a GPU's traffic
  takes the closest NIC left on its PCIe tree, and NCCL's channels count the
  NICs left; a server whose every NIC
  is down cannot reach its peers, which is an error naming its GPUs;
- ``{switch: spine4, down: true}``: a switch and all its links;
- any of them with ``at: "20 ms"``: from that time into the iteration on
  (``at`` 0, the default: from the start). ``epochs`` gives the fabric after
  each such time, every fault started by then applied to the healthy fabric;
  the engine changes the links' capacities then, and flows on a part that
  failed move at once to routes over the survivors (an adaptive or
  self-healing fabric; a real subnet manager may take longer to reroute).

Routing already spreads over the equal-cost paths that remain (D-mod-K or the
seeded hash over the survivors, ``topologies.routing``). A NIC cut off from the
fabric's main part (its leaf lost every uplink) counts as failed; a server
left with none is an error naming its GPUs. A fault lasts to the iteration's
end once it starts.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import networkx as nx

from simulator.base.fields import ScenarioError, fail
from simulator.base.units import UnitError, parse_time
from topologies.links import tray_of

KINDS = ("link", "nic", "switch")  # (also the order they are applied in: a link before
# the part it ends at is removed)
MIN_SHARE = 0.001  # a link at under 0.1 % of its rate carries nothing useful: it is down
WORDS_NIC = re.compile(r"^\s*node\s+(\d+)\s+nic\s+(\d+)\s*$")


@dataclass(frozen=True)
class Fault:
    """One degraded or failed part: ``names`` (two for a link), and the share of
    its bandwidth left (0: down)."""

    kind: str
    names: tuple[str, ...]
    bandwidth: float
    at: float = 0.0  # seconds into the iteration it starts
    index: int = -1  # its place in the scenario's list (for errors)

    def describe(self) -> str:
        what = " - ".join(self.names)
        when = f" from {self.at * 1e3:g} ms" if self.at > 0 else ""
        return f"{self.kind} {what} " + ("down" if self.bandwidth == 0 else
                                          f"at {self.bandwidth:.0%} of its bandwidth") + when


def parse(path: str, raw: object) -> tuple[Fault, ...]:
    """Check a ``faults`` list: each entry one of ``link``, ``nic``, ``switch`` and
    either ``down: true`` or ``bandwidth`` (a share in (0, 1])."""
    if not isinstance(raw, list):
        raise fail(path, raw, "must be a list of faults, such as [{switch: spine4, down: "
                              "true}, {link: [n0.nic0, leaf0], bandwidth: 0.5}]")
    return tuple(_fault(f"{path}[{i}]", entry) for i, entry in enumerate(raw))


def _fault(path: str, entry: object) -> Fault:
    if not isinstance(entry, dict):
        raise fail(path, entry, "must be a mapping such as {nic: n3.nic2, down: true}")
    kinds = [k for k in KINDS if k in entry]
    extra = sorted(set(entry) - {*KINDS, "down", "bandwidth", "at"})
    if len(kinds) != 1 or extra:
        raise fail(path, entry, "must name one part (link, nic or switch), say down: true "
                                "or bandwidth: a share in (0, 1], and may say at: a time")
    kind = kinds[0]
    down, share = entry.get("down", False), entry.get("bandwidth")
    if not isinstance(down, bool) or (down and share is not None) or (not down and share is None):
        raise fail(path, entry, "must give either down: true or bandwidth (not both)")
    if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                              or not MIN_SHARE <= share <= 1):
        raise fail(f"{path}.bandwidth", share, f"must be a share of the bandwidth from "
                                               f"{MIN_SHARE:g} to 1 (a part slower than that "
                                               "is down: say down: true)")
    target = entry[kind]
    if kind == "link":
        names = tuple(target) if isinstance(target, list) else tuple(
            p.strip() for p in str(target).split(" - "))
        if len(names) != 2:
            raise fail(f"{path}.link", target, "must name its two ends: [a, b] or \"a - b\"")
    else:
        names = (str(target),)
    return Fault(kind, tuple(str(n) for n in names), 0.0 if down else float(share),
                 _start(f"{path}.at", entry.get("at", 0.0)), int(path.rsplit("[", 1)[1][:-1]))


def _start(path: str, raw: object) -> float:
    """When a fault starts: a time such as ``"20 ms"`` (0: from the start)."""
    if isinstance(raw, bool):
        raise fail(path, raw, "must be a time from the iteration's start, such as \"20 ms\"")
    if raw == 0:
        return 0.0
    try:
        at = parse_time(raw)
    except UnitError as error:
        raise ScenarioError(f"{path}: {error}") from None
    if at < 0:
        raise fail(path, raw, "must be a time from the iteration's start (>= 0)")
    return at


def _node_name(graph: nx.DiGraph, path: str, kind: str, name: str) -> str:
    """The graph's name of a part written as the graph names it or in words."""
    if name in graph:
        return name
    words = WORDS_NIC.match(name)
    candidates = [f"n{words.group(1)}.nic{words.group(2)}"] if words else []
    candidates.append(re.sub(r"[\s\-_]", "", name))
    for candidate in candidates:
        if candidate in graph:
            return candidate
    same = sorted(n for n, d in graph.nodes(data=True)
                  if d.get("kind") == kind or (kind == "link"))[:6]
    raise ScenarioError(f"{path}: {name!r} is not a part of this fabric (its {kind}s are "
                        f"named like {', '.join(same)})")


def apply(graph: nx.DiGraph, faults: Sequence[Fault], path: str = "cluster.fabric.faults"
          ) -> nx.DiGraph:
    """A copy of ``graph`` with ``faults`` applied (``graph`` itself when none).

    A part named by several faults is in the worst state of those started (a
    link at half its rate from the start and down from 20 ms; a fault lasts to
    the iteration's end, so nothing recovers); two faults on one part that start
    together are an error. Links are changed before NICs and switches are
    removed, so a fault on a link of a failed part is no error."""
    if not faults:
        return graph
    out = graph.copy()
    named: list[Fault] = []  # every fault, its parts as the graph names them
    first: dict[tuple, int] = {}  # (part, start) -> the fault that named it
    worst: dict[tuple, Fault] = {}  # part -> its worst fault started
    for position, fault in enumerate(faults):
        i = fault.index if fault.index >= 0 else position  # as the scenario counts
        where = f"{path}[{i}]"
        names = tuple(_node_name(out, where, fault.kind, n) for n in fault.names)
        _check_kind(out, where, fault.kind, names)
        part = (fault.kind, frozenset(names))
        if (part, fault.at) in first:
            raise ScenarioError(f"{where}: names the {fault.kind} {' - '.join(names)} as "
                                f"{path}[{first[part, fault.at]}] does, from the same time; "
                                "give each part once (or at other times: the worst holds)")
        first[part, fault.at] = i
        named.append(Fault(fault.kind, names, fault.bandwidth, fault.at, i))
        if part not in worst or fault.bandwidth < worst[part].bandwidth:
            worst[part] = named[-1]
    applied = list(worst.values())
    for fault in sorted(applied, key=lambda f: KINDS.index(f.kind)):
        _break(out, fault)
    _move_gpus_off_lost_nics(out, graph)
    out.graph["faults"] = [f.describe() for f in named]
    return out


def _check_kind(graph: nx.DiGraph, where: str, kind: str, names: tuple[str, ...]) -> None:
    """The part exists as the kind the fault says (a link between its two ends)."""
    if kind == "link":
        a, b = names
        if not graph.has_edge(a, b):
            raise ScenarioError(f"{where}: there is no link between {a} and {b}")
    elif graph.nodes[names[0]].get("kind") != kind:
        raise ScenarioError(f"{where}: {names[0]} is a {graph.nodes[names[0]].get('kind')}, "
                            f"not a {kind}")


def _break(graph: nx.DiGraph, fault: Fault) -> None:
    """Apply one fault to ``graph`` (a part already removed with its links is
    left as it is)."""
    if fault.kind == "link":
        a, b = fault.names
        edges = [e for e in ((a, b), (b, a)) if graph.has_edge(*e)]
    elif fault.names[0] in graph:
        edges = [*graph.in_edges(fault.names[0]), *graph.out_edges(fault.names[0])]
    else:
        return
    if fault.bandwidth == 0 and fault.kind != "link":
        graph.remove_node(fault.names[0])
    elif fault.bandwidth == 0:
        graph.remove_edges_from(edges)
    else:
        for u, v in edges:
            graph.edges[u, v]["bandwidth"] *= fault.bandwidth


def from_start(graph: nx.DiGraph, faults: Sequence[Fault],
               later: Sequence[tuple[float, nx.DiGraph]] = ()) -> nx.DiGraph:
    """``graph`` with the faults present from the iteration's start applied; with
    faults that start later (``later``: their ``epochs``) the summary lists
    every fault, as the last epoch's graph names them."""
    out = apply(graph, [f for f in faults if f.at == 0])
    if later:
        out = out.copy() if out is graph else out
        out.graph["faults"] = later[-1][1].graph["faults"]
    return out


def epochs(graph: nx.DiGraph, faults: Sequence[Fault],
           path: str = "cluster.fabric.faults") -> tuple[tuple[float, nx.DiGraph], ...]:
    """The fabric after each time a fault starts during the iteration: (time, the
    healthy ``graph`` with every fault started by then applied), by time."""
    times = sorted({f.at for f in faults if f.at > 0})
    return tuple((t, apply(graph, [f for f in faults if f.at <= t], path)) for t in times)


def _usable_nics(graph: nx.DiGraph) -> dict[int, list[str]]:
    """Each server's NICs that still reach the fabric's main part (the connected
    switches and NICs holding the most NICs; on a tie, the one with server 0's)."""
    parts_of = [n for n, d in graph.nodes(data=True) if d.get("kind") in ("switch", "nic")]
    nics = {n for n, d in graph.nodes(data=True) if d.get("kind") == "nic"}
    parts = [p for p in nx.weakly_connected_components(graph.subgraph(parts_of))
             if len(p) > 1 and p & nics]
    if not parts:
        return {}
    main = max(parts, key=lambda p: (len(p & nics), -min(
        tray_of(graph.nodes[n]) for n in p & nics)))
    out: dict[int, list[str]] = {}
    for name in sorted(main & nics):
        out.setdefault(tray_of(graph.nodes[name]), []).append(name)
    return out


def _move_gpus_off_lost_nics(graph: nx.DiGraph, before: nx.DiGraph) -> None:
    """GPUs whose NIC is gone (cut from every switch, or their own link to it
    failed) take their server's nearest surviving NIC (by index; the lower on a
    tie), as a GPU's traffic takes the closest NIC on its PCIe tree; over a link
    like the one they had to their own NIC (in the fabric ``before`` the faults).

    Nearest, not least loaded: a GPU's NIC then depends only on which of its own
    server's NICs failed, so another fault elsewhere never moves it."""
    usable = _usable_nics(graph)
    gpus = [(n, d) for n, d in graph.nodes(data=True) if d.get("kind") == "gpu"]
    if len({int(d["node"]) for _, d in gpus}) < 2:
        return
    for name, data in sorted(gpus):
        nic, node = data["nic"], tray_of(data)
        if nic in usable.get(node, ()) and graph.has_edge(name, nic) and graph.has_edge(nic, name):
            continue
        index = int(before.nodes[nic].get("local", 0))
        left = sorted((n for n in usable.get(node, ()) if n != nic), key=lambda n: (
            abs(int(graph.nodes[n].get("local", 0)) - index), graph.nodes[n].get("local", 0), n))
        if not left:
            why = (f"its link to its NIC {nic} failed and server {node} has no other NIC"
                   if nic in usable.get(node, ()) else
                   f"every NIC of server {node} is down or cut off from the rest of the fabric")
            raise ScenarioError(f"cluster.fabric.faults: GPU {name} cannot reach its peers: "
                                f"{why}")
        if not before.has_edge(name, nic):
            raise ScenarioError(f"cluster.fabric.faults: GPU {name} has no link of its own to "
                                f"its NIC {nic} to move to another NIC")
        attrs = dict(before.edges[name, nic])
        if graph.has_edge(name, nic):
            graph.remove_edges_from([(name, nic), (nic, name)])
        data["nic"] = left[0]
        graph.add_edge(name, left[0], **attrs)
        graph.add_edge(left[0], name, **attrs)
