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

import hashlib
import math
import re
from pathlib import Path
from typing import Any

import yaml

from simulator.base.fields import ScenarioError

MAX_NAME = 100  # characters of a scenario name kept in a file name


def user_path(written: str | Path, base_dir: Path | None) -> Path:
    """A path a user wrote in a file: a relative one is taken from ``base_dir``
    (the file's folder), as the user reads it."""
    path = Path(written)
    return base_dir / path if base_dir is not None and not path.is_absolute() else path


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader whose mapping keys are the text written, and that refuses a key
    given twice in a mapping.

    Every key a user writes names something (a section, a setting, a job, a GPU,
    a time): PyYAML would turn ``1:``, ``true:`` or ``null:`` into a number, a
    boolean or None, which then cannot be looked up by name, and ``1:`` and
    ``"1":`` into two keys that name one thing. Keys are kept as written, so both
    are ``"1"`` and the second is refused as a duplicate."""

    def construct_mapping(self, node, deep=False):
        if not isinstance(node, yaml.MappingNode):
            return super().construct_mapping(node, deep)
        written = sum(1 for k, _ in node.value if k.tag != "tag:yaml.org,2002:merge")
        self.flatten_mapping(node)  # merged pairs (<<) first, then the written ones,
        merged = len(node.value) - written  # each later pair overriding an earlier one
        out: dict[Any, Any] = {}
        lines: dict[Any, int] = {}
        for i, (key_node, value_node) in enumerate(node.value):
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a key must be a name, not a list or a mapping",
                    key_node.start_mark)
            key = key_node.value
            if i >= merged and key in lines:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r} (first given at line "
                                f"{lines[key] + 1})", key_node.start_mark)
            if i >= merged:
                lines[key] = key_node.start_mark.line
            out[key] = self.construct_object(value_node, deep=deep)
        return out


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


def text_keys(value: Any, where: str) -> Any:
    """``value`` with every mapping key as text, as the YAML reader gives them: a
    scenario built in Python may key a job or a GPU by an integer (``{1: ...}``
    becomes ``{"1": ...}``); a key that is None, a boolean or a float names
    nothing, and two keys that become one text are an error naming both.

    >>> text_keys({"jobs": {1: {"nodes": 1}}}, "")
    {'jobs': {'1': {'nodes': 1}}}
    """
    if isinstance(value, list):
        return [text_keys(item, f"{where}[{i}]") for i, item in enumerate(value)]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for key, item in value.items():
        if isinstance(key, bool) or not isinstance(key, (str, int)):
            raise ScenarioError(f"{where or 'scenario'}: the key {key!r} must be a name "
                                "(text or an integer)")
        name = str(key)
        if name in out:
            raise ScenarioError(f"{where or 'scenario'}: the keys {name!r} and {key!r} name "
                                "one thing; give it once")
        out[name] = text_keys(item, f"{where}.{name}" if where else name)
    return out


def file_name(name: str) -> str:
    """``name`` as one safe path component, one name to one component: letters
    (any script), digits, ``.``, ``_``, ``-`` and ``+`` are kept; anything else
    becomes ``_`` and leading dots are dropped, so a scenario named ``../../x``
    writes inside ``runs/``, never beside it; a name changed so (or cut to
    MAX_NAME characters) gets a short hash of itself, so two names never share
    a run directory.

    >>> file_name("gpt3-1.3b-dp64"), file_name("实验")
    ('gpt3-1.3b-dp64', '实验')
    >>> file_name("../../../tmp/x")
    '_.._.._tmp_x-9d31971d'
    """
    safe = re.sub(r"[^\w.+-]", "_", name).lstrip(".")
    if safe == name and len(safe) <= MAX_NAME:
        return safe
    tag = hashlib.sha1(name.encode("utf-8", "surrogatepass")).hexdigest()[:8]
    return f"{safe[:MAX_NAME] or 'scenario'}-{tag}"
