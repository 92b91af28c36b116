"""Which of many rows a view shows: a few, evenly spread (no plotting library here,
so choosing the trace's ranks does not load matplotlib)."""

from __future__ import annotations

import numpy as np


def spread(items: list, count: int) -> list:
    """At most ``count`` of ``items``, evenly spread, first and last kept (the rows a
    figure or a trace shows of many).

    >>> spread(list(range(32)), 4)
    [0, 10, 21, 31]
    >>> spread([3, 5], 4)
    [3, 5]
    """
    if len(items) <= count:
        return list(items)
    return [items[i] for i in sorted(set(np.linspace(0, len(items) - 1, count)
                                         .round().astype(int)))]
