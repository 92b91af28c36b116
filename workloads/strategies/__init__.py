"""Parallel strategies, one module each: its groups, its layout checks, its ops.

``tensor``, ``context``, ``data``, ``pipeline``, ``sharded`` (ZeRO-3/FSDP) and
``expert`` (expert parallelism and its token exchanges) each provide
``check(model, training, parallel)`` (raise ``LayoutError`` naming the scenario
keys) and ``groups(ctx, layout)`` (their rank groups, named after their stream),
plus the functions ``workloads.program`` calls where their ops go.
``workloads.program.STRATEGIES`` lists them; adding a parallelism = one module
here + one entry there (and the call where its ops go in a layer).
"""
