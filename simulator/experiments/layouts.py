"""The layouts a search considers: a search space (values per dimension) and
every combination of it that can run the scenario's model on its cluster.

A ``Layout`` is tensor, pipeline, context and data parallel sizes, micro-batch,
recompute, ZeRO stage, pipeline schedule and virtual stages; it becomes a
scenario through its overrides (``parallelism.tp`` ...). ``candidates`` keeps
the combinations that divide evenly (GPUs into tp x pp x cp x dp, the global
batch into dp x micro-batch, the heads by tp, the layers by pp and virtual
stages, the micro-batches by pp when interleaved; tensor parallelism inside an
NVLink domain, a server's or a rack's; ep dividing a stage's ranks), then asks
the scenario loader, which checks every rule the simulator has, and lists
what it refuses with its reason (selective recompute too, where fused
attention makes it the same run as none). Sequence parallelism
is on wherever tp > 1, as Megatron-LM recommends with tensor parallelism.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from simulator.base.fields import ScenarioError, fail
from simulator.config.overrides import set_key
from simulator.config.scenario import from_dict, machine_from, model_from, training_from


class SearchError(ScenarioError):
    """A search that cannot start (an empty or impossible space)."""


DIMENSIONS = ("tp", "pp", "cp", "mbs", "recompute", "zero", "schedule", "virtual_stages", "ep")
RECOMPUTE = ("none", "selective", "full")
POWERS = (1, 2, 4, 8, 16, 32, 64)  # tp and ep sizes the default space tries
LAYOUT_KEYS = ("tp", "pp", "cp", "dp", "ep", "fsdp")  # parallelism keys a layout sets
SCHEDULES = ("1f1b", "interleaved", "gpipe")


@dataclass(frozen=True, order=True)
class Layout:
    """One way to split the training job over the GPUs."""

    tp: int
    pp: int
    cp: int
    dp: int
    mbs: int
    recompute: str
    zero: int
    schedule: str
    virtual_stages: int
    ep: int = 1  # expert-parallel size (a model with experts)

    @property
    def label(self) -> str:
        """``tp8 pp8 dp16 mbs1 full 1f1b`` (with ``cp``, ``ep``, ``v`` and ``zero`` when set)."""
        parts = [f"tp{self.tp}", f"pp{self.pp}"] + ([f"cp{self.cp}"] if self.cp > 1 else [])
        parts += [f"ep{self.ep}"] if self.ep > 1 else []
        parts += [f"dp{self.dp}", f"mbs{self.mbs}", self.recompute, self.schedule]
        parts += [f"v{self.virtual_stages}"] if self.virtual_stages > 1 else []
        return " ".join(parts + ([f"zero{self.zero}"] if self.zero else []))

    def overrides(self) -> tuple[tuple[str, Any], ...]:
        """The scenario keys this layout sets."""
        return (("parallelism.tp", self.tp), ("parallelism.pp", self.pp),
                ("parallelism.cp", self.cp), ("parallelism.dp", self.dp),
                ("parallelism.sequence_parallel", self.tp > 1),
                ("parallelism.zero", self.zero), ("parallelism.schedule", self.schedule),
                ("parallelism.virtual_stages", self.virtual_stages),
                ("training.micro_batch", self.mbs), ("training.recompute", self.recompute),
                *((("parallelism.ep", self.ep),) if self.ep > 1 else ()))

    def scenario(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (a scenario dict) with this layout."""
        raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
        raw.pop("parallelism", None)
        raw["parallelism"] = {k: v for k, v in (base.get("parallelism") or {}).items()
                              if k not in LAYOUT_KEYS}
        for key, value in self.overrides():
            set_key(raw, key, value, source=key)
        return raw


def parse_values(text: str, option: str, kind: type = int, most: int | None = None) -> list:
    """``1,2,4``, ``1-16`` (every integer in the range) or names: a flag's values;
    a range is cut at ``most`` (what the scenario allows: the GPU count for a
    parallel size) before it is listed, so ``1-1000000000`` costs nothing.

    >>> parse_values("1,2, 8-10", "--pp")
    [1, 2, 8, 9, 10]
    >>> parse_values("1-1000000000", "--pp", most=4)
    [1, 2, 3, 4]
    >>> parse_values("none,full", "--recompute", str)
    ['none', 'full']
    """
    values: dict = {}
    for part in (p.strip() for p in str(text).split(",")):
        if not part:
            continue
        if kind is str:
            values[part] = None
            continue
        low, dash, high = part.partition("-")
        try:
            first, last = (int(low), int(high)) if dash else (int(part), int(part))
        except ValueError:
            raise fail(option, text, "must be integers (1,2,4) or ranges (1-16)") from None
        if dash and most is not None:
            last = min(last, max(most, first))
        if last - first > 10**6:
            raise fail(option, text, "lists more than a million values")
        values.update(dict.fromkeys(range(first, last + 1)))
    if not values:
        raise fail(option, text, "must list at least one value")
    return list(values)


