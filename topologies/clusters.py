"""Cluster presets: the figures a fabric builder needs for a named system.

Sources (see ``docs/reference.md``): DGX A100 has 8 A100 GPUs on NVSwitch
(NVLink3, 300 GB/s per GPU per direction) and 8 compute HCAs at HDR 200 Gb/s;
DGX H100 / H200 have 8 GPUs on NVSwitch (NVLink4, 450 GB/s, with NVLink SHARP)
and 8 NDR 400 Gb/s HCAs; an ALCF Polaris node has 4 A100-40GB with NVLink
between every pair (12 links of 25 GB/s per GPU, so 100 GB/s to each peer) and
2 Slingshot-11 NICs of 200 Gb/s, GPUs 0-1 next to NIC 0 and 2-3 next to NIC 1,
on a dragonfly.

Efficiencies: the share of a link's line rate that NCCL's copy kernels reach.
- NVLink on A100: NCCL's own model caps A100 bus bandwidth at 235 GB/s
  (``tuning.cc``), 0.783 of 300.
- NVLink on H100: "protocol overhead ~20% gives ~370 GB/s effective" of 450
  (NCCL maintainer, nccl-tests issue #212): 0.822.
- NVLS on H100: the same maintainer expects ~275 GB/s algorithm bandwidth;
  NVLS moves S*(n+1)/n bytes per GPU each way, 309 GB/s, i.e. 0.836 of the
  effective NVLink rate.
- InfiniBand: 192 GB/s all-reduce bus bandwidth from 8 x 25 GB/s HDR NICs
  (NCCL maintainer, NCCL issue #812): 0.96.

DGX B200 (DGX B200 datasheet): 8 B200 on NVSwitch (NVLink 5, 1.8 TB/s per GPU
both ways: 900 GB/s per direction, with NVLink SHARP), 8 ConnectX-7 400 Gb/s for
the compute fabric, PCIe Gen5 to the NICs. NVLink 5's and NVLS's efficiencies
are those measured on GB200 (``_NVLINK5``; the same NVLink 5 and NVSwitch
generation). DGX H800: a DGX
H100 whose NVLink is cut to 400 GB/s per GPU both ways (200 GB/s per direction;
``h800-sxm-80gb``), 8 x 400 Gb/s InfiniBand as DeepSeek-V3's cluster (arXiv
2412.19437, Sec. 3.1: NVLink and NVSwitch inside nodes, InfiniBand between).

GB200 NVL72 and GB300 NVL72 (NVIDIA GB200 NVL72 / GB300 NVL72 product pages
and the DGX GB200 user guide): a rack of 18 compute trays, each with 2 Grace
CPUs and 4 Blackwell GPUs, whose 72 GPUs reach one another through 9 NVLink
switch trays at full NVLink 5 bandwidth (1.8 TB/s per GPU both ways, 130 TB/s
in all), with NVLink SHARP. Built as one non-blocking NVSwitch per NVLink
domain (``nvlink_domain`` GPUs; the switch trays' 18 chips give every GPU one
link to each, so no pair of GPUs shares a bottleneck). Scale-out: one NIC per
GPU, ConnectX-7 400 Gb/s on PCIe Gen5 x16 in GB200 trays, ConnectX-8 800 Gb/s
on PCIe Gen6 x16 (128 GB/s per direction) in GB300 trays. ``nodes`` counts
trays, as schedulers and Megatron-Bridge's recipes count them.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType

from simulator.base.fields import (
    BANDWIDTH,
    EFFICIENCY,
    LATENCY,
    SIZE,
    boolean,
    choice,
    integer,
    number,
    setting,
)
from topologies.gpus import GPUS
from topologies.networks import NetworkSpec
from topologies.networks.dragonfly import Dragonfly
from topologies.networks.fat_tree import FatTree


class IntraNode(Enum):
    """How the GPUs of one node are connected."""

    NVSWITCH = "nvswitch"  # every GPU has one NVLink port group to a non-blocking switch
    MESH = "mesh"  # direct NVLink between every pair; per-GPU bandwidth split evenly


@dataclass(frozen=True)
class ClusterSpec:
    """A named system; the fields declared with ``setting`` can be overridden from a
    scenario's ``cluster`` section, checked as declared here."""

    name: str
    gpu: str = setting(choice(GPUS))  # the GPU (its specs: cluster.gpu presets)
    gpus_per_node: int = setting(integer(1))  # GPUs per server (a tray of a rack)
    intra_node: IntraNode
    nvlink_bandwidth: float = setting(BANDWIDTH)  # bytes/s per GPU per direction
    nics_per_node: int = setting(integer(1))  # network adapters per server
    nic_bandwidth: float = setting(BANDWIDTH)  # bytes/s per NIC per direction
    link_latency: float = setting(LATENCY, 1e-6)  # seconds per inter-node fabric link
    nvlink_latency: float = setting(LATENCY, 0.5e-6)  # seconds per NVLink hop
    pcie_bandwidth: float = setting(BANDWIDTH, 32e9)  # GPU <-> NIC, bytes/s per direction
    pcie_latency: float = 0.5e-6
    nvlink_efficiency: float = setting(EFFICIENCY, 0.783)  # share of NVLink bandwidth reached
    nic_efficiency: float = setting(EFFICIENCY, 0.96)  # share of a NIC's bandwidth reached
    nvls: bool = setting(boolean, False)  # NVSwitch with NVLink SHARP (in-switch reductions)
    nvls_efficiency: float = setting(EFFICIENCY, 0.836)  # share of NVLink reached by NVLS
    # how a switch picks among equal-cost paths: "d-mod-k" (InfiniBand's ftree
    # routing: by destination, collision-free for permutations) or "hash" (ECMP
    # on Ethernet/RoCE: each GPU pair's flow pinned to a path by a seeded hash)
    ecmp: str = setting(choice(("d-mod-k", "hash")), "d-mod-k")
    ecmp_seed: int = setting(integer(0), 0)  # the seed of ecmp: hash's path choice
    sharp: bool = setting(boolean, False)  # switches reduce in the network (InfiniBand SHARP)
    fabric: NetworkSpec = field(default_factory=FatTree)  # the inter-node network
    # GPUs per NVLink domain, a whole number of servers (default: one server's). A
    # domain of several servers (trays) has one NVSwitch fabric joining all its GPUs,
    # as NCCL's multi-node NVLink treats one node; each GPU keeps its own NIC for
    # traffic between domains.
    nvlink_domain: int = setting(integer(1), 0)
    # Host memory and the GPU's link to it, per GPU (a server's shared equally): what
    # activation and optimizer offloading use (``host_rates``; sources in HOSTS)
    host_memory: float = setting(SIZE, 256e9)  # bytes of host DRAM per GPU
    host_memory_bandwidth: float = setting(BANDWIDTH, 76.8e9)  # bytes/s per GPU
    host_link_bandwidth: float = setting(BANDWIDTH, 64e9)  # bytes/s each way (PCIe Gen5 x16)
    host_link_efficiency: float = setting(EFFICIENCY, 0.8125)  # share of it copies reach
    # the host CPU's pace at PyTorch's eager dispatch: the CPU time of one op relative to
    # the DGX H100's Xeon 8480C, on which training.kernel_launch and the module overheads
    # were measured (compute.host_costs scales both by it; sources in HOSTS)
    host_dispatch: float = setting(number(0.1, 100.0), 1.0)
    description: str = ""

    def host_rates(self) -> tuple[float, float]:
        """(bytes/s a GPU copies to or from host memory, bytes/s of host memory
        bandwidth its host work gets)."""
        return self.host_link_bandwidth * self.host_link_efficiency, self.host_memory_bandwidth

    @property
    def domain(self) -> int:
        """GPUs that share one NVLink fabric (a server's unless ``nvlink_domain``)."""
        return self.nvlink_domain or self.gpus_per_node

    def domain_problem(self) -> str | None:
        """Why this cluster cannot have its NVLink domain, or None."""
        if self.domain == self.gpus_per_node:
            return None
        if self.domain % self.gpus_per_node:
            whole = ", ".join(str(self.gpus_per_node * k) for k in (1, 2, 3))
            return (f"must be whole servers: a multiple of the {self.gpus_per_node} GPUs per "
                    f"server ({whole}, ...)")
        if self.intra_node is not IntraNode.NVSWITCH:
            return (f"an NVLink domain across servers needs NVSwitch; this cluster's GPUs "
                    f"are joined by an NVLink {self.intra_node.value}")
        if self.nics_per_node != self.gpus_per_node:
            return (f"an NVLink domain other than one server's needs one NIC per GPU; this "
                    f"cluster has {self.nics_per_node} NICs for {self.gpus_per_node} GPUs "
                    f"per server")
        return None


