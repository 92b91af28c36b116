"""The composition layer: one run (``runner``: scenario -> fabric + program ->
engine -> RunResult; ``symmetry``: which ranks to simulate; ``contention``: the
overlap slow-down as a fixed point over runs), several jobs on one fabric (``jobs``), sweeps
(``sweep_design``, ``sweep``), the validation set (``validate``, cases in
``validation/``), and the layout search (``layouts``, ``estimate``, ``search``,
``search_best``). The only layer, with the CLI, that joins ``topologies``,
``workloads`` and the engine.

May import every ``simulator`` package except ``simulator.cli``.
"""
