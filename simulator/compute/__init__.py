"""Kernel durations: the roofline compute model with seeded jitter (``model``) and
its least-squares calibration to measured kernel tables (``calibration``).

May import ``simulator.base`` and ``topologies`` (GPU specs).
"""
