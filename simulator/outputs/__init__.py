"""Everything a person looks at: one style module (palette, formats, saving),
the Gantt, memory, communication and sweep figures, the Perfetto trace and
tables (``exports``), and the run directory (``run_dir``).

May import ``simulator.base`` and ``simulator.analysis``.
"""
