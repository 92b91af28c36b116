"""Cluster presets: the figures a fabric builder needs for a named system.

Sources (see also ``docs/reference.md``): DGX A100 has 8 A100 GPUs on NVSwitch
(NVLink3, 300 GB/s per GPU per direction) and 8 compute HCAs at HDR 200 Gb/s;
DGX H100 has 8 H100 on NVSwitch (NVLink4, 450 GB/s) and 8 NDR 400 Gb/s HCAs;
an ALCF Polaris node has 4 A100-40GB with NVLink between every pair (12 links of
25 GB/s per GPU, so 100 GB/s to each peer) and 2 Slingshot-11 NICs of 200 Gb/s,
GPUs 0-1 next to NIC 0 and GPUs 2-3 next to NIC 1.

The inter-node fabric is a two-level leaf/spine fat tree for every preset
(Polaris's dragonfly is approximated by it; see the README's limits).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import Enum
from types import MappingProxyType


class IntraNode(Enum):
    """How the GPUs of one node are connected."""

    NVSWITCH = "nvswitch"  # every GPU has one NVLink port group to a non-blocking switch
    MESH = "mesh"  # direct NVLink between every pair; per-GPU bandwidth split evenly


@dataclass(frozen=True)
class ClusterSpec:
    """A named system; every field can be overridden from a scenario."""

    name: str
    gpu: str
    gpus_per_node: int
    intra_node: IntraNode
    nvlink_bandwidth: float  # bytes/s per GPU per direction
    nics_per_node: int
    nic_bandwidth: float  # bytes/s per NIC per direction
    link_latency: float = 1e-6  # seconds per inter-node fabric link (NIC-leaf, leaf-spine)
    nvlink_latency: float = 0.5e-6  # seconds per NVLink hop
    pcie_bandwidth: float = 32e9  # GPU <-> NIC, bytes/s per direction (PCIe Gen4 x16)
    pcie_latency: float = 0.5e-6
    oversubscription: float = 1.0  # leaf downlink : uplink bandwidth
    leaf_ports: int = 32  # NIC ports per leaf switch
    description: str = ""


CLUSTERS: Mapping[str, ClusterSpec] = MappingProxyType(
    {
        "dgx-a100": ClusterSpec(
            name="dgx-a100",
            gpu="a100-sxm-80gb",
            gpus_per_node=8,
            intra_node=IntraNode.NVSWITCH,
            nvlink_bandwidth=300e9,
            nics_per_node=8,
            nic_bandwidth=25e9,
            description="NVIDIA DGX A100: 8x A100-80GB, NVSwitch, 8x HDR 200 Gb/s",
        ),
        "dgx-h100": ClusterSpec(
            name="dgx-h100",
            gpu="h100-sxm-80gb",
            gpus_per_node=8,
            intra_node=IntraNode.NVSWITCH,
            nvlink_bandwidth=450e9,
            nics_per_node=8,
            nic_bandwidth=50e9,
            pcie_bandwidth=64e9,  # PCIe Gen5 x16
            description="NVIDIA DGX H100: 8x H100-80GB, NVSwitch, 8x NDR 400 Gb/s",
        ),
        "polaris": ClusterSpec(
            name="polaris",
            gpu="a100-sxm-40gb",
            gpus_per_node=4,
            intra_node=IntraNode.MESH,
            nvlink_bandwidth=300e9,
            nics_per_node=2,
            nic_bandwidth=25e9,
            link_latency=1.5e-6,
            description="ALCF Polaris: 4x A100-40GB, NVLink mesh, 2x Slingshot-11 200 Gb/s",
        ),
    }
)
