"""Pure analysis of a finished run: interval algebra and per-rank/per-stream
tables (``timeline``), the critical path (``critical_path``), the summary
(``summary``; every key's meaning: ``summary_keys``), the communication
profile (``comms``), link traffic (``traffic``), blame (``blame``: the critical
path's excess over the ideal charged to stragglers, loaded links and other
jobs; ``link_load``: what each call put on each link, on the fabric in the
state it ran in, and what the run ran on) and the parallel groups that leave
their NVLink domain (``domains``).

May import ``simulator.base``, ``simulator.network`` and ``simulator.collectives``
(traffic re-lowers logged calls); draws nothing and writes no file.
"""
