"""What runs and how it is parallelised: models, kernels, memory, schedules, one
module per parallel strategy (``strategies``) and the program builder (``program``).

Pure Python: it may import ``simulator.base`` only (no SimPy, no ``topologies``);
the output is a ``simulator.base.ir.Program``.
"""
