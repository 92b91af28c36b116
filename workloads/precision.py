"""Low-precision training as Transformer Engine runs it: the formats, the scaling
recipes, and the bytes their extra kernels move.

``training.precision`` picks the format of the linear layers' GEMMs (forward,
data-gradient and weight-gradient): ``bf16``/``fp16`` (no low precision), ``fp8``
(E4M3 forward, E5M2 gradients: the "hybrid" format), ``mxfp8`` (OCP
Microscaling FP8: one E8M0 scale per 32 elements) or ``nvfp4`` (E2M1 with one
E4M3 scale per 16 elements and a per-tensor FP32 scale). ``training.fp8_recipe``
picks how FP8 is scaled (Transformer Engine's ``common/recipe``):

- ``delayed``: ``DelayedScaling``, a per-tensor scale from the amax history of
  past iterations; the amaxes are all-reduced once per iteration (here over the
  data-parallel group). Megatron-Core's default ``--fp8-recipe``.
- ``tensorwise``: ``Float8CurrentScaling``, a per-tensor scale from the tensor's
  own amax: an extra pass reads the tensor before it is cast ("FP8-CS", the
  Megatron-Bridge performance recipes' FP8).
- ``blockwise``: ``Float8BlockScaling`` (DeepSeek-V3's recipe): 1x128 tiles of
  activations and gradients, 128x128 blocks of weights, an FP32 scale each.
- ``mxfp8`` and ``nvfp4``: the block-scaled formats' own recipes
  (``MXFP8BlockScaling``, ``NVFP4BlockScaling``: the NVFP4 one also passes the
  weight-gradient GEMM's inputs through a 16x16 random Hadamard transform).

What stays in BF16 (Transformer Engine: only ``te.Linear``-family modules run in
the low format): attention's core unless ``training.fp8_attention`` (then FP8, in
every low precision), norms, softmax, the router, the output layer, the loss and
the optimizer. Saved linear inputs are kept in the low format; a cast kernel
(``quantize_kernel``) quantizes each GEMM's input in the forward and the output
gradient in the backward, in both orientations where the GEMM needs them
(Hopper's FP8 GEMMs take only the "TN" layout, so Transformer Engine keeps a
transposed copy; the block formats scale along one axis, so each tensor is
quantized row-wise and column-wise); weights are cast once per iteration and
cached across micro-batches (``is_first_microbatch``).
"""

from __future__ import annotations

from dataclasses import dataclass

HIGH = ("bf16", "fp16")  # precisions without a low-precision format
LOW = ("fp8", "mxfp8", "nvfp4")
PRECISIONS = HIGH + LOW
BF16_BYTES = 2
FP32_BYTES = 4

ELEMENT_BYTES = {"fp8": 1.0, "mxfp8": 1.0, "nvfp4": 0.5}  # a low format's element, no scale
ATTENTION_PEAK = "fp8"  # FP8 dot-product attention (cuDNN) in every low precision


@dataclass(frozen=True)
class Recipe:
    """One scaling recipe: the bytes its quantized tensors take and the passes
    its casts make."""

    name: str
    precision: str  # the training.precision it belongs to
    element_bytes: float  # 1 (E4M3/E5M2) or 0.5 (E2M1)
    scale_bytes: float  # scale bytes per element (0: one scale per tensor)
    current: bool  # the amax is the tensor's own: one extra read before the cast
    hadamard: bool  # NVFP4: the weight-gradient inputs pass a random Hadamard transform
    block: bool  # block scales along one axis: row- and column-wise copies on any GPU
    hopper: bool  # whether Hopper (SM90) runs it; Blackwell runs every recipe

    @property
    def quantized_bytes(self) -> float:
        """Bytes of one quantized element, its share of the scales included."""
        return self.element_bytes + self.scale_bytes


# Scales: MX (OCP Microscaling spec v1.0): one 1-byte E8M0 scale per 32 elements;
# NVFP4 (NVIDIA, arXiv 2509.25149): one 1-byte E4M3 scale per 16; blockwise FP8
# (DeepSeek-V3 report, Sec. 3.3.2): an FP32 scale per 1x128 tile (4/128 B a value).
RECIPES = {
    "delayed": Recipe("delayed", "fp8", 1.0, 0.0, False, False, False, True),
    "tensorwise": Recipe("tensorwise", "fp8", 1.0, 0.0, True, False, False, True),
    "blockwise": Recipe("blockwise", "fp8", 1.0, 4.0 / 128, False, False, True, True),
    "mxfp8": Recipe("mxfp8", "mxfp8", 1.0, 1.0 / 32, False, False, True, False),
    "nvfp4": Recipe("nvfp4", "nvfp4", 0.5, 1.0 / 16, False, True, True, False),
}
DEFAULT_RECIPE = {"fp8": "delayed", "mxfp8": "mxfp8", "nvfp4": "nvfp4"}


