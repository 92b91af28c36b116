"""What runs and how it is parallelised: models, kernels, memory, programs.

Pure Python (no SimPy, no ``topologies``); the output is a ``simulator.base.ir.Program``.
"""
