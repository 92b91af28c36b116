"""Bytes on links: the fabric as link arrays with routes (``fabric``), max-min fair
rates and fluid progress (``maxmin``, pure), the SimPy flow model (``flows``)
and batched transfers of several groups' calls (``batches``).

May import ``simulator.base`` and ``topologies`` (which owns routing).
"""
