"""Processes this program starts leave with it.

A forked output writer (``outputs.alongside``) or a sweep's worker
(``experiments.sweep``) whose parent was killed with -9 cannot be told to stop;
left alone it would go on writing for nobody. ``follow_parent`` makes it exit
as soon as its parent is gone: on Linux the kernel kills it then
(``prctl(PR_SET_PDEATHSIG, SIGKILL)``); elsewhere a thread notices within half a
second.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time

PR_SET_PDEATHSIG = 1  # linux/prctl.h


def follow_parent(parent: int, by_kernel: bool = True) -> None:
    """In a child of ``parent``: exit as soon as ``parent`` is gone. The kernel's
    notice comes when the *thread* that forked the child ends: ``by_kernel=False``
    (a thread watching) where that thread may end before the process does (a
    process pool's workers)."""
    if by_kernel and sys.platform.startswith("linux"):
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
                if os.getppid() != parent:  # it died before the request took hold
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)
    threading.Thread(target=watch, daemon=True, name="follow-parent").start()
