"""A sweep's design: ``grid`` and ``zip`` axes from the command line or a sweep
file, expanded into cases (each a tuple of overrides on the base scenario)."""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from itertools import product
from pathlib import Path
from typing import Any

from simulator.base.user_files import yaml_value
from simulator.config.overrides import set_key, split_assignment
from simulator.config.scenario import ScenarioError


class SweepError(ScenarioError):
    """A sweep that cannot start (bad design, output of another sweep)."""


@dataclass(frozen=True)
class Case:
    """One scenario of a sweep: the base with ``overrides`` ((dotted key, value), ...)."""

    overrides: tuple[tuple[str, Any], ...]

    @property
    def id(self) -> str:
        """A stable name: the same overrides give the same id in every run."""
        text = json.dumps([[k, v] for k, v in self.overrides], sort_keys=True, default=str)
        return hashlib.sha1(text.encode()).hexdigest()[:12]

    def scenario(self, base: Mapping[str, Any]) -> dict[str, Any]:
        """The base scenario dict with this case's overrides applied."""
        raw = copy.deepcopy(dict(base))
        for key, value in self.overrides:
            set_key(raw, key, value, source=key)
        return raw


def split_values(text: str, where: str = "value") -> list[Any]:
    """``"12.5 GB/s,25 GB/s"`` -> ``["12.5 GB/s", "25 GB/s"]``; each value is read as
    YAML (so ``1,2`` gives numbers); commas inside brackets or quotes stay.

    >>> split_values("1,2, [3, 4],'a,b'")
    [1, 2, [3, 4], 'a,b']
    """
    parts, depth, quote, current = [], 0, None, ""
    for char in text:
        if quote:
            quote = None if char == quote else quote
        elif char in "\"'":
            quote = char
        elif char in "[{":
            depth += 1
        elif char in "]}":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(current)
            current = ""
            continue
        current += char
    parts.append(current)
    return [yaml_value(part, where) for part in parts if part.strip()]


def parse_axis(text: str, option: str) -> tuple[str, list[Any]]:
    """``key=v1,v2,...`` from the command line."""
    try:
        key, values = split_assignment(text, option)
    except ScenarioError:
        key, values = "", ""
    if not key.strip() or not values.strip():
        raise SweepError(f"{option}: {text!r} must look like key.path=value1,value2,... (quote "
                         "a key that holds a dot: a.\"b.c\"=1,2)")
    return key.strip(), split_values(values, f"{option} {key.strip()}")


def axes(texts: Iterable[str], option: str, given: Mapping[str, list] | None = None
         ) -> dict[str, list]:
    """The axes of repeated ``option``s, refusing a key given twice (here or in
    ``given``: the other option, or the sweep file) rather than keeping the last."""
    out: dict[str, list] = {}
    for text in texts:
        key, values = parse_axis(text, option)
        if key in out or key in (given or {}):
            raise SweepError(f"{option}: {key} is given twice; give all its values in one "
                             f"{option} {key}=V1,V2,...")
        out[key] = values
    return out


def expand(grid: Mapping[str, list], zipped: Mapping[str, list] | None = None) -> list[Case]:
    """Every case of the design: the grid's cartesian product crossed with the
    zipped rows (grid keys vary slowest, in the order given).

    >>> for case in expand({"a": [1, 2]}, {"b": [3, 4], "c": [5, 6]}):
    ...     print(case.overrides)
    (('a', 1), ('b', 3), ('c', 5))
    (('a', 1), ('b', 4), ('c', 6))
    (('a', 2), ('b', 3), ('c', 5))
    (('a', 2), ('b', 4), ('c', 6))
    """
    zipped = dict(zipped or {})
    for key, values in {**grid, **zipped}.items():
        if not isinstance(values, list) or not values:
            raise SweepError(f"{key}: {values!r} must be a non-empty list of values")
    lengths = {key: len(values) for key, values in zipped.items()}
    if len(set(lengths.values())) > 1:
        raise SweepError("zip: lists must have equal lengths, got "
                         + ", ".join(f"{k} {n}" for k, n in lengths.items()))
    rows = list(zip(*zipped.values(), strict=True)) if zipped else [()]
    cases = []
    for combination in product(*grid.values()):
        for row in rows:
            cases.append(Case(tuple(zip(grid, combination, strict=True))
                              + tuple(zip(zipped, row, strict=True))))
    return cases


def design_from(raw: object, path: str | Path) -> tuple[Path, dict, dict]:
    """A sweep file's contents (``raw``, read from ``path``): ``base`` (scenario
    path, relative to the file), ``grid`` and ``zip`` (mappings of dotted key ->
    list of values)."""
    file = Path(path)
    if not isinstance(raw, dict) or "base" not in raw:
        raise SweepError(f"{path}: a sweep file needs 'base' (a scenario file) and 'grid' "
                         "and/or 'zip'")
    unknown = set(raw) - {"base", "grid", "zip"}
    if unknown:
        raise SweepError(f"{path}: unknown key {sorted(unknown)[0]!r}; allowed: base, grid, zip")
    for section in ("grid", "zip"):
        if not isinstance(raw.get(section) or {}, dict):
            raise SweepError(f"{section}: must map dotted keys to lists of values")
    if not isinstance(raw["base"], str):
        raise SweepError(f"{path}: base: {raw['base']!r} must be a scenario file's path")
    both = set(raw.get("grid") or {}) & set(raw.get("zip") or {})
    if both:
        raise SweepError(f"{path}: {sorted(both)[0]} is in both grid and zip; give it once")
    return file.parent / raw["base"], dict(raw.get("grid") or {}), dict(raw.get("zip") or {})
