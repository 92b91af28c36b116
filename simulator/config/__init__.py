"""Scenario files: strict loading into immutable specs (``scenario``, one module per
section: ``cluster``, ``model``, ``training``, ``network``, ``simulation``, ``jobs``,
``workload``: a program from Chakra traces), ``--set``
overrides (``overrides``), and ``ScenarioError`` (one line naming the dotted key,
the value and what is allowed).

May import ``simulator.base``, ``simulator.collectives`` (algorithm and protocol
names), ``simulator.compute`` (kernel-table errors), ``topologies`` and
``workloads``.
"""
