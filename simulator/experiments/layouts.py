"""The layouts a search considers: a search space (values per dimension) and
every combination of it that can run the scenario's model on its cluster.

A ``Layout`` is a size for each parallel dimension (tp, pp, cp, ep, etp and
the derived dp: ``workloads.program.DIMENSIONS``, each declared once in its
strategy's module with its default values and quick rule) and a value for each
knob (micro-batch, recompute, ZeRO stage, pipeline schedule and virtual
stages: ``KNOBS``); it becomes a scenario through its overrides
(``parallelism.tp`` ...). ``candidates`` keeps the combinations that divide
evenly (GPUs into tp x pp x cp x dp, the global batch into dp x micro-batch,
each dimension's rule: the heads by tp inside an NVLink domain, a server's or
a rack's, the layers by pp, ep x etp dividing a stage's ranks; the layers by
virtual stages and the micro-batches by pp when interleaved), then asks the
scenario loader, which checks every rule the simulator has, and lists what it
refuses with its reason (selective recompute too, where fused attention makes
it the same run as none). Sequence parallelism is on wherever tp > 1, as
Megatron-LM recommends with tensor parallelism.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from simulator.base.fields import ScenarioError, fail
from simulator.config.overrides import set_key
from simulator.config.scenario import from_dict, machine_from, model_from, training_from
from workloads import program
from workloads.strategies.dimension import Bounds, Dimension


class SearchError(ScenarioError):
    """A search that cannot start (an empty or impossible space)."""


RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "interleaved", "gpipe")
CHUNKS = [2, 3, 4, 6, 8]  # virtual stages the default space tries with interleaved 1F1B


@dataclass(frozen=True)
class Knob:
    """A training setting the search varies beside the parallel sizes: its scenario
    key, its flag's value type and help, the values it may take (None: positive
    integers), a layout's value where it is not given, a space's values where it
    gives none, and the default space's values (from the global batch)."""

    name: str
    key: str
    kind: type
    help: str
    allowed: tuple | None
    unset: Any  # a layout's value where it is not given
    missing: list | None  # a space's values where it gives none (None: it must)
    default: Callable[[int], list]


KNOBS = (  # in the order a layout's overrides set them (a sweep case's id hashes them)
    Knob("zero", "parallelism.zero", int, "ZeRO stages, e.g. 0,1,3", (0, 1, 2, 3), 0, [0],
         lambda batch: [0, 1, 3]),
    Knob("schedule", "parallelism.schedule", str, "1f1b,interleaved,gpipe", SCHEDULES, "1f1b",
         ["1f1b"], lambda batch: ["1f1b", "interleaved"]),
    Knob("virtual_stages", "parallelism.virtual_stages", int,
         "chunks per stage for interleaved (default 2,3,4,6,8)", None, 1, CHUNKS,
         lambda batch: list(CHUNKS)),
    Knob("mbs", "training.micro_batch", int, "micro-batch sizes, e.g. 1,2,4", None, 1, None,
         lambda batch: [b for b in (1, 2, 4, 8) if b <= batch]),
    Knob("recompute", "training.recompute", str, "none,selective,full", RECOMPUTE, "none",
         ["none"], lambda batch: list(RECOMPUTE)),
)


UNSET = {k.name: k.unset for k in KNOBS}  # a layout's knobs where it gives none


def sizes() -> tuple[Dimension, ...]:
    """The parallel dimensions in a layout's order: those always shown (tp, pp),
    the other searched ones (cp, ep, etp), then the derived one (dp)."""
    return _ordered(program.DIMENSIONS)


def columns() -> tuple[str, ...]:
    """A layout's values' names: the parallel sizes, then the knobs."""
    return _columns(program.DIMENSIONS)


@cache
def _ordered(dims: tuple[Dimension, ...]) -> tuple[Dimension, ...]:
    return (*(d for d in dims if d.shown), *(d for d in dims if not d.shown and d.values),
            *(d for d in dims if d.values is None))


@cache
def _columns(dims: tuple[Dimension, ...]) -> tuple[str, ...]:
    """(the registry as it is: a layout reads its names on every attribute)"""
    return (*(d.name for d in _ordered(dims)), *(k.name for k in KNOBS))


def flags() -> dict[str, tuple[str, type, str]]:
    """``clustersim search``'s flags: {dimension: (flag, value type, help)}."""
    out = {d.name: (d.flag, int, d.help) for d in sizes() if d.values}
    return out | {k.name: (f"--{k.name.replace('_', '-')}", k.kind, k.help) for k in KNOBS}


