"""Bytes on links: the fabric as link arrays with routes (``fabric``), max-min fair
rates and fluid progress (``maxmin``, pure), and the SimPy flow model (``flows``).

May import ``simulator.base`` and ``topologies`` (which owns routing).
"""
