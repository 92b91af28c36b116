"""``clustersim presets``: the cluster, GPU and model presets, each described
from its registry entry (``clusters``, ``gpus``, ``models``; the generated
reference lists the same)."""

from __future__ import annotations

import argparse


def add_parser(sub) -> None:
    sub.add_parser("presets", help="list cluster, GPU and model presets")


def clusters() -> list[tuple[str, str]]:
    """(name, what it is) of each cluster preset: its description and figures."""
    from topologies import CLUSTERS

    out = []
    for c in CLUSTERS.values():
        nvls = ", NVLS" if c.nvls else ""
        domain = (f" in NVLink domains of {c.domain} GPUs" if c.domain != c.gpus_per_node
                  else "")
        out.append((c.name, f"{c.gpus_per_node} x {c.gpu}{domain}, {c.intra_node.value}{nvls} "
                    f"{c.nvlink_bandwidth / 1e9:g} GB/s per GPU (x{c.nvlink_efficiency:g} "
                    f"reached), {c.nics_per_node} NICs x {c.nic_bandwidth * 8 / 1e9:g} Gb/s "
                    f"(x{c.nic_efficiency:g}), {c.fabric.name}, link latency "
                    f"{c.link_latency * 1e6:g} us; host {c.host_memory / 1e9:g} GB a GPU, "
                    f"{c.host_link_bandwidth / 1e9:g} GB/s to it"))
    return out


def gpus() -> list[tuple[str, str]]:
    """(name, its figures) of each GPU preset (once, not per alias)."""
    from topologies import GPUS

    out = []
    for g in {id(g): g for g in GPUS.values()}.values():
        peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in g.peak_flops.items())
        also = f" (also {', '.join(g.aliases)})" if g.aliases else ""
        nvlink = (f", NVLink {g.nvlink_generation} {g.nvlink_bandwidth / 1e9:g} GB/s per "
                  "direction" if g.nvlink_generation else "")
        power = f", {g.power_watts:g} W" if g.power_watts else ""
        lowp = {k: v for k, v in g.low_precision.items() if k != "cast"}
        low = (", low precision (of BF16's efficiency): " + ", ".join(
            f"{k} x{v:g}" for k, v in lowp.items()) + f", casts at x{g.low_precision['cast']:g}"
            " of streaming bandwidth" if "cast" in g.low_precision else "")
        out.append((g.name, f"{g.memory_bytes / 2**30:.0f} GiB, HBM "
                    f"{g.hbm_bandwidth / 1e12:g} TB/s, dense TFLOP/s: {peaks}{nvlink}{power}"
                    f"{also}{low}"))
    return out


def models() -> list[tuple[str, str]]:
    """(name, its shape) of each model preset."""
    from workloads.kernels import parameter_count
    from workloads.models import MODELS

    return [(m.name, f"{parameter_count(m, 2048) / 1e9:7.2f}B params, {m.layers} layers, "
             f"hidden {m.hidden}, {m.heads} heads "
             f"({'MLA' if m.mla else f'{m.kv_heads} kv'}), ffn {m.ffn_hidden}, "
             f"vocab {m.vocab}, {m.mlp.value}"
             + (f", {m.experts} experts (top {m.top_k})" if m.experts else ""))
            for m in MODELS.values()]


def run(_args: argparse.Namespace) -> int:
    for title, rows, width in (("clusters (cluster.preset):", clusters(), 11),
                               ("gpus (cluster.gpu):", gpus(), 15),
                               ("models (model.preset):", models(), 10)):
        print(title)
        for name, text in rows:
            print(f"  {name:{width}} {text}")
    return 0
