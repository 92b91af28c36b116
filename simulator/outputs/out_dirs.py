"""Output directories that a second command, a crash or a kill never leave mixed.

- ``exclusive(path, option)``: one command at a time writes a directory (a run,
  a sweep, a search): an advisory lock on the directory itself, taken before
  any work; a second writer is refused with a message naming the folder. The
  kernel drops the lock when its holder dies, however it dies.
- ``staged(out)``: a run directory is written into a hidden sibling
  (``.NAME.partial-PID``), its ``manifest.json`` written last, then put in
  ``out``'s place in one step (Linux's exchanging rename; elsewhere two
  renames). A reader sees the old run or the new one, never a mix; an
  interrupted write leaves only the hidden sibling, removed by the next write.
- ``manifest.json`` lists every file of the run with its size and SHA-256;
  ``verify`` checks the files a reader uses against it, so a file cut short,
  replaced or taken from another run is named, never read.

A directory that is not a run (no manifest, or files other than a run's) is
never replaced: the command refuses to write there.
"""

from __future__ import annotations

import ctypes
import errno
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

try:
    import fcntl
except ImportError:  # (Windows: no advisory locks; a second writer is not refused)
    fcntl = None

MANIFEST = "manifest.json"
FORMAT = 1  # the run directory's layout; a reader refuses another
LEGACY = ("summary.json", "spans.parquet", "scenario.yaml")  # a run before manifests


class RunDirError(ValueError):
    """A directory that is not a readable run, or cannot be written now; the
    message names the path."""


class OutputError(OSError):
    """An output file could not be written (disk full, file too large, ...); the
    message names the file."""


def guarded(path: Path, write) -> None:
    """Run ``write()``, which writes ``path``; an OS error becomes an OutputError
    naming the file (a write that fails midway names no file of its own)."""
    try:
        write()
    except OutputError:
        raise
    except OSError as error:
        raise OutputError(f"{path}: cannot write it ({error.strerror or error})") from None


@contextmanager
def exclusive(path: Path, option: str) -> Iterator[None]:
    """Hold ``path`` (a folder, made by the caller) for this command alone."""
    if fcntl is None:
        yield
        return
    for _ in range(10):
        fd = os.open(path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise RunDirError(f"{option}: {path} is being written by another clustersim "
                              "command now; wait for it to finish or choose another folder"
                              ) from None
        if _same(fd, path):  # (not a folder already swapped away by its last writer)
            break
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)


def _same(fd: int, path: Path) -> bool:
    try:
        here = os.stat(path)
    except OSError:
        return False
    there = os.fstat(fd)
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def replaceable(out: Path, option: str) -> str | None:
    """Refuse ``out`` unless it is missing, empty or a run directory (then the
    scenario name its run was of, None if unknown); never the current folder
    or one holding it (replacing it would pull the folder from under us)."""
    out = Path(out)
    here = Path.cwd().resolve()
    if out.exists() and (out.resolve() == here or out.resolve() in here.parents):
        raise RunDirError(f"{option}: {out} holds the current folder; give a folder for the "
                          "run, such as runs/NAME")
    if not out.is_dir() or not any(out.iterdir()):
        return None
    if (out / MANIFEST).is_file():
        try:
            return str(json.loads((out / MANIFEST).read_text()).get("scenario"))
        except (OSError, ValueError, AttributeError):
            return None
    if all((out / name).is_file() for name in LEGACY):  # a run an older clustersim wrote
        return None
    others = sorted(p.name for p in out.iterdir())[:3]
    raise RunDirError(f"{option}: {out} holds files that are not a clustersim run's "
                      f"({', '.join(others)}, ...); give a new or empty folder, or a run "
                      "directory to replace")


@contextmanager
def staged(out: Path, scenario: str) -> Iterator[Path]:
    """A hidden sibling of ``out`` to write a run into; on success its manifest
    is written and it replaces ``out`` at once; on any error it is removed."""
    out = Path(out).absolute()
    if out.is_symlink():  # the run goes where the link points; the link stays
        out = out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale(out)
    staging = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        guarded(staging / MANIFEST, lambda: write_manifest(staging, scenario))
        _swap(staging, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _remove_stale(out: Path) -> None:
    """Hidden siblings of ``out`` that a killed writer left (its process gone)."""
    for sibling in out.parent.glob(f".{out.name}.*-*"):
        pid = sibling.name.rsplit("-", 1)[-1]
        if sibling.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(sibling, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


def _swap(staging: Path, out: Path) -> None:
    """Put ``staging`` in ``out``'s place (an empty or missing ``out`` is simply
    replaced; a full one is exchanged in one step where the kernel can, and the
    old run, now at ``staging``, removed by the caller)."""
    if not out.exists() or (out.is_dir() and not any(out.iterdir())):
        os.replace(staging, out)
        return
    if _exchange(staging, out):
        return
    old = out.parent / f".{out.name}.old-{os.getpid()}"
    os.rename(out, old)
    os.rename(staging, out)
    shutil.rmtree(old, ignore_errors=True)


def _exchange(a: Path, b: Path) -> bool:
    """Swap two paths atomically (Linux renameat2 RENAME_EXCHANGE); False where
    the system cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        call = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_cwd, exchange = -100, 2
    if call(at_cwd, os.fsencode(a), at_cwd, os.fsencode(b), exchange) == 0:
        return True
    if ctypes.get_errno() in (errno.EINVAL, errno.ENOSYS, errno.EPERM):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(b))


def digest(path: Path) -> str:
    with open(path, "rb") as file:
        return hashlib.file_digest(file, "sha256").hexdigest()


def write_manifest(folder: Path, scenario: str) -> None:
    """``manifest.json``: every file of the run, its size and SHA-256, and a run
    id made of them (the same outputs, the same id)."""
    files = {p.name: {"bytes": p.stat().st_size, "sha256": digest(p)}
             for p in sorted(folder.iterdir()) if p.is_file() and p.name != MANIFEST}
    run = hashlib.sha256("".join(f["sha256"] for f in files.values()).encode()).hexdigest()
    manifest = {"format": FORMAT, "scenario": scenario, "run": run[:16], "files": files}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1) + "\n")


def verify(folder: Path, names: Sequence[str]) -> dict:
    """The manifest of the run in ``folder``, once each of ``names`` that the
    manifest lists is found whole (a name it does not list must be absent)."""
    where = folder / MANIFEST
    if not where.is_file():
        why = ("an older clustersim wrote it" if all((folder / n).is_file() for n in LEGACY)
               else "not a run directory, or its writing was interrupted")
        raise RunDirError(f"{folder}: no {MANIFEST} ({why}); run the scenario again with "
                          "clustersim run")
    try:
        manifest = json.loads(where.read_text())
        files = manifest["files"]
        assert manifest["format"] == FORMAT and isinstance(files, dict)
    except (OSError, ValueError, KeyError, TypeError, AssertionError):
        raise RunDirError(f"{where}: damaged; run the scenario again") from None
    for name in names:
        path = folder / name
        entry = files.get(name)
        if entry is None:
            if path.exists():
                raise RunDirError(f"{path}: not part of this run (its manifest does not list "
                                  "it); remove it or run the scenario again")
            continue
        if not path.is_file():
            raise RunDirError(f"{path}: missing (the run's manifest lists it); run the "
                              "scenario again")
        if path.stat().st_size != entry.get("bytes") or digest(path) != entry.get("sha256"):
            raise RunDirError(f"{path}: damaged or from another run (it differs from what "
                              "the run wrote); run the scenario again")
    return manifest
