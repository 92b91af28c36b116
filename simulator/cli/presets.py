"""``clustersim presets``: the cluster, GPU and model presets."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sub.add_parser("presets", help="list cluster, GPU and model presets")


def run(_args: argparse.Namespace) -> int:
    from topologies import CLUSTERS, GPUS
    from workloads.kernels import parameter_count
    from workloads.models import MODELS

    print("clusters (cluster.preset):")
    for c in CLUSTERS.values():
        nvls = ", NVLS" if c.nvls else ""
        domain = (f" in NVLink domains of {c.domain} GPUs" if c.domain != c.gpus_per_node
                  else "")
        print(f"  {c.name:11} {c.gpus_per_node} x {c.gpu}{domain}, {c.intra_node.value}{nvls} "
              f"{c.nvlink_bandwidth / 1e9:g} GB/s per GPU (x{c.nvlink_efficiency:g} reached), "
              f"{c.nics_per_node} NICs x {c.nic_bandwidth * 8 / 1e9:g} Gb/s "
              f"(x{c.nic_efficiency:g}), {c.fabric.name}, link latency "
              f"{c.link_latency * 1e6:g} us; host {c.host_memory / 1e9:g} GB a GPU, "
              f"{c.host_link_bandwidth / 1e9:g} GB/s to it")
    print("gpus (cluster.gpu):")
    for g in {id(g): g for g in GPUS.values()}.values():  # (once, not per alias)
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in g.peak_flops.items())
        also = f" (also {', '.join(g.aliases)})" if g.aliases else ""
        nvlink = (f", NVLink {g.nvlink_generation} {g.nvlink_bandwidth / 1e9:g} GB/s per "
                  "direction" if g.nvlink_generation else "")
        power = f", {g.power_watts:g} W" if g.power_watts else ""
        lowp = {k: v for k, v in g.low_precision.items() if k != "cast"}
        low = (", low precision (of BF16's efficiency): " + ", ".join(
            f"{k} x{v:g}" for k, v in lowp.items()) + f", casts at x{g.low_precision['cast']:g}"
            " of streaming bandwidth" if "cast" in g.low_precision else "")
        print(f"  {g.name:15} {g.memory_bytes / 2**30:.0f} GiB, HBM "
              f"{g.hbm_bandwidth / 1e12:g} TB/s, dense TFLOP/s: {peaks}{nvlink}{power}{also}"
              f"{low}")
    print("models (model.preset):")
    for m in MODELS.values():
        params = parameter_count(m, 2048) / 1e9
        print(f"  {m.name:10} {params:7.2f}B params, {m.layers} layers, hidden {m.hidden}, "
              f"{m.heads} heads ({'MLA' if m.mla else f'{m.kv_heads} kv'}), ffn {m.ffn_hidden}, "
              f"vocab {m.vocab}, {m.mlp.value}"
              + (f", {m.experts} experts (top {m.top_k})" if m.experts else ""))
    return 0
