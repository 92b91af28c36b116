"""A setting's description, read from the code: the comment beside its field,
or the comment lines directly above it (Sphinx's ``#:`` convention without the
colon), so the generated reference never restates what the spec says.

    @dataclass(frozen=True)
    class Spec:
        # sequences per micro-batch
        micro_batch: int = setting(integer(1), 1)
        seed: int = setting(integer(0), 0)  # the draws' seed

``descriptions(Spec)`` gives ``{"micro_batch": "sequences per micro-batch",
"seed": "the draws' seed"}``; a settable field without one gives ``""`` (the
reference test fails on it).
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import tokenize
from functools import cache


@cache
def descriptions(spec: type) -> dict[str, str]:
    """``{field: its description}`` of every field of ``spec`` that a scenario may
    set (``fields.setting``), its base classes' included."""
    found: dict[str, str] = {}
    for cls in reversed(spec.__mro__):
        if dataclasses.is_dataclass(cls) and cls is not object:
            found.update(_comments(cls))
    return {f.name: found.get(f.name, "") for f in dataclasses.fields(spec)
            if "check" in f.metadata}


def _comments(cls: type) -> dict[str, str]:
    """The comments of ``cls``'s own field lines (beside, else directly above)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined where its source is not at hand
        return {}
    beside: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            beside[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    out = {}
    for number, line in enumerate(lines, start=1):
        name = line.strip().split(":", 1)[0]
        if not name.isidentifier() or line[: len(line) - len(line.lstrip())] != "    " or \
                ":" not in line or line.strip().startswith("#"):
            continue
        text = beside.get(number) if not lines[number - 1].lstrip().startswith("#") else None
        above, k = [], number - 1
        while k >= 1 and lines[k - 1].strip().startswith("#"):
            above.insert(0, beside.get(k, ""))
            k -= 1
        out[name] = text or " ".join(above)
    return out
