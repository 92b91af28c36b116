"""The published-scale layouts of ``benchmarks/published.py``, as scenarios.

Every row uses default ``simulation`` options (there is no ``simulation:``
section): what a new user who copies a published layout gets.

Sources of the layouts:

- Korthikanti et al., "Reducing Activation Recomputation in Large Transformer
  Models", MLSys 2023 (arXiv:2205.05198), Table 3: 22B (48 layers, h 6144, 64
  heads, TP8, 8 GPUs, batch 4, micro-batch 4), 175B (TP8 PP8, 64 GPUs, batch
  64), 530B (105 layers, h 20480, 128 heads, TP8 PP35, 280 GPUs, batch 280) and
  1T (128 layers, h 25600, 160 heads, TP8 PP64, 512 GPUs, batch 512), sequence
  2048, interleaved pipelines; Table 5 compares full recomputation with
  selective recomputation plus sequence parallelism.
- Narayanan et al., SC21 (arXiv:2104.04473): GPT-3 175B with PTD-P (TP8 PP12,
  interleaved, two chunks per stage) on 384, 768 and 1536 A100, batch 1536;
  ZeRO-3 175B with data parallelism only on 1536 A100 (their Fig. 10
  comparison).
- GPT-3 175B TP8 PP8 DP16 on 1024 A100 (``benchmarks/gpt3_175b_1024.py``).
- A 15B grouped-query model (Nemotron-4 15B's shape: 32 layers, h 6144, 48
  heads, 8 KV heads, vocabulary 256k, sequence 4096) on 768 H100, TP8 DP96
  ZeRO-1, batch 384.
- GPT-3 175B on 12,288 A100 (MegaScale-like: TP8 PP8 interleaved v6, batch
  6144, selective recomputation, sequence parallel, ZeRO-1).
- GPT-3 175B TP8 DP2 PP32, micro-batch 2, batch 1536 on 512 A100.
- Llama 3 405B on 16,384 H100 (Llama 3 paper, Sec. 3.3: TP8 PP16 DP128,
  sequence 8192, batch 2048 sequences; its first and last stages hold one
  layer fewer, as Meta did to balance the embedding and output layers).
- Today's common interleaved recipes with context parallelism (issue 37; the
  layouts of Megatron-Core/NeMo's Llama 3 pre-training recipes): Llama 3 70B
  with TP4 PP4, 5 virtual stages, CP2 on 2,048 H100 (global batch 4,096,
  sequence 8,192), and Llama 3.1 405B with TP8 PP8, 8 virtual stages, CP2 on
  1,024 H100 (global batch 512, sequence 8,192; its first and last stages
  hold one layer fewer, as NeMo's recipe accounts for the embedding and the
  loss in the pipeline split). Both: micro-batch 1, selective recomputation,
  sequence parallelism, ZeRO-1 (the distributed optimizer).
"""

from __future__ import annotations

from typing import Any

A100, H100 = "dgx-a100", "dgx-h100"


