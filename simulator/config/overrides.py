"""``--set key.path=value`` overrides on a scenario dict (values read as YAML)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from simulator.base.fields import ScenarioError
from simulator.base.user_files import yaml_value


def set_key(raw: dict[str, Any], path: str, value: Any, source: str = "--set") -> None:
    """Set the dotted key ``path`` of a scenario dict, making sections as needed."""
    keys = path.strip().split(".")
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
        path, sep, text = assignment.partition("=")
        if not sep or not path.strip():
            raise ScenarioError(f"--set: {assignment!r} must look like key.path=value")
        set_key(raw, path, yaml_value(text, f"--set {path.strip()}"))
    return raw
