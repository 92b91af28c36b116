"""Kernel durations: the roofline compute model (``model``), seeded jitter and its
slowest-member approximation (``jitter``), and the model's least-squares
calibration to measured kernel tables (``calibration``).

May import ``simulator.base`` and ``topologies`` (GPU specs).
"""
