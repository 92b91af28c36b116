"""The discrete-event engine: the reference core (``core``) and its speed-ups as
plug-ins, each in its own module with an equivalence test as its contract.

May import ``simulator.base``, ``simulator.network`` and ``simulator.collectives``;
never ``topologies`` or ``workloads`` (it gets a Program, a placement, compute
durations, a Fabric and a collective lowering).
"""