def row(name: str, preset: str, gpus: int, model: dict, training: dict,
        parallelism: dict) -> dict[str, Any]:
    """One scenario; ``gpus`` fills whole 8-GPU servers."""
    return {"name": name, "cluster": {"preset": preset, "nodes": gpus // 8},
            "model": model, "training": {"precision": "bf16", **training},
            "parallelism": parallelism}


def korthikanti(size: str, selective: bool) -> dict[str, Any]:
    """Table 3's layouts, with Table 5's two recomputation settings."""
    layers, hidden, heads, pp, v, batch, micro = {
        "22b": (48, 6144, 64, 1, 1, 4, 4),
        "175b": (96, 12288, 96, 8, 3, 64, 1),
        "530b": (105, 20480, 128, 35, 3, 280, 1),
        "1t": (128, 25600, 160, 64, 2, 512, 1),
    }[size]
    schedule = {"schedule": "interleaved", "virtual_stages": v} if pp > 1 else {}
    return row(f"korthikanti-{size}-{'selective' if selective else 'full'}", A100, 8 * pp,
               {"layers": layers, "hidden": hidden, "heads": heads, "vocab": 51200},
               {"seq_len": 2048, "global_batch": batch, "micro_batch": micro,
                "recompute": "selective" if selective else "full"},
               {"tp": 8, "pp": pp, "dp": 1, "sequence_parallel": selective, **schedule})


def gpt3_175b(gpus: int, tp: int, pp: int, batch: int, micro: int = 1, *,
              schedule: str = "1f1b", v: int = 1, zero: int = 0, selective: bool = False,
              name: str = "") -> dict[str, Any]:
    parallelism: dict[str, Any] = {"tp": tp, "pp": pp, "dp": gpus // (tp * pp),
                                   "schedule": schedule, "zero": zero}
    if v > 1:
        parallelism["virtual_stages"] = v
    if selective:
        parallelism["sequence_parallel"] = True
    return row(name or f"gpt3-175b-tp{tp}-pp{pp}-dp{gpus // (tp * pp)}", A100, gpus,
               {"preset": "gpt3-175b"},
               {"seq_len": 2048, "global_batch": batch, "micro_batch": micro,
                **({"recompute": "selective"} if selective else {})}, parallelism)


def rows() -> list[dict[str, Any]]:
    """Every row of the table, in order."""
    out = [korthikanti(size, selective) for size in ("22b", "175b", "530b", "1t")
           for selective in (False, True)]
    out += [gpt3_175b(g, 8, 12, 1536, schedule="interleaved", v=2,
                      name=f"ptd-p-175b-{g}") for g in (384, 768, 1536)]
    out.append(gpt3_175b(1024, 8, 8, 1536))
    out.append(gpt3_175b(1536, 1, 1, 1536, zero=3, name="zero3-175b-1536"))
    out.append(row("gqa-15b-768-h100", H100, 768,
                   {"layers": 32, "hidden": 6144, "heads": 48, "kv_heads": 8, "ffn_hidden": 24576,
                    "vocab": 256000},
                   {"seq_len": 4096, "global_batch": 384, "micro_batch": 1},
                   {"tp": 8, "dp": 96, "zero": 1}))
    out.append(gpt3_175b(12288, 8, 8, 6144, schedule="interleaved", v=6, zero=1,
                         selective=True, name="gpt3-175b-12288"))
    out.append(gpt3_175b(512, 8, 32, 1536, 2, name="gpt3-175b-tp8-dp2-pp32-mbs2"))
    out.append(row("llama3-405b-16384-h100", H100, 16384, {"preset": "llama3-405b"},
                   {"seq_len": 8192, "global_batch": 2048, "micro_batch": 1,
                    "recompute": "selective"},
                   {"tp": 8, "pp": 16, "dp": 128, "sequence_parallel": True, "zero": 1,
                    "stage_layers": [7, *[8] * 14, 7]}))
    out += [llama_cp("70b", 2048, 4, 4, 5, 4096), llama_cp("405b", 1024, 8, 8, 8, 512)]
    return out


def llama_cp(size: str, gpus: int, tp: int, pp: int, v: int, batch: int) -> dict[str, Any]:
    """A Llama 3 pre-training recipe with interleaving and context parallelism 2."""
    cp = 2
    parallelism: dict[str, Any] = {
        "tp": tp, "pp": pp, "cp": cp, "dp": gpus // (tp * pp * cp), "schedule": "interleaved",
        "virtual_stages": v, "sequence_parallel": True, "zero": 1}
    if size == "405b":  # 126 layers: the first and last stages one fewer
        parallelism["stage_layers"] = [15, *[16] * 6, 15]
    return row(f"llama3-{size}-tp{tp}-pp{pp}-v{v}-cp{cp}-{gpus}-h100", H100, gpus,
               {"preset": f"llama3-{size}"},
               {"seq_len": 8192, "global_batch": batch, "micro_batch": 1,
                "recompute": "selective"}, parallelism)
