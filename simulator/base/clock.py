"""When this program started: the ``simulator`` package's first import (a
command's printed wall time counts its imports too)."""

from __future__ import annotations

import time

STARTED = time.perf_counter()
