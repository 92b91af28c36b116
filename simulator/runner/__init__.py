"""One run: a scenario simulated for one iteration, from setup to result.

``run(scenario)`` (``simulate``) is the whole of it, in order: the scenario's
set of jobs (``jobs``: a plain scenario's one training job, or a ``jobs``
section's, merged into one program; several: each training job alone first,
background traffic's reach), then for each run the setup
(``setup``: the program, its placement on the fabric's states, the compute
durations, the GPUs' speeds and clocks), the method (``symmetry``: which
ranks to simulate and with which engine plug-ins, the fastest exact one by
default), the loops that run the engine until its result holds (``loops``:
lockstep refinement when a class of ranks diverges, the NCCL-beside-compute
slow-down solved as a fixed point over runs in ``contention``), and the result
(``result``: the span and call tables, the summary, blame, the RunResult;
``host_waits``: each compute span's wait for its launch).

May import every ``simulator`` package below it (``config`` and lower); the
experiments (sweeps, validation, the layout search) and the CLI run it.
"""
