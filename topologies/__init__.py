"""What a simulation runs on: GPU specs, cluster presets and NetworkX fabric builders.

Everything here is in SI units (bytes, bytes/s, seconds, FLOP/s) and imports
neither SimPy nor ``workloads``.
"""

from topologies.builder import build_cluster
from topologies.clusters import CLUSTERS, ClusterSpec, IntraNode
from topologies.gpus import GPUS, GpuSpec
from topologies.networks import NETWORKS, NetworkSpec

__all__ = ["CLUSTERS", "GPUS", "NETWORKS", "ClusterSpec", "GpuSpec", "IntraNode",
           "NetworkSpec", "build_cluster"]