# Host memory per GPU (the server's DRAM and its bandwidth over its GPUs) and the
# GPU-host link; copies reach 52 of PCIe Gen5 x16's 64 GB/s (nvbandwidth host to
# device and back on Azure ND H200 v5, Xeon 8480C: 0.8125) and 197 of the 225 GB/s
# per GPU of a Grace superchip's NVLink-C2C (900 GB/s both ways for 2 GPUs; Azure
# ND GB200 v6 nvbandwidth 201 and 193 GB/s: 0.876).
HOSTS = {  # (the x86 hosts' host_dispatch: 1, the pace of the Xeon 8480C measured)
    # DGX A100 user guide: 2x AMD EPYC 7742 (8 channels DDR4-3200, 204.8 GB/s each), 1 TB;
    # PCIe Gen4 x16 to each GPU
    "epyc-7742": dict(host_memory=128e9, host_memory_bandwidth=51.2e9,
                      host_link_bandwidth=32e9),
    # DGX H100/H200 user guide: 2x Xeon Platinum 8480C (8 channels DDR5-4800, 307.2 GB/s
    # each), 2 TB; PCIe Gen5 x16
    "xeon-8480c": dict(host_memory=256e9, host_memory_bandwidth=76.8e9, host_link_bandwidth=64e9),
    # DGX B200 user guide: 2x Xeon Platinum 8570 (8 channels DDR5-5600, 358.4 GB/s each),
    # 2 TB; PCIe Gen5 x16
    "xeon-8570": dict(host_memory=256e9, host_memory_bandwidth=89.6e9, host_link_bandwidth=64e9),
    # ALCF Polaris: 1 AMD EPYC 7543P (8 channels DDR4-3200), 512 GB for 4 GPUs; PCIe Gen4
    "epyc-7543p": dict(host_memory=128e9, host_memory_bandwidth=51.2e9,
                       host_link_bandwidth=32e9),
    # Grace (GB200/GB300 NVL72: 17 TB LPDDR5X and 14 TB/s a rack, 472 GB and 384 GB/s a
    # Grace, per Verda's GB300 NVL72 report) for 2 GPUs; NVLink-C2C 450 GB/s each way a
    # superchip. Its Neoverse V2 cores run PyTorch's eager dispatch slower than the x86
    # hosts: torch.nn.Linear's forward takes 37.08 us of CPU on GB200 against 13.48 us on
    # a DGX H100's Xeon 8480C (TransformerEngine issue #2053, BF16, 8192 x 2048 tokens;
    # GH200 33.17 us, TE's Linear 99.66 and 90.53 us: the same 2.7x): 2.75
    "grace": dict(host_memory=236e9, host_memory_bandwidth=192e9, host_link_bandwidth=225e9,
                  host_link_efficiency=0.876, host_dispatch=37.08 / 13.48),
}

