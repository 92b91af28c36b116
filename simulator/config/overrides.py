"""``--set key.path=value`` overrides on a scenario dict (values read as YAML).

A key that holds a dot or an ``=`` (a throttle time such as ``"0.5 ms"``, a job
named ``run.2``) is quoted in the path, as in YAML:
``--set 'cluster.throttle."gpu 12"."0.5 ms"=3'``.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simulator.base.fields import ScenarioError
from simulator.base.user_files import yaml_value

QUOTES = "\"'"


def split_path(text: str, source: str = "--set") -> list[str]:
    """The keys of a dotted path, a quoted key kept whole.

    >>> split_path('cluster.throttle."gpu 12"."0.5 ms"')
    ['cluster', 'throttle', 'gpu 12', '0.5 ms']
    """
    keys, current, quote, quoted = [], "", None, False
    for char in text.strip():
        if quote is not None:
            if char == quote:
                quote = None
            else:
                current += char
        elif char in QUOTES and not current:
            quote, quoted = char, True
        elif char == ".":
            keys.append(_key(current, quoted, text, source))
            current, quoted = "", False
        else:
            if quoted:
                raise ScenarioError(f"{source}: {text!r}: text after a quoted key; a quoted "
                                    "key ends at a dot")
            current += char
    if quote is not None:
        raise ScenarioError(f"{source}: {text!r}: a quoted key is not closed ({quote})")
    keys.append(_key(current, quoted, text, source))
    return keys


def _key(key: str, quoted: bool, text: str, source: str) -> str:
    if not key and not quoted:
        raise ScenarioError(f"{source}: {text!r} has an empty key (two dots, or a dot at an "
                            "end); quote a key that holds a dot: a.\"b.c\"")
    return key


def split_assignment(assignment: str, source: str = "--set") -> tuple[str, str]:
    """``key.path=value`` as (path, value text): the first ``=`` outside quotes."""
    quote = None
    for i, char in enumerate(assignment):
        if quote is not None:
            quote = None if char == quote else quote
        elif char in QUOTES:
            quote = char
        elif char == "=":
            if not assignment[:i].strip():
                break
            return assignment[:i], assignment[i + 1:]
    raise ScenarioError(f"{source}: {assignment!r} must look like key.path=value (quote a "
                        "key that holds a dot or '=': a.\"b.c\"=1)")


def set_key(raw: dict[str, Any], path: str, value: Any, source: str = "--set") -> None:
    """Set the dotted key ``path`` of a scenario dict, making sections as needed."""
    keys = split_path(path, source)
    node = raw
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ScenarioError(f"{source}: {'.'.join(keys[:i + 1])} is a value, not a section")
        node = child
    node[keys[-1]] = value


def apply_overrides(raw: dict[str, Any], assignments: Iterable[str]) -> dict[str, Any]:
    """Apply ``key.path=value`` overrides; values are read as YAML (``null`` unsets
    a key; an empty value is an error, not a silent unset)."""
    for assignment in assignments:
        path, text = split_assignment(assignment)
        set_key(raw, path, yaml_value(text, f"--set {path.strip()}"))
    return raw
