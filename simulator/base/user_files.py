"""Reading the files and values a user writes, strictly, with one-line errors.

Every file a user hands us (a scenario, a fabric file, a sweep file, a
calibration CSV, an HF ``config.json``) and every value typed on the command
line (``--set k=v``, ``--grid k=a,b``) goes through these readers, so that they
all fail the same way: a ``ScenarioError`` whose message names the file (or
option), where in it, and what is wrong, never a traceback. YAML is read with
a loader that rejects a key given twice in one mapping (PyYAML keeps the last
one silently, so a second ``parallelism:`` section would replace the first).
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

import yaml

from simulator.base.fields import ScenarioError


def user_path(written: str | Path, base_dir: Path | None) -> Path:
    """A path a user wrote in a file: a relative one is taken from ``base_dir``
    (the file's folder), as the user reads it."""
    path = Path(written)
    return base_dir / path if base_dir is not None and not path.is_absolute() else path


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses duplicate keys in a mapping."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: PyYAML's own error follows
                    continue
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"duplicate key {key!r} (first given at line {first + 1})",
                        key_node.start_mark)
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep)


def read_text(path: str | Path, what: str) -> str:
    """A text file's contents as UTF-8; ``what`` names the file in errors
    ("scenario file", "fabric file")."""
    try:
        data = Path(path).read_bytes()
    except IsADirectoryError:
        raise ScenarioError(f"{path}: is a directory, not a {what}") from None
    except OSError as error:
        raise ScenarioError(f"{path}: cannot read the {what} ({error.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise ScenarioError(f"{path}: the {what} is not UTF-8 text (byte {error.start}: "
                            f"{data[error.start:error.start + 1]!r})") from None


def parse_yaml(text: str, where: str) -> Any:
    """YAML text, parsed strictly; errors name ``where`` and the line."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        line = f" at line {mark.line + 1}" if mark is not None else ""
        problem = getattr(error, "problem", None) or "cannot be parsed"
        raise ScenarioError(f"{where}: not valid YAML{line}: {problem}") from None


def read_yaml(path: str | Path, what: str) -> Any:
    """A YAML file, read and parsed strictly."""
    return parse_yaml(read_text(path, what), str(path))


def yaml_value(text: str, where: str) -> Any:
    """A value typed on the command line (``--set k=v``), read as YAML.

    >>> yaml_value("[1, 2]", "--set k")
    [1, 2]
    >>> yaml_value("200 Gb/s", "--set k")
    '200 Gb/s'
    """
    if not text.strip():
        raise ScenarioError(f"{where}: no value after '='; write key=null to unset a key")
    return parse_yaml(text, where)


def finite_numbers(value: Any, where: str) -> None:
    """Refuse NaN and infinity anywhere in a parsed document (YAML's ``.nan`` and
    ``.inf``, or a number too large for a float): no quantity we model is one."""
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(f"{where}: {value!r} is not a finite number")
    if isinstance(value, dict):
        for key, item in value.items():
            finite_numbers(item, f"{where}.{key}" if where else str(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            finite_numbers(item, f"{where}[{i}]")


def file_name(name: str) -> str:
    """``name`` as one safe path component: characters other than letters, digits,
    ``.``, ``_``, ``-`` and ``+`` become ``_``, and leading dots are dropped, so a
    scenario named ``../../x`` writes inside ``runs/``, never beside it.

    >>> file_name("../../../tmp/x")
    '_.._.._tmp_x'
    >>> file_name("gpt3 175b/tp8")
    'gpt3_175b_tp8'
    """
    safe = re.sub(r"[^A-Za-z0-9._+-]", "_", name).lstrip(".")
    return safe or "scenario"
