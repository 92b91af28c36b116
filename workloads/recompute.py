"""Selective recompute by module: which parts of a layer a backward re-runs.

Megatron-Core's ``--recompute-modules`` (``recompute_granularity: selective``)
checkpoints chosen modules of each transformer layer: their outputs are not
kept for the backward, which re-runs the modules' forward just before the
layer's own backward. ``training.recompute_modules`` takes its names:

- ``core_attn``: the attention core (QK^T, softmax, dropout, AV; Korthikanti
  et al. 2022's selective recompute; ``recompute: selective`` alone means
  this). Unfused, it frees the 5as/h score terms and re-runs the core's
  forward; a fused kernel stores no scores, so it frees nothing and the
  model re-runs nothing (Megatron's TE path would re-run the fused forward
  for no saving: leave it out with fused attention).
- ``layernorm``: both norms; their outputs (the QKV and MLP inputs) are not kept.
- ``mlp``: a dense layer's whole MLP block (its input kept); a MoE layer's is ``moe``.
- ``moe``: a MoE layer's whole MLP block: router, permutation, the
  all-to-alls, experts, un-permutation (its input kept).
- ``moe_act``: the routed experts' activation (its output, the second
  grouped GEMM's input, is not kept).
- ``shared_experts``: the shared experts' MLP.
- ``mla_up_proj``: multi-head latent attention's up-projections and rotary
  embedding (each head's query, key and value are not kept).

What each frees is in ``workloads.stage_memory.layer_memory``; what each re-runs
is a set of a forward pass plan's positions (``positions``).
"""

from __future__ import annotations

from workloads import kernels as K
from workloads.stage import LayoutError

MLP_START, MLP_END = "ln2", "residual2"  # a layer's MLP block lies between these
NAMES = {  # module -> kernel names re-run (their casts under low precision too)
    "layernorm": ("ln1", "ln2"),
    "moe_act": ("experts_act",),
    "mla_up_proj": ("q_up", "kv_up", "mla_rope"),
}


def positions(plan: tuple, modules: frozenset[str], moe: bool) -> tuple[int, ...]:
    """Positions in a layer's forward ``plan`` (``layer_passes.pass_plan``) that a
    backward re-runs for ``modules``; ``moe``: the layer has experts.

    >>> plan = (("kernel", _K("ln2")), ("tp", None), ("kernel", _K("fc1")),
    ...         ("kernel", _K("act")), ("kernel", _K("fc2")), ("kernel", _K("residual2")))
    >>> positions(plan, frozenset({"mlp"}), False)
    (1, 2, 3, 4)
    >>> positions(plan, frozenset({"layernorm", "moe"}), False)
    (0,)
    """
    names = {n for m in modules for n in NAMES.get(m, ())}
    names |= {f"{n}_quantize" for n in names}
    if "moe_act" in modules:
        names.add("experts_fc2_quantize")  # the activation's cast feeds the second GEMM
    block = "moe" if moe else "mlp"
    inside, out = False, []
    for n, item in enumerate(plan):
        name = getattr(item[1], "name", None) if len(item) > 1 else None
        if name == MLP_END:
            inside = False
        shared = "shared_experts" in modules and (name or "").startswith("shared_")
        if (inside and block in modules) or name in names or shared:
            out.append(n)
        if name == MLP_START:
            inside = True
    return tuple(out)


def flops(model, training, kept: float = 1.0) -> float:
    """FLOPs one micro-batch's recomputed modules re-run, whole model on one GPU
    (``kept``: the share of routed token copies the experts keep)."""
    modules, done, total = training.rerun, {}, 0.0
    for layer in range(model.layers):
        kind = model.layer_kind(layer)
        if kind not in done:
            kernels = K.layer_kernels(model, training.micro_batch, training.seq_len,
                                      layer=layer)
            plan = tuple(("kernel", k) for k in kernels)
            done[kind] = sum(kernels[n].flops * (kept if K.is_expert(kernels[n]) else 1.0)
                             for n in positions(plan, modules, model.is_moe_layer(layer)))
        total += done[kind]
    return total


def check(model, training) -> None:
    """Modules the model has: ``moe`` and ``moe_act`` need experts,
    ``shared_experts`` shared ones (raises ``LayoutError``)."""
    for module in training.recompute_modules:
        if module == "mla_up_proj" and not model.mla:
            raise LayoutError("training.recompute_modules: 'mla_up_proj' needs "
                              f"model.attention: mla (it is {model.attention})")
        key = {"moe": "experts", "moe_act": "experts",
               "shared_experts": "shared_experts"}.get(module)
        if key and not getattr(model, key):
            raise LayoutError(f"training.recompute_modules: {module!r} needs a model with "
                              f"{key.replace('_', ' ')} (model.{key} is "
                              f"{getattr(model, key)})")


class _K:  # a stand-in kernel for the doctest
    def __init__(self, name: str) -> None:
        self.name = name
