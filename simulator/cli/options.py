"""Option parsers the commands share: times, output paths, rank lists.

Every path a command will write is checked (and its folder made) before the
command does any work, so a typo in ``--out`` costs nothing and never leaves a
traceback or a half-written result.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from simulator.base.units import UnitError, parse_time
from simulator.base.user_files import file_name
from simulator.collectives.nccl_tests import parse_ranks
from simulator.config.scenario import ScenarioError
from simulator.outputs.style import FORMATS


def time_option(text: str | None, name: str) -> float | None:
    """A time with its unit (``"120 ms"``); a bare number is never guessed."""
    if text is None:
        return None
    try:
        return parse_time(text)
    except UnitError as error:
        raise ScenarioError(f"{name}: {error}") from None


def figure(path: str | Path, option: str) -> Path:
    """A figure path whose suffix names a format we write, or a one-line error;
    writable (``output_file``)."""
    path = Path(path)
    if path.suffix.lstrip(".") not in FORMATS:
        raise ScenarioError(f"{option}: {path.name} must end in one of .png, .pdf, .svg")
    return output_file(path, option)


def output_dir(path: str | Path, option: str) -> Path:
    """A folder to write into: made if missing, and writable, or a one-line error."""
    path = Path(path)
    try:
        if path.exists() and not path.is_dir():
            raise ScenarioError(f"{option}: {path} is a file, not a folder")
        path.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ScenarioError(f"{option}: cannot create the folder {_short(path)} "
                            f"({error.strerror})") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise ScenarioError(f"{option}: the folder {path} is not writable")
    return path


def inside(parent: Path, name: str, option: str, make: bool = True) -> Path:
    """The folder for ``name`` inside ``parent`` (an ``output_dir``): one safe path
    component (``user_files.file_name``), never a symbolic link (which could
    lead out of ``parent``), made and writable (``make``; else only checked)."""
    path = parent / file_name(name)
    if path.is_symlink():
        raise ScenarioError(f"{option}: {path} is a symbolic link; nothing is written "
                            "through one (remove it or give another --out)")
    return output_dir(path, option) if make else path


@contextmanager
def removed_if_failed(path: str | Path) -> Iterator[None]:
    """The folders of ``path`` that the work inside makes (``output_dir``) removed
    again, deepest first, where it fails and leaves them empty: a failed run
    leaves no empty folder behind (a folder that was there stays)."""
    path = Path(path)
    missing = [p for p in (path, *path.parents) if not _there(p)]
    try:
        yield
    except BaseException:
        for folder in missing:
            try:
                folder.rmdir()
            except OSError:  # not empty (an error file beside the run), or not there
                break
        raise


def _there(path: Path) -> bool:
    """Whether ``path`` exists; a name the system refuses (too long) is never made,
    so there is nothing of it to remove."""
    try:
        return path.exists()
    except OSError:
        return True


def _short(path: Path) -> str:
    """A path for a message: a very long one cut in the middle."""
    text = str(path)
    return text if len(text) <= 200 else f"{text[:100]}...{text[-60:]} ({len(text):,} characters)"


def output_file(path: str | Path, option: str) -> Path:
    """A file to write: its folder made if missing; the file writable, or a
    one-line error."""
    path = Path(path)
    try:
        if path.is_dir():
            raise ScenarioError(f"{option}: {path} is a folder; give a file name")
        output_dir(path.parent, option)
        if path.exists() and not os.access(path, os.W_OK):
            raise ScenarioError(f"{option}: {path} is not writable")
    except OSError as error:
        raise ScenarioError(f"{option}: cannot write {_short(path)} ({error.strerror})"
                            ) from None
    return path


def ranks_option(text: str | None, total: int) -> list[int] | None:
    if text is None:
        return None
    try:
        return parse_ranks(text, total, minimum=1)
    except ValueError as error:
        raise ScenarioError(f"--ranks: {error}") from None