_NVLINK4 = dict(nvlink_bandwidth=450e9, nvlink_efficiency=0.822, nvls=True, nics_per_node=8,
                nic_bandwidth=50e9, pcie_bandwidth=64e9, intra_node=IntraNode.NVSWITCH,
                gpus_per_node=8)
# NVLink 5 (Blackwell), from nccl-tests on GB200: a ring all-reduce over one tray's
# 4 GPUs reaches 679.61 GB/s bus bandwidth at 8 GB (Azure ND GB200 v6, NCCL 2.25.1):
# 0.755 of 900 GB/s; NVLS over the 72 GPUs of an NVL72 rack 429.37 GB/s algorithm
# bandwidth at 8 GB (CoreWeave nccl-tests README, NCCL 2.26.2, in place): 0.643 of
# the S(n+1)/n bytes each GPU moves each way at the ring's effective rate.
_NVLINK5 = {**_NVLINK4, "nvlink_efficiency": 0.755, "nvls_efficiency": 0.643}

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
            **HOSTS["epyc-7742"],
            description="NVIDIA DGX A100: 8x A100-80GB, NVSwitch, 8x HDR 200 Gb/s",
        ),
        "dgx-h100": ClusterSpec(
            name="dgx-h100", gpu="h100-sxm-80gb",
            description="NVIDIA DGX H100: 8x H100-80GB, NVSwitch (NVLS), 8x NDR 400 Gb/s",
            **_NVLINK4, **HOSTS["xeon-8480c"],
        ),
        "dgx-h200": ClusterSpec(
            name="dgx-h200", gpu="h200-sxm-141gb",
            description="NVIDIA DGX H200: 8x H200-141GB, NVSwitch (NVLS), 8x NDR 400 Gb/s",
            **_NVLINK4, **HOSTS["xeon-8480c"],
        ),
        "dgx-b200": ClusterSpec(
            name="dgx-b200", gpu="b200-sxm-180gb",
            description="NVIDIA DGX B200: 8x B200-180GB, NVSwitch (NVLink 5, NVLS), "
                        "8x ConnectX-7 400 Gb/s",
            **{**_NVLINK5, "nvlink_bandwidth": GPUS["b200-sxm-180gb"].nvlink_bandwidth},
            **HOSTS["xeon-8570"],
        ),
        "dgx-h800": ClusterSpec(
            name="dgx-h800", gpu="h800-sxm-80gb",
            description="DGX H800: 8x H800-80GB, NVSwitch (NVLS) at 200 GB/s per GPU per "
                        "direction, 8x NDR 400 Gb/s",
            **{**_NVLINK4, "nvlink_bandwidth": GPUS["h800-sxm-80gb"].nvlink_bandwidth},
            **HOSTS["xeon-8480c"],
        ),
        "gb200-nvl72": ClusterSpec(
            name="gb200-nvl72", gpu="gb200-186gb", nvlink_domain=72,
            description="NVIDIA GB200 NVL72: trays of 4x GB200-186GB (2 Grace), NVLink 5 "
                        "across the 72-GPU rack (NVLS), a ConnectX-7 400 Gb/s per GPU",
            **{**_NVLINK5, "gpus_per_node": 4, "nics_per_node": 4,
               "nvlink_bandwidth": GPUS["gb200-186gb"].nvlink_bandwidth}, **HOSTS["grace"],
        ),
        "gb300-nvl72": ClusterSpec(
            name="gb300-nvl72", gpu="gb300-288gb", nvlink_domain=72,
            description="NVIDIA GB300 NVL72: trays of 4x GB300-288GB (2 Grace), NVLink 5 "
                        "across the 72-GPU rack (NVLS), a ConnectX-8 800 Gb/s per GPU",
            **{**_NVLINK5, "gpus_per_node": 4, "nics_per_node": 4, "nic_bandwidth": 100e9,
               "pcie_bandwidth": 128e9,
               "nvlink_bandwidth": GPUS["gb300-288gb"].nvlink_bandwidth}, **HOSTS["grace"],
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
            fabric=Dragonfly(router_nodes=8, group_routers=8, global_links=8),
            **HOSTS["epyc-7543p"],
            description="ALCF Polaris: 4x A100-40GB, NVLink mesh, 2x Slingshot-11 "
                        "200 Gb/s, dragonfly",
        ),
    }
)
