"""Option parsers the commands share: times, figure paths, rank lists."""

from __future__ import annotations

from pathlib import Path

from simulator.base.units import UnitError, parse_time
from simulator.collectives.nccl_tests import parse_ranks
from simulator.config.scenario import ScenarioError
from simulator.outputs.style import FORMATS


def time_option(text: str | None, name: str) -> float | None:
    if text is None:
        return None
    try:
        return float(text) if text.replace(".", "", 1).isdigit() else parse_time(text)
    except UnitError as error:
        raise ScenarioError(f"{name}: {error}") from None


def figure(path: str | Path, option: str) -> Path:
    """A figure path whose suffix names a format we write, or a one-line error."""
    path = Path(path)
    if path.suffix.lstrip(".") not in FORMATS:
        raise ScenarioError(f"{option}: {path.name} must end in one of .png, .pdf, .svg")
    return path


def ranks_option(text: str | None, total: int) -> list[int] | None:
    if text is None:
        return None
    try:
        return parse_ranks(text, total, minimum=1)
    except ValueError as error:
        raise ScenarioError(f"--ranks: {error}") from None
