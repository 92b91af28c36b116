"""Draw a large run's figures in a second process while this one writes its tables.

Rendering the Gantt and memory figures of a deep pipeline takes seconds of
matplotlib, and writing its span tables and trace as long again; they share
nothing but the finished run. On a machine with more than one core a forked
child (a copy-on-write view of the run, nothing serialised) draws the figures
while the parent writes the rest, so the whole command ends sooner; the files
are byte-for-byte those a single process writes. Where ``os.fork`` does not
exist, or the run is small, the work runs in this process.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable
from contextlib import contextmanager


class BackgroundError(RuntimeError):
    """The forked child failed; the message carries its error."""


@contextmanager
def alongside(work: Callable[[], None], background: bool):
    """Run ``work`` in a forked child while the ``with`` body runs here (when
    ``background`` and forking is possible), else after the body; the block ends
    once ``work`` has finished, and an error in it is raised here."""
    if not background or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        yield
        work()
        return
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: do the work, report, and leave without cleaning up
        os.close(read)
        status = 0
        try:
            work()
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            os.write(write, traceback.format_exc().encode()[-4000:])
            status = 1
        os.close(write)
        os._exit(status)
    os.close(write)
    try:
        yield
    finally:
        with os.fdopen(read, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
    if status != 0:
        raise BackgroundError(f"drawing the figures failed:\n{message or status}")
