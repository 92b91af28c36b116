"""Everything a person looks at: one style module (``style``: palette, formats,
saving), the Gantt (``gantt``; ``bars``: bars below a pixel merged;
``launch_waits``: host-bound kernels' waits for their launch), memory
(``memory_plot``), communication (``comms_plot``), sweep (``sweep_plot``),
search (``search_plot``) and link-utilisation (``link_heatmap``) figures, the
Perfetto trace and tables (``exports``), which ranks a view shows
(``selection``), the run directory (``run_dir`` writes one, ``finished_run``
reads one back, ``out_dirs`` puts it in place whole, ``alongside`` draws a large
run's figures in a forked child).

May import ``simulator.base``, ``simulator.analysis`` and ``simulator.engine``
(a folded run's records).
"""