class Layout:
    """One way to split the training job over the GPUs: a value for each of
    ``columns()`` (given by position or name; a size left out is 1, a knob its
    value where a space gives none). Compares, hashes and sorts by its values."""

    __slots__ = ("values",)

    def __init__(self, *args: Any, **named: Any) -> None:
        names = columns()
        given = dict(zip(names, args, strict=False)) | named
        if len(args) > len(names) or set(given) - set(names):
            raise TypeError(f"a layout takes {', '.join(names)}")
        object.__setattr__(self, "values", tuple(given.get(n, UNSET.get(n, 1)) for n in names))

    def __getattr__(self, name: str) -> Any:
        names = columns()
        if name not in names:
            raise AttributeError(name)
        return self.values[names.index(name)]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("a layout is frozen")

    def __reduce__(self):
        return (_layout, (dict(zip(columns(), self.values, strict=True)),))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Layout) and self.values == other.values

    def __lt__(self, other: Layout) -> bool:
        return self.values < other.values

    def __hash__(self) -> int:
        return hash(self.values)

    def __repr__(self) -> str:
        return f"Layout({self.label})"

    def as_dict(self) -> dict[str, Any]:
        return dict(zip(columns(), self.values, strict=True))

    @property
    def label(self) -> str:
        """``tp8 pp8 dp16 mbs1 full 1f1b`` (with ``cp``, ``ep``, ``v`` and ``zero`` when set)."""
        parts = [f"{d.name}{getattr(self, d.name)}" for d in sizes()
                 if d.shown or d.values is None or getattr(self, d.name) > 1]
        parts += [f"mbs{self.mbs}", self.recompute, self.schedule]
        parts += [f"v{self.virtual_stages}"] if self.virtual_stages > 1 else []
        return " ".join(parts + ([f"zero{self.zero}"] if self.zero else []))

    def overrides(self) -> tuple[tuple[str, Any], ...]:
        """The scenario keys this layout sets: the sizes that take GPUs, sequence
        parallelism with tp, the knobs, then the carved sizes above 1."""
        dims = sizes()
        return (*((f"parallelism.{d.name}", getattr(self, d.name)) for d in dims
                  if not d.carved),
                ("parallelism.sequence_parallel", self.tp > 1),
                *((k.key, getattr(self, k.name)) for k in KNOBS),
                *((f"parallelism.{d.name}", getattr(self, d.name)) for d in dims
                  if d.carved and getattr(self, d.name) > 1))

    def scenario(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """``base`` (a scenario dict) with this layout."""
        raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in base.items()}
        raw.pop("parallelism", None)
        raw["parallelism"] = {k: v for k, v in (base.get("parallelism") or {}).items()
                              if k not in layout_keys()}
        for key, value in self.overrides():
            set_key(raw, key, value, source=key)
        return raw


def _layout(values: dict[str, Any]) -> Layout:
    return Layout(**values)


def layout_keys() -> tuple[str, ...]:
    """The parallelism keys a layout sets (and ``fsdp``, which a ZeRO stage replaces)."""
    return (*(d.name for d in sizes()), "fsdp")


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
    """Every value worth trying: each parallel dimension's own default values
    (tp a power of two within an NVLink domain dividing the heads, pp a divisor
    of the layers, with ``experts`` ep a power of two dividing them within the
    domain, at least a server's 8 GPUs; cp and etp 1), micro-batches 1 to 8,
    every recompute mode, ZeRO 0, 1 and 3, 1F1B and interleaved 1F1B with 2 to 8
    chunks."""
    bounds = Bounds(world, layers, heads, domain, experts)
    return {**{d.name: d.values(bounds) for d in sizes() if d.values},
            **{k.name: k.default(global_batch) for k in KNOBS}}


def check_space(space: Mapping[str, list], parallel: Mapping[str, Any] | None = None
                ) -> dict[str, list]:
    """The space with every dimension present, each value checked; a parallel
    dimension the space leaves out keeps the base scenario's ``parallel`` value
    (1 where it gives none), tp, pp and mbs must be given."""
    names = columns()
    unknown = set(space) - set(names)
    if unknown:
        raise fail("search space", sorted(unknown)[0], "is not a dimension; allowed: "
                   + ", ".join(n for n in names if n != "dp"))
    out = {k: list(v) for k, v in space.items()}
    for dim in sizes():
        if dim.values and dim.name not in out:
            if dim.shown:
                raise fail("search space", dim.name, "is missing: give its values")
            out[dim.name] = [(parallel or {}).get(dim.name, 1)]
    for knob in KNOBS:
        if knob.name not in out:
            if knob.missing is None:
                raise fail("search space", knob.name, "is missing: give its values")
            out[knob.name] = list(knob.missing)
    allowed = {k.name: k.allowed for k in KNOBS if k.allowed}
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
    """Every combination of the space that divides evenly: the GPUs into the
    dimensions that take them (dp the rest), each dimension's own rule (tp inside
    the domain and dividing the heads, pp dividing the layers, ep x etp dividing
    a stage's tp x cp x dp ranks), the global batch into dp x micro-batch, and
    interleaving's chunks."""
    bounds = Bounds(world, layers, heads, domain)
    dims = sizes()
    searched = [d.name for d in dims if d.values]
    spread = [d.name for d in dims if d.values and not d.carved]
    derived = next(d.name for d in dims if d.values is None)
    knobs = [k.name for k in KNOBS if k.name != "virtual_stages"]
    out = []
    for combo in itertools.product(*(space[n] for n in (*searched, *knobs))):
        values = dict(zip((*searched, *knobs), combo, strict=True))
        taken = math.prod(values[n] for n in spread)
        if world % taken:
            continue
        values[derived] = world // taken
        if not all(d.fits(values, bounds) for d in dims) or \
                global_batch % (values[derived] * values["mbs"]):
            continue
        out += [Layout(**values, virtual_stages=v)
                for v in _chunks(space, values, layers, global_batch // (values[derived]
                                                                         * values["mbs"]))]
    return sorted(set(out))


def _chunks(space: Mapping[str, list], values: Mapping[str, Any], layers: int,
            micro: int) -> list[int]:
    """The virtual stages a combination takes: the space's that divide a stage's
    layers with interleaving (the micro-batches a multiple of pp), else 1 (none
    for GPipe without a pipeline: the same run as 1F1B)."""
    pp = values["pp"]
    if values["schedule"] == "interleaved":
        return [v for v in space["virtual_stages"] if pp > 1 and micro % pp == 0
                and (layers // pp) % v == 0 and v > 1]
    return [] if pp == 1 and values["schedule"] == "gpipe" else [1]


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

