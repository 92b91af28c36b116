"""Many runs: sweeps (``sweep_design``: the grid and zip axes and their cases;
``sweep``: running them, nothing lost), the validation set (``validate``,
cases and their sources in ``validation/``; ``validation_stats``: errors per
group and per half, fit and check), and the layout search (``layouts``: its parallel
dimensions read from ``workloads.program.DIMENSIONS``, ``estimate``,
``search``, ``search_best``). Each run is ``simulator.runner``'s.

May import every ``simulator`` package except ``simulator.cli``.
"""
