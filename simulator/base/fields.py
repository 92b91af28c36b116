"""Checked configuration fields: the parsers every spec declares for its keys.

A spec (a frozen dataclass in ``topologies``, ``workloads`` or the scenario)
declares each configurable field with ``setting(check, default)``; ``section``
checks a mapping from a scenario against such a spec (or any schema of
``{key: (check, default)}``), so each section is validated by the spec it
configures. Every failure is a ``ScenarioError`` whose one-line message names
the dotted key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from simulator.base import units

Check = Callable[[str, object], Any]
REQUIRED = object()  # a default that makes the key required


class ScenarioError(ValueError):
    """Bad scenario input; ``str(error)`` is one line naming key, value and what is allowed."""


def fail(path: str, value: object, allowed: str) -> ScenarioError:
    return ScenarioError(f"{path}: {value!r} {allowed}")


def says(check: Check, allowed: str) -> Check:
    """``check`` with ``allowed``, what it accepts in a few words, for the
    generated reference (``allowed_by``)."""
    check.allowed = allowed
    return check


def allowed_by(check: Check) -> str:
    """What ``check`` accepts: its ``says`` text, else its docstring's first sentence."""
    said = getattr(check, "allowed", None)
    return said or " ".join((check.__doc__ or "").split()).split(". ")[0].rstrip(".")


def integer(minimum: int, maximum: int | None = None) -> Check:
    def parse(path: str, value: object) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum or (
                maximum is not None and value > maximum):
            raise fail(path, value, f"must be an integer >= {minimum}" if maximum is None
                       else f"must be an integer from {minimum} to {maximum:,}")
        return value
    return says(parse, f"integer >= {minimum}" if maximum is None
                else f"integer from {minimum} to {maximum:,}")


def number(minimum: float, maximum: float = float("inf")) -> Check:
    def parse(path: str, value: object) -> float:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                minimum <= value <= maximum) or not math.isfinite(value):
            raise fail(path, value, f"must be a number in [{minimum:g}, {maximum:g}]"
                       if math.isfinite(maximum) else f"must be a finite number >= {minimum:g}")
        return float(value)
    return says(parse, f"number in [{minimum:g}, {maximum:g}]" if math.isfinite(maximum)
                else f"number >= {minimum:g}")


def boolean(path: str, value: object) -> bool:
    """true or false"""
    if not isinstance(value, bool):
        raise fail(path, value, "must be true or false")
    return value


def text(path: str, value: object) -> str:
    """text"""
    if not isinstance(value, str) or not value:
        raise fail(path, value, "must be a non-empty string" + yaml_word(path, value))
    return value


def yaml_word(path: str, value: object) -> str:
    """Where text was wanted and a boolean came, why: YAML 1.1 reads the words
    on/off, yes/no, true/false unquoted as booleans (``name: off`` is False);
    else nothing.

    >>> yaml_word("name", False)
    '; YAML 1.1 reads off, no and false unquoted as false: quote the word, e.g. name: "off"'
    """
    if not isinstance(value, bool):
        return ""
    words, example = ("on, yes and true", "on") if value else ("off, no and false", "off")
    key = path.rsplit(".", 1)[-1]
    return (f"; YAML 1.1 reads {words} unquoted as {str(value).lower()}: quote the word, "
            f'e.g. {key}: "{example}"')


def choice(options: Iterable[Any]) -> Check:
    names = list(options)
    words = any(isinstance(n, str) for n in names)

    def parse(path: str, value: object) -> Any:
        if isinstance(value, bool) or value not in names:
            raise fail(path, value, f"is not one of: {', '.join(map(str, names))}"
                       + (yaml_word(path, value) if words else ""))
        return value
    return says(parse, f"one of: {', '.join(map(str, names))}")


def choices(options: Iterable[Any], what: str = "an option") -> Check:
    """A list of distinct options (returned as a tuple in the order written);
    ``what`` names one in the error for a repeat."""
    pick = choice(options)

    def parse(path: str, value: object) -> tuple:
        if not isinstance(value, (list, tuple)):
            raise fail(path, value, "must be a list")
        out = tuple(pick(f"{path}[{n}]", v) for n, v in enumerate(value))
        if len(set(out)) < len(out):
            raise fail(path, value, f"names {what} twice")
        return out
    return says(parse, f"a list of: {allowed_by(pick)[len('one of: '):]} (each once)")


def member(enum: type) -> Check:
    """One of an Enum's values, returned as the member."""
    pick = choice(m.value for m in enum)
    return says(lambda path, value: enum(pick(path, value)), allowed_by(pick))


