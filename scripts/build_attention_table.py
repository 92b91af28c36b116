"""Build ``topologies/data/kernels/attention.csv``, the attention kernels'
throughput by shape that ``simulator.compute.attention`` reads, from its
sources, each row citing its own:

- ``topologies/data/kernels/{h100,h200}/attention_sweep.csv``: the project's
  H100 and H200 sweeps (``scripts/measure_kernels.py --sweep attention``;
  PyTorch 2.11's FlashAttention-2 and cuDNN 9.19 backends of
  scaled_dot_product_attention);
- ``topologies/data/kernels/sources/flash_attention.csv``: the FlashAttention-2
  and -3 papers' benchmark figures (A100, H100), transcribed bar by bar: A100's
  FlashAttention-2 and Triton rows (Dao 2023, Fig. 5 forward, Fig. 6 backward),
  H100's FlashAttention-3 rows and cuDNN's FP8 forward (Shah et al. 2024, Fig. 5,
  6 and the FP8 figure; H100's BF16 FlashAttention-2 and cuDNN are the measured
  rows);
- ``topologies/data/kernels/sources/cudnn_sdpa.csv``: cuDNN's published SDPA
  training benchmark (NVIDIA/cudnn-frontend, benchmark/sdpa_benchmark_training,
  every results file of its history transcribed with its commit): GB200 and
  GB300 cuDNN 9.22 at HEAD (Llama-3.1, GPT-OSS and Qwen3.5 shapes without a
  window, BF16 and FP8), B200 at 0b1577c (cuDNN's frontend and native
  FlashAttention-2 2.7, Llama-3.1-405B shapes, causal);
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
SOURCE = "measured on {} (PyTorch 2.11 SDPA; data/kernels/{}/)"
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


PAPER_GPUS = {"A100 80GB SXM4": "a100-sxm-80gb", "H100 80GB SXM5": "h100-sxm-80gb"}
PAPER_KERNELS = {  # (GPU, figure's method) -> kernel; H100's FA2 and cuDNN are measured
    ("a100-sxm-80gb", "FlashAttention-2"): "flash2",
    ("a100-sxm-80gb", "FlashAttention Triton"): "triton",
    ("h100-sxm-80gb", "FlashAttention-3"): "flash3",
    ("h100-sxm-80gb", "cuDNN"): "cudnn"}  # (FP8 only: the measured rows are BF16)
TOKENS, HIDDEN = 16384, 2048  # the papers' setting: batch 16k / seq, heads 2048 / head size


def paper_rows() -> pd.DataFrame:
    """The FlashAttention papers' printed bars (forward and backward figures)."""
    f = pd.read_csv(KERNELS / "sources" / "flash_attention.csv")
    f = f[f["tflops"].notna() & f["pass"].isin(["forward", "backward"])]
    f = f.assign(gpu=f["gpu"].map(PAPER_GPUS), dtype=f["dtype"].map(
        {"FP16/BF16": "bf16", "FP8": "fp8"}))
    f["kernel"] = [PAPER_KERNELS.get((g, m)) for g, m in zip(f["gpu"], f["method"],
                                                             strict=True)]
    f = f[f["kernel"].notna() & ~((f["kernel"] == "cudnn") & (f["dtype"] == "bf16"))]
    paper = f["figure"].str.startswith("FA3").map({True: "Shah et al. 2024, arXiv 2407.08608",
                                                  False: "Dao 2023, arXiv 2307.08691"})
    return f.assign(batch=TOKENS // f["seq"], heads=HIDDEN // f["head_dim"], source=paper,
                    causal=f["causal"].astype(str).str.lower() == "true")[COLUMNS]


def triton_on_h100(table: pd.DataFrame) -> pd.DataFrame:
    """flash-attn's Triton kernel on H100 (see the module docstring): H100's
    measured FlashAttention-2 times A100's Triton / FlashAttention-2 ratio."""
    key = ["pass", "causal", "head_dim", "seq"]
    a100 = table[table["gpu"] == "a100-sxm-80gb"]
    ratio = a100[a100["kernel"] == "triton"].merge(
        a100[a100["kernel"] == "flash2"], on=key, suffixes=("", "_fa2"))
    ratio["ratio"] = ratio["tflops"] / ratio["tflops_fa2"]
    h100 = table[(table["gpu"] == "h100-sxm-80gb") & (table["kernel"] == "flash2")]
    out = h100.merge(ratio[[*key, "ratio"]], on=key)
    return out.assign(kernel="triton", tflops=(out["tflops"] * out["ratio"]).round(1),
                      source="H100's measured FlashAttention-2 x A100's Triton / "
                             "FlashAttention-2 (Dao 2023)")[COLUMNS]


CUDNN_GPUS = {"GB200": "gb200-186gb", "GB300": "gb300-288gb", "B200": "b200-sxm-180gb"}
B200_COMMIT = "0b1577c8c83401237d601d0d0db5210506705396"
CUDNN_BACKENDS = {"cudnn": "cudnn", "cudnn_fe": "cudnn", "flash_attention": "flash2"}


def cudnn_rows() -> pd.DataFrame:
    """cuDNN's benchmark rows the table uses (see the module docstring): equal Q/K
    and V head sizes, no window, measured, non-deterministic backward."""
    c = pd.read_csv(KERNELS / "sources" / "cudnn_sdpa.csv")
    usable = (c["success"].astype(str) == "True") & c["sliding_window_size"].isna() & (
        c["head_dim"] == c["head_dim_vo"]) & (c["deterministic_bwd"].astype(str) != "True")
    head = (c["in_head"] == "yes") & c["gpu"].isin(["GB200", "GB300"]) & (c["backend"] == "cudnn")
    b200 = (c["gpu"] == "B200") & (c["commit"] == B200_COMMIT) & c["backend"].isin(
        ["cudnn_fe", "flash_attention"])
    c = c[usable & (head | b200) & c["dtype"].isin(["bfloat16", "fp8"])]
    out = []
    for name, column in (("forward", "fwd_tflops"), ("backward", "bwd_tflops")):
        part = c[c[column].notna()]
        out.append(pd.DataFrame({
            "gpu": part["gpu"].map(CUDNN_GPUS), "kernel": part["backend"].map(CUDNN_BACKENDS),
            "dtype": part["dtype"].map({"bfloat16": "bf16", "fp8": "fp8"}), "pass": name,
            "causal": part["causal"], "head_dim": part["head_dim"], "seq": part["q_seqlen"],
            "batch": part["batch"], "heads": part["num_q_heads"], "tflops": part[column],
            "source": "NVIDIA/cudnn-frontend SDPA benchmark @" + part["commit"].str[:7]}))
    return pd.concat(out)


def main() -> None:
    table = pd.concat([*(measured(f) for f in MEASURED), paper_rows(), cudnn_rows()],
                      ignore_index=True)
    table = pd.concat([table, triton_on_h100(table)], ignore_index=True)
    table = table.sort_values(["gpu", "kernel", "dtype", "pass", "causal", "head_dim", "seq"])
    header = ("# Attention kernels' throughput by shape (simulator.compute.attention), "
              "built by scripts/build_attention_table.py from the sources it names.\n"
              "# TFLOP/s counted as the FlashAttention papers count: forward 4 b s^2 h d, "
              "halved when causal; backward 2.5x the forward.\n")
    OUT.write_text(header + table[COLUMNS].to_csv(index=False))
    print(f"{len(table)} rows -> {OUT}")


if __name__ == "__main__":
    main()
