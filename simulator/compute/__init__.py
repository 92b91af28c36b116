"""Kernel durations: the roofline compute model (``model``), GEMMs by their output
tiles (``gemm``), a MoE layer's grouped GEMMs at few tokens per expert per GPU
generation (``grouped``), fused attention by kernel and shape (``attention``),
corrections from a measured kernel table (``table``; the file read and checked
by ``kernel_file``), host-bound launches (``host``; each kernel's host seconds
per framework and CUDA graph scope: ``host_costs``), compute slowed beside NCCL
kernels (``contention``), seeded jitter and its slowest-member approximation
(``jitter``), stragglers (``stragglers``), throttled clocks (``throttle``), and
the model's least-squares calibration to measured kernel tables
(``calibration``; ``kineto``: a table from a profiler trace).

May import ``simulator.base``, ``topologies`` (GPU specs) and ``workloads``
(kernel FLOP conventions, low-precision formats).
"""
