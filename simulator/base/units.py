"""Unit strings at the edges, SI floats inside.

Scenario files and the CLI write quantities as strings with units
(``"200 Gb/s"``, ``"25 GB/s"``, ``"1.5 us"``, ``"80 GiB"``); everything past the
loader works in seconds, bytes and bytes per second. A lowercase ``b`` is a bit
and an uppercase ``B`` is a byte, always: ``"200 Gb/s"`` is 25e9 bytes/s.
A bare number is rejected rather than guessed at.

Decimal prefixes (k, M, G, T, P) are powers of 1000; binary prefixes
(Ki, Mi, Gi, Ti, Pi) are powers of 1024.
"""

from __future__ import annotations

import math
import re
from enum import Enum

__all__ = [
    "Dimension",
    "UnitError",
    "parse_quantity",
    "parse_bandwidth",
    "parse_size",
    "parse_time",
    "format_bytes",
    "format_time",
]


class UnitError(ValueError):
    """A quantity string that cannot be read; the message says what is allowed."""


class Dimension(Enum):
    """What a quantity measures; the value is the example shown in errors."""

    BANDWIDTH = "'200 Gb/s' or '25 GB/s'"
    SIZE = "'25 MB' or '80 GiB'"
    TIME = "'1.5 us' or '2 ms'"


_PREFIX = {
    "": 1.0,
    "k": 1e3,
    "K": 1e3,
    "M": 1e6,
    "G": 1e9,
    "T": 1e12,
    "P": 1e15,
    "Ki": 2.0**10,
    "Mi": 2.0**20,
    "Gi": 2.0**30,
    "Ti": 2.0**40,
    "Pi": 2.0**50,
}

_TIME_UNITS = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9, "min": 60.0}

_NUMBER = r"(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)"
_DATA = re.compile(
    _NUMBER + r"\s*(?P<prefix>Ki|Mi|Gi|Ti|Pi|[kKMGTP]?)(?P<unit>[bB])(?P<rate>/s|ps)?$")
_TIME = re.compile(_NUMBER + r"\s*(?P<unit>s|ms|us|µs|ns|min)$")


def _data_value(match: re.Match[str]) -> float:
    value = float(match["num"]) * _PREFIX[match["prefix"]]
    return value / 8.0 if match["unit"] == "b" else value


def parse_quantity(text: object, dimension: Dimension) -> float:
    """Return ``text`` in SI units (bytes, bytes/s or seconds) or raise UnitError.

    >>> parse_quantity("200 Gb/s", Dimension.BANDWIDTH)
    25000000000.0
    """
    if isinstance(text, bool) or not isinstance(text, str):
        raise UnitError(f"{text!r} needs a unit, e.g. {dimension.value}")
    stripped = text.strip()
    value = None
    if dimension is Dimension.TIME:
        match = _TIME.match(stripped)
        if match:
            value = float(match["num"]) * _TIME_UNITS[match["unit"]]
    else:
        match = _DATA.match(stripped)
        is_rate = bool(match and match["rate"])
        if match and is_rate == (dimension is Dimension.BANDWIDTH):
            value = _data_value(match)
    if value is not None:
        if not math.isfinite(value):
            raise UnitError(f"{text!r} is too large to be a {dimension.name.lower()}")
        return value
    raise UnitError(f"{text!r} is not a {dimension.name.lower()}; write e.g. {dimension.value}")


def parse_bandwidth(text: object) -> float:
    """Bytes per second from e.g. ``"200 Gb/s"`` (bits) or ``"25 GB/s"`` (bytes)."""
    return parse_quantity(text, Dimension.BANDWIDTH)


def parse_size(text: object) -> float:
    """Bytes from e.g. ``"25 MB"`` or ``"80 GiB"``."""
    return parse_quantity(text, Dimension.SIZE)


def parse_time(text: object) -> float:
    """Seconds from e.g. ``"1.5 us"``."""
    return parse_quantity(text, Dimension.TIME)


def format_bytes(value: float) -> str:
    """Human-readable bytes with binary prefixes, e.g. ``'1.50 GiB'``."""
    for prefix in ("", "Ki", "Mi", "Gi", "Ti"):
        if abs(value) < 1024.0 or prefix == "Ti":
            return f"{value:.2f} {prefix}B" if prefix else f"{value:.0f} B"
        value /= 1024.0
    raise AssertionError("unreachable")


def format_time(seconds: float) -> str:
    """Human-readable duration with the largest unit that keeps the value >= 1."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.3f} {unit}"
    return f"{seconds / 1e-9:.1f} ns"
