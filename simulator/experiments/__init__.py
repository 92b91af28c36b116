"""The composition layer: one run (``runner``: scenario -> fabric + program ->
engine -> RunResult), sweeps, and the validation set. The only layer, with the
CLI, that joins ``topologies``, ``workloads`` and the engine.

May import every ``simulator`` package except ``simulator.cli``.
"""