def default_space(world: int, layers: int, heads: int, domain: int,
                  global_batch: int, experts: int = 0) -> dict[str, list]:
    """Every value worth trying: tp a power of two within an NVLink domain
    (``domain`` GPUs: a server, or a rack-scale domain) dividing the heads, pp a
    divisor of the layers, micro-batches 1 to 8, every recompute mode, ZeRO 0, 1
    and 3, 1F1B and interleaved 1F1B with 2 to 8 chunks; with ``experts``, ep a
    power of two dividing them within the domain (at least 8, a server's)."""
    tp = [t for t in POWERS if t <= domain and heads % t == 0 and t <= world]
    pp = [p for p in range(1, layers + 1) if layers % p == 0 and p <= world]
    mbs = [b for b in (1, 2, 4, 8) if b <= global_batch]
    ep = [e for e in POWERS if experts % e == 0 and e <= max(domain, 8) and e <= world]
    return {"tp": tp, "pp": pp, "cp": [1], "mbs": mbs, "recompute": list(RECOMPUTE),
            "zero": [0, 1, 3], "schedule": ["1f1b", "interleaved"],
            "virtual_stages": [2, 3, 4, 6, 8], "ep": ep if experts else [1]}


def check_space(space: Mapping[str, list], ep: object = 1) -> dict[str, list]:
    """The space with every dimension present, each value checked; ``ep`` is the
    base scenario's expert-parallel size, kept where the space gives none."""
    unknown = set(space) - set(DIMENSIONS)
    if unknown:
        raise fail("search space", sorted(unknown)[0], "is not a dimension; allowed: "
                   + ", ".join(DIMENSIONS))
    out = {"cp": [1], "virtual_stages": [2, 3, 4, 6, 8], "ep": [ep],
           **{k: list(v) for k, v in space.items()}}
    for name in ("tp", "pp", "mbs"):
        if name not in out:
            raise fail("search space", name, "is missing: give its values")
    out.setdefault("recompute", ["none"])
    out.setdefault("zero", [0])
    out.setdefault("schedule", ["1f1b"])
    allowed = {"recompute": RECOMPUTE, "schedule": SCHEDULES, "zero": (0, 1, 2, 3)}
    for name, values in out.items():
        for value in values:
            if name in allowed and value not in allowed[name]:
                raise fail(f"--{name.replace('_', '-')}", value, "is not one of: "
                           + ", ".join(map(str, allowed[name])))
            if name not in allowed and (not isinstance(value, int) or value < 1):
                raise fail(f"--{name.replace('_', '-')}", value, "must be a positive integer")
    return out


def combinations(space: Mapping[str, list], world: int, layers: int, heads: int,
                 domain: int, global_batch: int) -> list[Layout]:
    """Every combination of the space that divides evenly (the rules above; ep
    dividing a stage's tp x cp x dp ranks)."""
    out = []
    for tp, pp, cp, mbs, recompute, zero, schedule, ep in itertools.product(
            *(space[k] for k in (*DIMENSIONS[:7], "ep"))):
        if world % (tp * pp * cp) or tp > domain or heads % tp or layers % pp:
            continue
        dp = world // (tp * pp * cp)
        if global_batch % (dp * mbs) or (tp * cp * dp) % ep:
            continue
        micro = global_batch // (dp * mbs)
        chunks = [1]
        if schedule == "interleaved":
            chunks = [v for v in space["virtual_stages"] if pp > 1 and micro % pp == 0
                      and (layers // pp) % v == 0 and v > 1]
        elif pp == 1 and schedule == "gpipe":
            continue  # the same run as 1F1B without a pipeline
        out += [Layout(tp, pp, cp, dp, mbs, recompute, zero, schedule, v, ep) for v in chunks]
    return sorted(set(out))


def domain_of(machine) -> int:
    """GPUs per NVLink domain: the cluster's (a server's, or a rack-scale domain's),
    or a fabric file's GPUs per server."""
    if machine.graph is not None:
        return machine.gpus // max(1, machine.nodes)
    return machine.cluster.domain


def candidates(base: Mapping[str, Any], space: Mapping[str, list], base_dir=None
               ) -> tuple[list[Layout], dict[Layout, str]]:
    """(layouts the scenario loader accepts, {layout: why not} for the others)."""
    machine = machine_from(base.get("cluster"), base_dir)
    model = model_from(base.get("model"), base_dir)
    training = training_from(base.get("training"), machine.gpu)
    same = training.flash_attention and "none" in space["recompute"]
    good, refused = [], {}
    for layout in combinations(space, machine.gpus, model.layers, model.heads,
                               domain_of(machine), training.global_batch):
        if same and layout.recompute == "selective":
            refused[layout] = ("the same run as recompute none: fused attention already "
                               "recomputes the attention core and stores no scores")
            continue
        try:
            from_dict(layout.scenario(base), base_dir=base_dir)
        except ScenarioError as error:
            refused[layout] = str(error)
            continue
        good.append(layout)
    return good, refused

