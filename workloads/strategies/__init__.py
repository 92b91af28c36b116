"""Parallel strategies, one module each: its dimensions, its groups, its layout
checks, its ops.

``tensor``, ``context``, ``data``, ``pipeline``, ``sharded`` (ZeRO-3/FSDP) and
``expert`` (expert parallelism and its token exchanges) each provide
``DIMENSIONS`` (their parallel dimensions, declared once: ``dimension``'s
``Dimension``, with the stream, the search's values and rule), ``check(model,
training, parallel)`` (raise ``LayoutError`` naming the scenario keys) and
``groups(ctx, layout)`` (their rank groups, named after their dimension),
plus the functions ``workloads.program`` calls where their ops go.
``workloads.program.STRATEGIES`` lists them; adding a parallelism = one module
here + one entry there, its ``ParallelSpec`` field, and the call where its ops
go in a layer; the layout search and ``clustersim search`` read its dimension.
"""
