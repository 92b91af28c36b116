"""The discrete-event engine: the reference core (``core``), its records
(``records``; ``call_log``: the communication log) and its speed-ups as plug-ins,
each in its own module with an equivalence test as its contract (``batching``,
``layer_spans``, ``folding``, ``gangs``, ``call_groups``, ``exclusive`` with
``link_sharing``, ``passes``, ``pipeline_streams``; each overrides the core's
``HOOKS`` and uses its ``PLUGIN_API``), composed by ``assemble`` (the engine's
API for a run: the registry, the rules of a plan and the typed ``Plan``);
``folded`` holds a folded run's classes and its mates' log rows.

May import ``simulator.base``, ``simulator.network`` and ``simulator.collectives``;
never ``topologies`` or ``workloads`` (it gets a Program, a placement, compute
durations, a Fabric and a collective lowering).
"""
