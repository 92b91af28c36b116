"""Write a large run's outputs on two cores: a forked child draws the figures and
then helps with the tables.

Rendering the Gantt and memory figures of a deep pipeline takes seconds of
matplotlib, and writing its span tables and trace as long again; they share
nothing but the finished run. On a machine with more than one core a forked
child (a copy-on-write view of the run, nothing serialised) draws the figures
while this process writes tables; the tables are a queue both take from (one
byte per task in a pipe: a read of one byte is atomic), so whichever finishes
first takes the rest. Every file is byte-for-byte what one process writes.
Where ``os.fork`` does not exist, or the run is small, everything runs here.
"""

from __future__ import annotations

import os
import traceback
from collections.abc import Callable, Sequence

from simulator.base.processes import follow_parent
from simulator.outputs.out_dirs import OutputError


class BackgroundError(RuntimeError):
    """The forked child failed; the message carries its error."""


def together(first: Callable[[], None], tasks: Sequence[Callable[[], None]],
             background: bool) -> None:
    """Run ``first`` and every task once: with ``background`` (and forking
    possible) a forked child runs ``first`` and then takes tasks while this
    process takes them too; else the tasks, then ``first``, here. An error in
    the child is raised here once this process's tasks are done."""
    if not background or not hasattr(os, "fork") or (os.cpu_count() or 1) < 2:
        for task in tasks:
            task()
        first()
        return
    if len(tasks) > 255:
        raise ValueError(f"{len(tasks)} tasks; a queue holds 255")
    queue, feed = os.pipe()
    os.write(feed, bytes(range(len(tasks))))
    os.close(feed)
    read, write = os.pipe()
    parent = os.getpid()
    pid = os.fork()
    if pid == 0:  # the child: first, then tasks; report, and leave without cleaning up
        follow_parent(parent)  # (a parent killed with -9 takes the child with it)
        os.close(read)
        status = 0
        try:
            first()
            _take(queue, tasks)
        except OutputError as error:  # the system refused a file: say which
            os.write(write, b"O" + str(error).encode()[-4000:])
            status = 1
        except BaseException:  # noqa: BLE001 - everything goes back to the parent
            os.write(write, b"T" + traceback.format_exc().encode()[-4000:])
            status = 1
        os.close(write)
        os._exit(status)
    os.close(write)
    try:
        _take(queue, tasks)
    finally:
        os.close(queue)
        with os.fdopen(read, "rb") as pipe:
            message = pipe.read().decode(errors="replace")
        _, status = os.waitpid(pid, 0)
    if status != 0 and message.startswith("O"):
        raise OutputError(message[1:])
    if status != 0:
        raise BackgroundError(f"writing the outputs in the background failed:\n"
                              f"{message[1:] or status}")


def _take(queue: int, tasks: Sequence[Callable[[], None]]) -> None:
    """Run tasks from the queue until it is empty."""
    while taken := os.read(queue, 1):
        tasks[taken[0]]()
