"""A program's notes as JSON and back, for its traces' metadata (``chakra``): the
summary's plain values as they are, and what JSON has no form for (the MoE
note's arrays, mappings keyed by a layer's number) tagged, so ``restored``
gives back the notes ``plain`` was given and the summary the traces' run
prints is the exported scenario's, its MoE keys and ``experts`` lines too.
A note that is none of these (no JSON form) is left out.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping

import numpy as np

ARRAY = "__array__"  # a numpy array's values
ITEMS = "__items__"  # a mapping with keys JSON cannot name: its [key, value] pairs


def plain(notes: Mapping[str, object]) -> dict[str, object]:
    """``notes`` as JSON-able values (the ones with no JSON form left out).

    >>> plain({"parameters": 7, "_moe": {"f": {3: np.array([1.5])}}})
    {'parameters': 7, '_moe': {'f': {'__items__': [[3, {'__array__': [1.5]}]]}}}
    """
    out = {}
    for key, value in notes.items():
        try:
            out[key] = _plain(value)
            json.dumps(out[key], allow_nan=False)
        except (TypeError, ValueError):
            out.pop(key, None)
    return out


def _plain(value: object) -> object:
    if isinstance(value, np.ndarray):
        return {ARRAY: [float(v) for v in value.ravel()]}
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, Mapping):
        if all(isinstance(k, str) for k in value):
            return {k: _plain(v) for k, v in value.items()}
        return {ITEMS: [[k, _plain(v)] for k, v in value.items()]}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(value)
    return value


def restored(value: object) -> object:
    """What ``plain`` was given (tuples come back as lists).

    >>> restored({'f': {'__items__': [[3, {'__array__': [1.5]}]]}})
    {'f': {3: array([1.5])}}
    """
    if isinstance(value, dict):
        if set(value) == {ARRAY} and isinstance(value[ARRAY], list):
            return np.array(value[ARRAY], dtype=float)
        if set(value) == {ITEMS} and isinstance(value[ITEMS], list) and all(
                isinstance(p, list) and len(p) == 2 for p in value[ITEMS]):
            return {_key(k): restored(v) for k, v in value[ITEMS]}
        return {k: restored(v) for k, v in value.items()}
    if isinstance(value, list):
        return [restored(v) for v in value]
    return value


def _key(key: object) -> object:
    return tuple(key) if isinstance(key, list) else key
