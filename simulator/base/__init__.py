"""The vocabulary every layer shares: the op IR (``ir``) and SI unit strings (``units``).

No SimPy, no other ``simulator`` package: ``workloads`` and ``topologies`` may
import this package and nothing else of ``simulator``.
"""
