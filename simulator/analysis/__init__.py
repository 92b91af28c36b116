"""Pure analysis of a finished run: interval algebra and per-rank/per-stream
tables (``timeline``), the critical path, the summary, the communication
profile (``comms``) and link traffic (``traffic``).

May import ``simulator.base``, ``simulator.network`` and ``simulator.collectives``
(traffic re-lowers logged calls); draws nothing and writes no file.
"""
