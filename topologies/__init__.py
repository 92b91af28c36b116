"""What a simulation runs on: GPU specs, cluster presets and NetworkX fabric builders.

Everything here is in SI units (bytes, bytes/s, seconds, FLOP/s) and imports
neither SimPy nor ``workloads``.
"""

from topologies.clusters import CLUSTERS, ClusterSpec, FabricKind, FabricSpec, IntraNode
from topologies.fabric import build_cluster
from topologies.gpus import GPUS, GpuSpec

__all__ = ["CLUSTERS", "GPUS", "ClusterSpec", "FabricKind", "FabricSpec", "GpuSpec",
           "IntraNode", "build_cluster"]
