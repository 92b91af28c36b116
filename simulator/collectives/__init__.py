"""NCCL-style collectives: NCCL's tables (``nccl``), one module per algorithm
(``ring``, ``tree``, ``nvls``, ``pat``, ``direct``, ``collnet``; ``plan`` for what
they share) in a registry (``algorithms``), the tuner that lowers a call to flows
and a latency (``tuner``), a fabric in each of its states with its lowering,
built in one place for every user (``states``), and the nccl-tests sweep
(``nccl_tests``).

May import ``simulator.base`` and ``simulator.network``.
"""
