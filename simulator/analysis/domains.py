"""Which parallel groups leave their NVLink domain.

Tensor, context and expert parallel groups are laid out to stay inside one
NVLink domain (a server, or a rack-scale domain such as an NVL72 rack): their
calls are on the critical path every layer. A group whose members sit in
several domains runs its calls over the scale-out network instead (NCCL's
rings and trees cross the NICs), which a user should be told rather than
find in the timeline.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

KINDS = ("tp", "cp", "ep", "etp")  # groups meant to stay inside a domain


def crossing(groups: Mapping[str, Sequence[Sequence[int]]], domain_of_rank: Sequence[int],
             kinds: Sequence[str] = KINDS) -> dict[str, list[int]]:
    """``{kind: [groups that span several domains, groups]}`` for each of ``kinds``
    with at least one group of two or more ranks that does.

    >>> crossing({"tp": ((0, 1), (2, 3)), "cp": ((0, 2), (1, 3))}, [0, 0, 1, 1])
    {'cp': [2, 2]}
    """
    out = {}
    for kind in kinds:
        members = [g for g in groups.get(kind, ()) if len(g) > 1]
        across = sum(len({domain_of_rank[r] for r in g}) > 1 for g in members)
        if across:
            out[kind] = [across, len(members)]
    return out


def describe(domain_gpus: int, across: Mapping[str, Sequence[int]], spans_servers: bool) -> str:
    """One line for the run's summary.

    >>> describe(72, {"tp": [2, 9]}, True)
    'domains of 72 GPUs; tp: 2 of 9 groups cross domains (their calls take the network)'
    """
    where = (f"domains of {domain_gpus} GPUs" if spans_servers
             else f"one server's {domain_gpus} GPUs")
    if not across:
        return f"{where}; every tp, cp and ep group inside one"
    parts = "; ".join(f"{kind}: {n} of {total} groups cross domains" for kind, (n, total)
                      in across.items())
    return f"{where}; {parts} (their calls take the network)"


def summary_keys(groups: Mapping[str, Sequence[Sequence[int]]], domain_of_rank: Sequence[int],
                 fabric: Mapping) -> dict:
    """The summary's ``nvlink_domains`` line and ``groups_across_domains``, where
    the NVLink domain spans servers or some group leaves it (``fabric``: the
    graph's attributes, ``nvlink_domain`` and ``gpus_per_node``); else none."""
    size = int(fabric.get("nvlink_domain") or 0)
    spans_servers = size > int(fabric.get("gpus_per_node") or size)
    across = crossing(groups, domain_of_rank)
    if not (spans_servers or across):
        return {}
    return {"nvlink_domains": describe(size, across, spans_servers),
            "groups_across_domains": across}
