"""NCCL-style collectives: NCCL's tables (``nccl``), one module per algorithm
(``ring``, ``tree``, ``nvls``, ``pat``, ``direct``, ``collnet``; ``plan`` for what
they share; ``expert_exchange``: DeepEP's and HybridEP's dispatch and combine at
their published rates; ``p2p``: NCCL's point-to-point protocol and channels) in
a registry (``algorithms``), the tuner that lowers a call to flows and a latency
(``tuner``), a fabric in each of its states with its lowering, built in one
place for every user (``states``), and the nccl-tests sweep (``nccl_tests``).

May import ``simulator.base`` and ``simulator.network``.
"""
