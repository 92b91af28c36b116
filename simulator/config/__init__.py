"""Scenario files: strict loading into immutable specs, ``--set`` overrides, and
``ScenarioError`` (one line naming the dotted key, the value and what is allowed).

May import ``simulator.base``, ``simulator.collectives`` (algorithm and protocol
names), ``topologies`` and ``workloads``.
"""
