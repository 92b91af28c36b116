"""What a simulation runs on: GPU specs (``gpus``), cluster presets (``clusters``),
the cluster builder (``builder``; ``links``: the wiring helpers it shares),
rack-scale NVLink domains (``nvlink_domain``), one module per inter-node network
kind (``networks``, each with its settings, builder and routing), routing
(``routing``), fabric files (``graph_file``), degraded or failed parts
(``faults``) and several jobs' nodes (``placement``).

Everything here is in SI units (bytes, bytes/s, seconds, FLOP/s). It may import
``simulator.base`` only: neither SimPy nor ``workloads``.
"""

from topologies.builder import build_cluster
from topologies.clusters import CLUSTERS, ClusterSpec, IntraNode
from topologies.gpus import GPUS, GpuSpec
from topologies.networks import NETWORKS, NetworkSpec

__all__ = ["CLUSTERS", "GPUS", "NETWORKS", "ClusterSpec", "GpuSpec", "IntraNode",
           "NetworkSpec", "build_cluster"]
