"""Build ``topologies/data/kernels/attention.csv``, the attention kernels'
throughput by shape that ``simulator.compute.attention`` reads, from its
sources, each row citing its own:

- ``topologies/data/kernels/{h100,h200}/attention_sweep.csv``: the project's
  H100 and H200 sweeps (``scripts/measure_kernels.py --sweep attention``;
  PyTorch 2.11's FlashAttention-2 and cuDNN 9.19 backends of
  scaled_dot_product_attention);
- ``topologies/data/kernels/sources/flash_attention.csv``: the FlashAttention-2
  and -3 papers' benchmark figures (A100, H100), transcribed bar by bar;
- ``topologies/data/kernels/sources/cudnn_sdpa.csv``: cuDNN's published SDPA
  training benchmark (cudnn-frontend), Blackwell;
- derived rows, each saying how: ``triton`` (flash-attn 1.x's Triton kernel,
  which llm-foundry's MPT benchmarks ran) on H100 as FlashAttention-2's H100
  rows times the Triton/FlashAttention-2 ratio of the FA2 paper's A100 figure
  at the same pass, mask, head size and sequence (both kernels issue Ampere's
  mma.sync on Hopper: Triton 2.1 has no wgmma, FlashAttention-2 none either).

Throughputs in the papers' counting: forward 4 b s^2 h d FLOPs, halved when
causal; backward 2.5x that. Run: ``python scripts/build_attention_table.py``.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

KERNELS = Path(__file__).resolve().parents[1] / "topologies" / "data" / "kernels"
OUT = KERNELS / "attention.csv"
COLUMNS = ["gpu", "kernel", "dtype", "pass", "causal", "head_dim", "seq", "batch", "heads",
           "tflops", "source"]
MEASURED = {"h100": "h100-sxm-80gb", "h200": "h200-sxm-141gb"}  # folder -> GPU file
SOURCE = ("measured: scripts/measure_kernels.py --sweep attention, {}, PyTorch 2.11 SDPA "
          "(topologies/data/kernels/{}/)")
BACKENDS = {"flash": "flash2", "cudnn": "cudnn"}


def measured(folder: str) -> pd.DataFrame:
    """A sweep's standard-attention rows (its GQA rows are a check, not the table)."""
    sweep = pd.read_csv(KERNELS / folder / "attention_sweep.csv")
    sweep = sweep[sweep["heads"] == sweep["kv_heads"]]
    half = sweep["causal"].map({True: 2.0, False: 1.0})
    forward = sweep["forward_flops"] / half
    out = []
    for name, seconds, factor in (("forward", "forward_s", 1.0), ("backward", "backward_s", 2.5)):
        out.append(pd.DataFrame({
            "gpu": MEASURED[folder], "kernel": sweep["backend"].map(BACKENDS),
            "dtype": "bf16", "pass": name, "causal": sweep["causal"],
            "head_dim": sweep["head_dim"], "seq": sweep["seq"], "batch": sweep["batch"],
            "heads": sweep["heads"], "tflops": (factor * forward / sweep[seconds] / 1e12).round(1),
            "source": SOURCE.format(folder.upper(), folder)}))
    return pd.concat(out)


def published(name: str) -> pd.DataFrame:
    path = KERNELS / "sources" / name
    return pd.read_csv(path, comment="#")[COLUMNS] if path.exists() else pd.DataFrame(
        columns=COLUMNS)


def main() -> None:
    table = pd.concat([*(measured(f) for f in MEASURED), published("flash_attention_rows.csv"),
                       published("cudnn_rows.csv")], ignore_index=True)
    table = table.sort_values(["gpu", "kernel", "dtype", "pass", "causal", "head_dim", "seq"])
    header = ("# Attention kernels' throughput by shape (simulator.compute.attention), "
              "built by scripts/build_attention_table.py from the sources it names.\n"
              "# TFLOP/s counted as the FlashAttention papers count: forward 4 b s^2 h d, "
              "halved when causal; backward 2.5x the forward.\n")
    OUT.write_text(header + table[COLUMNS].to_csv(index=False))
    print(f"{len(table)} rows -> {OUT}")


if __name__ == "__main__":
    main()