def is_low(precision: str) -> bool:
    """Whether ``precision`` runs the linear layers in a low-precision format."""
    return precision in LOW


def high_precision(precision: str) -> str:
    """The precision of everything that is not a low-precision GEMM: BF16 under
    a low format (Megatron-Core runs FP8 on top of ``--bf16``)."""
    return "bf16" if is_low(precision) else precision


def recipe_of(precision: str, name: str | None) -> Recipe | None:
    """The recipe a run uses (None: no low precision); ``name`` None takes the
    precision's default, Megatron-Core's ``--fp8-recipe`` default for FP8."""
    if not is_low(precision):
        return None
    return RECIPES[name or DEFAULT_RECIPE[precision]]


@dataclass(frozen=True)
class LowPrecision:
    """A run's low precision on its GPU: the recipe, whether the GPU needs
    transposed FP8 copies (Hopper), and how many micro-batches share a weight cast."""

    recipe: Recipe
    transposes: bool  # per-tensor FP8 on Hopper: a transposed copy of every cast tensor
    micro_batches: int = 1

    @property
    def orientations(self) -> int:
        """Copies each quantized tensor is written in (row-wise, and column-wise for
        the GEMM that reads it transposed)."""
        return 2 if self.recipe.block or self.transposes else 1

    def reads(self, norm_fed: bool = False) -> int:
        """Passes a cast makes over its BF16 input: one, two under current scaling
        (the amax, then the cast). A norm's output (Transformer Engine's
        LayerNormLinear): none under delayed scaling (the norm writes FP8 itself),
        one otherwise (the norm computes the amax as it goes, or is not fused:
        MXFP8's, without cuDNN's norm)."""
        if norm_fed:
            return 0 if self.recipe.name == "delayed" else 1
        return 2 if self.recipe.current else 1

    def cast_bytes(self, elements: float, reads: int = 1, hadamard: bool = False) -> float:
        """HBM bytes to quantize a BF16 tensor: ``reads`` passes over it, every
        orientation written, and for NVFP4's weight-gradient operand one more
        read for the Hadamard transform."""
        reads += 1 if hadamard and self.recipe.hadamard else 0
        return elements * (BF16_BYTES * reads + self.recipe.quantized_bytes * self.orientations)

    def gather_bytes(self, elements: float, userbuffers: bool) -> float:
        """Bytes a sequence-parallel all-gather of ``elements`` moves in the
        forward: each rank quantizes its shard and Transformer Engine gathers the
        quantized copies (the row-wise one for per-tensor FP8, row- and
        column-wise for the block formats); userbuffers (``tp_comm_overlap``) hold
        BF16 under NVFP4 (Megatron-Core sets their quantization from FP8 only)."""
        if userbuffers and self.recipe.precision == "nvfp4":
            return elements * BF16_BYTES
        return elements * self.recipe.quantized_bytes * (2 if self.recipe.block else 1)

    def weight_bytes(self, params: float) -> float:
        """Bytes of the cached low-precision copies of ``params`` weights."""
        return params * self.recipe.quantized_bytes * self.orientations


def check(training, parallel) -> str | None:
    """Why the low-precision keys cannot run with ``parallel`` (None when they
    can): FP8 (FP4) parameter gathers need sharded parameters to gather,
    Megatron-LM's distributed optimizer (ZeRO >= 1) or FSDP."""
    if training.fp8_param_gather and parallel.zero_stage == 0 and parallel.fsdp is None:
        return ("training.fp8_param_gather: True needs the distributed optimizer "
                "(parallelism.zero >= 1) or FSDP (parallelism.fsdp): Megatron-LM gathers "
                "low-precision parameters only from their shards")
    return None


def gathered_param_bytes(recipe: Recipe) -> float:
    """Bytes a parameter element takes on the wire when parameters are kept in the
    low format (``fp8_param_gather``; Megatron's ``--fp8-param-gather`` and
    ``--fp4-param-gather``): the quantized row-wise copy, except MXFP8, which
    Megatron-Bridge's recipes gather in BF16 through the reused gradient buffer
    and re-quantize after (``reuse_grad_buf_for_mxfp8_param_ag``)."""
    return float(BF16_BYTES) if recipe.name == "mxfp8" else recipe.quantized_bytes


AMAX_BYTES_PER_GEMM = 3 * FP32_BYTES  # delayed scaling: input, weight and gradient amaxes
