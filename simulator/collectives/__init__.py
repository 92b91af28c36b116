"""NCCL-style collectives: NCCL's tables (``nccl``), one module per algorithm
(``ring``, ``tree``, ``nvls``, ``pat``, ``direct``, ``collnet``; ``plan`` for what
they share) in a registry (``algorithms``), the tuner that lowers a call to flows
and a latency (``tuner``), and the nccl-tests sweep (``nccl_tests``).

May import ``simulator.base`` and ``simulator.network``.
"""