def quantity(dimension: units.Dimension, positive: bool) -> Check:
    def parse(path: str, value: object) -> float:
        try:
            parsed = units.parse_quantity(value, dimension)
        except units.UnitError as error:
            raise ScenarioError(f"{path}: {error}") from None
        if parsed < 0 or (positive and parsed == 0):
            sign = "positive" if positive else "non-negative"
            raise fail(path, value, f"must be a {sign} {dimension.name.lower()}, "
                                    f"e.g. {dimension.value}")
        return parsed
    return says(parse, f"{'positive' if positive else 'non-negative'} "
                       f"{dimension.name.lower()} with its unit, e.g. {dimension.value}")


BANDWIDTH = quantity(units.Dimension.BANDWIDTH, positive=True)
LATENCY = quantity(units.Dimension.TIME, positive=False)
EFFICIENCY = number(0.01, 1.0)
SIZE = quantity(units.Dimension.SIZE, positive=True)


def setting(check: Check, default: Any = dataclasses.MISSING, *, required: bool = False,
            **options: Any) -> Any:
    """A dataclass field a scenario may set: ``check`` parses and checks it; a
    ``required`` one must be given (a field with no default is otherwise taken
    from a preset)."""
    return dataclasses.field(default=default, metadata={"check": check, "required": required},
                             **options)


def schema_of(spec: type) -> dict[str, tuple[Check, Any]]:
    """``{key: (check, default)}`` of a spec's settable fields, in field order: the
    field's default, REQUIRED, or None where the field has no default."""
    schema = {}
    for f in dataclasses.fields(spec):
        if "check" in f.metadata:
            default = REQUIRED if f.metadata["required"] else (
                None if f.default is dataclasses.MISSING else f.default)
            schema[f.name] = (f.metadata["check"], default)
    return schema


def nested(spec: type) -> Check:
    """A sub-section configuring ``spec``, checked by it: returns the spec."""
    return says(lambda path, value: spec(**section(path, value, schema_of(spec))),
                f"a section of {spec.__name__}'s settings")


# Names users bring from Megatron-LM, DeepSpeed and papers, for the keys we spell
# shorter: a typo of one of them is matched against both spellings.
ALIASES = {
    "tensor_parallel": "tp", "tensor_model_parallel_size": "tp",
    "pipeline_parallel": "pp", "pipeline_model_parallel_size": "pp",
    "data_parallel": "dp", "context_parallel": "cp", "context_parallel_size": "cp",
    "virtual_pipeline_model_parallel_size": "virtual_stages", "zero_stage": "zero",
    "micro_batch_size": "micro_batch", "global_batch_size": "global_batch",
    "seq_length": "seq_len", "sequence_length": "seq_len",
    "num_layers": "layers", "hidden_size": "hidden", "num_attention_heads": "heads",
    "num_query_groups": "kv_heads", "ffn_hidden_size": "ffn_hidden", "vocab_size": "vocab",
}


def unknown(path: str, key: object, allowed: Iterable[str]) -> ScenarioError:
    """An unknown key's error, with the closest allowed key (or the key a known
    alias stands for: ``tensor_paralel`` -> ``tp``) as a hint.

    >>> str(unknown("parallelism", "tensor_paralel", ["tp", "sequence_parallel"]))
    "parallelism.tensor_paralel: unknown key (did you mean 'tp'?); allowed: sequence_parallel, tp"
    """
    names = sorted(allowed)
    spellings = {**{alias: name for alias, name in ALIASES.items() if name in names},
                 **{name: name for name in names}}
    close = difflib.get_close_matches(str(key), list(spellings), n=1)
    hint = f" (did you mean {spellings[close[0]]!r}?)" if close else ""
    prefix = f"{path}." if path else ""
    return ScenarioError(f"{prefix}{key}: unknown key{hint}; allowed: {', '.join(names)}")


def section(path: str, raw: object, schema: Mapping[str, tuple[Check, Any]]) -> dict[str, Any]:
    """Check the mapping ``raw`` found at ``path`` against ``schema``: unknown keys,
    each value's check, required keys; absent keys take their defaults."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise fail(path or "scenario", raw, "must be a mapping of keys to values")
    for key in raw:
        if key not in schema:
            raise unknown(path, key, schema)
    values = {}
    for key, (parse, default) in schema.items():
        dotted = f"{path}.{key}" if path else key
        if key in raw and raw[key] is not None:
            values[key] = parse(dotted, raw[key])
        elif default is REQUIRED:
            raise ScenarioError(f"{dotted}: missing; it is required")
        else:
            values[key] = default
    return values
