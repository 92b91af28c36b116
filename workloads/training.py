"""How a model is trained: batch shape, precision, recompute, and how it is split."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import Enum

from simulator.base import units
from simulator.base.fields import (
    SIZE,
    ScenarioError,
    boolean,
    choice,
    choices,
    fail,
    integer,
    member,
    nested,
    number,
    quantity,
    setting,
)
from workloads.cuda_graphs import scope_list
from workloads.frameworks import (
    DEEPSPEED_PERSISTENCE_ELEMENTS,
    DEEPSPEED_PREFETCH_ELEMENTS,
    DEEPSPEED_REUSE_ELEMENTS,
    Framework,
    GradientPlan,
    resolve,
)
from workloads.layout import parse_order
from workloads.memory import RECOMPUTE_MODULES, Recompute
from workloads.pipeline_layout import LayoutSyntaxError, parse
from workloads.precision import (
    PRECISIONS,
    RECIPES,
    LowPrecision,
    Recipe,
    gathered_param_bytes,
    high_precision,
    recipe_of,
)
from workloads.schedules import Schedule

ACTIVATION_BYTES = 2  # activations, norms and communication in BF16/FP16 at every precision


@dataclass(frozen=True)
class TrainingSpec:
    """The ``training`` section: batch shape, precision, recompute, attention kernel."""

    seq_len: int = setting(integer(1), required=True)  # tokens per sequence
    global_batch: int = setting(integer(1), required=True)  # sequences per iteration
    micro_batch: int = setting(integer(1), 1)  # sequences per micro-batch
    # bf16 | fp16, or a low-precision format for the linear layers' GEMMs
    # (workloads.precision): fp8, mxfp8 (Blackwell), nvfp4 (Blackwell)
    precision: str = setting(choice(PRECISIONS), "bf16")
    # how FP8 is scaled (Transformer Engine's recipes); default: Megatron-Core's
    # (delayed for fp8, the format's own for mxfp8 and nvfp4)
    fp8_recipe: str | None = setting(choice(RECIPES), None)
    fp8_attention: bool = setting(boolean, False)  # attention's core in FP8 (cudnn, flash3)
    # parameters kept (and all-gathered) in the low format (Megatron's
    # --fp8-param-gather / --fp4-param-gather; workloads.precision.gathered_param_bytes):
    # from sharded parameters, parallelism.zero >= 1 or fsdp
    fp8_param_gather: bool = setting(boolean, False)
    recompute: Recompute = setting(member(Recompute), Recompute.NONE)  # activations recomputed
    # Megatron-Core's --recompute-modules (workloads.recompute): listing modules makes
    # the recompute selective; selective alone re-runs core_attn
    recompute_modules: tuple = setting(choices(RECOMPUTE_MODULES, "a module"), ())
    flash_attention: bool = setting(boolean, True)  # fused attention: no score matrix stored
    # dropout's probability on the hidden state after attention and MLP (Megatron's
    # --hidden-dropout; > 0 writes and reads a one-byte mask in bias-dropout-add).
    # Default 0: what NeMo's and Megatron-Bridge's GPT and Llama configs, llm-foundry's
    # MPT configs and Llama's own train with (Megatron-Core's own default is 0.1)
    hidden_dropout: float = setting(number(0.0, 0.99), 0.0)
    # which fused attention kernel (simulator.compute.attention): auto is the framework's
    # on the GPU; unfused is flash_attention: false (two GEMMs around a softmax)
    attention_kernel: str = setting(choice(["auto", "flash2", "flash3", "cudnn", "triton",
                                            "unfused"]), "auto")
    # host time to issue one kernel (PyTorch eager dispatch and launch): within a
    # pipeline step the GPU cannot run kernels faster than the host issues them
    # (simulator.compute.host). Default: the launch floor of the reference H100
    # kernel tables, 13.6 us (compute.kernel_file.launch_floor), as TE issue #2053 measures
    # torch.nn.Linear's forward on a DGX H100's host (13.48 us CPU a call)
    kernel_launch: float = setting(quantity(units.Dimension.TIME, positive=False), 13.6e-6)
    # CUDA graphs (Megatron-Core's --cuda-graph-impl): captured kernels cost no launch, one
    # graph launch per captured region (workloads.cuda_graphs); alone: every layer whole
    cuda_graphs: bool = setting(boolean, False)
    # what the graphs capture, Megatron-Core's --cuda-graph-scope values (with cuda_graphs):
    # full (every layer whole, the default), attn, mlp, moe, moe_router, moe_preprocess
    # (per layer, as a list), or full_iteration (the whole forward-backward)
    cuda_graph_scope: tuple = setting(scope_list, ())
    # CPU offloading (Megatron-Core/Transformer Engine): the first N transformer layers
    # of each stage keep their saved activations in host memory, copied out after their
    # forward and back before their backward on the offload stream (workloads.offload)
    activation_offload_layers: int = setting(integer(0), 0)
    # the share of optimizer states (and their Adam step) on the host, as Megatron's
    # optimizer CPU offload (``optimizer_offload_fraction``)
    optimizer_offload: float = setting(number(0.0, 1.0), 0.0)
    # set by the config layer from the GPU: per-tensor FP8 GEMMs on Hopper read
    # only the "TN" layout, so Transformer Engine keeps transposed copies
    fp8_transposes: bool = False

    @property
    def modules(self) -> frozenset[str]:
        """The modules a selective recompute re-runs (none otherwise)."""
        if self.recompute is not Recompute.SELECTIVE:
            return frozenset()
        return frozenset(self.recompute_modules or ("core_attn",))

    @property
    def rerun(self) -> frozenset[str]:
        """The modules whose forward a backward re-runs as a pass of its own (all
        but core_attn, which the attention's backward re-runs inside itself)."""
        return self.modules - {"core_attn"}

    @property
    def dtype_bytes(self) -> int:
        """Bytes of an activation element (BF16 or FP16: low precision casts the
        linear layers' operands only)."""
        return ACTIVATION_BYTES

    @property
    def recipe(self) -> Recipe | None:
        """The low-precision recipe (None at bf16/fp16)."""
        return recipe_of(self.precision, self.fp8_recipe)

    def peaks(self, gpu) -> tuple[float, tuple[str, float] | None]:
        """(the dense peak MFU is reported against: BF16's (or FP16's), and under
        low precision (the precision, its dense peak)) on ``gpu`` (a GpuSpec);
        no low-precision peak on a GPU without the format (recorded traces of an
        FP8 run replayed on an A100)."""
        high = gpu.peak(high_precision(self.precision))
        return high, (None if self.recipe is None or self.precision not in gpu.peak_flops
                      else (self.precision, gpu.peak(self.precision)))

    def low_precision(self, micro_batches: int) -> LowPrecision | None:
        """The low precision of a run whose weight casts ``micro_batches`` share."""
        recipe = self.recipe
        return None if recipe is None else LowPrecision(recipe, self.fp8_transposes,
                                                        micro_batches)


class Sharding(Enum):
    """PyTorch FSDP sharding strategies."""

    FULL_SHARD = "full_shard"  # parameters, gradients, optimizer states: ZeRO-3
    SHARD_GRAD_OP = "shard_grad_op"  # gradients and optimizer states: ZeRO-2
    HYBRID_SHARD = "hybrid_shard"  # full_shard inside a server, replicated across


@dataclass(frozen=True)
class FsdpSpec:
    """The ``parallelism.fsdp`` section (PyTorch FSDP's options)."""

    sharding: Sharding = setting(member(Sharding), Sharding.FULL_SHARD)  # FSDP's strategy
    # gather the next layer's parameters while this one computes
    prefetch: bool = setting(boolean, True)
    # free gathered parameters after each forward
    reshard_after_forward: bool = setting(boolean, True)
    # when the backward gathers the next layer: "pre", before this layer's gradient
    # computation (FSDP1's default BACKWARD_PRE, and FSDP2's), or "post", after it
    # (BACKWARD_POST, Composer's default), so the next layer's backward waits for it
    backward_prefetch: str = setting(choice(("pre", "post")), "pre")
    # FSDP1 (FullyShardedDataParallel: flat parameters, gathered in place) or FSDP2
    # (fully_shard: per-parameter shards, whose gathered buffer a copy-out kernel on
    # the compute stream splits into the parameters); default: 2 under torchtitan
    version: int | None = setting(choice([1, 2]), None)
    # gradient accumulation without syncing (FSDP1's no_sync(); FSDP2's
    # set_requires_gradient_sync(False) with set_reshard_after_backward(False), as NeMo
    # AutoModel's MoE recipes run it): gradients accumulate unsharded and are
    # reduce-scattered after the last micro-batch only, and the parameters the first
    # micro-batch's forward gathers stay gathered until then
    no_sync: bool = setting(boolean, False)

    @property
    def zero(self) -> int:
        return 2 if self.sharding is Sharding.SHARD_GRAD_OP else 3


@dataclass(frozen=True)
class DeepSpeedSpec:
    """The ``parallelism.deepspeed`` section: DeepSpeed ZeRO-3's options, in
    elements, under DeepSpeed's own names (its defaults)."""

    # elements gathered ahead of use by the parameter coordinator
    stage3_prefetch_bucket_size: int = setting(integer(0), DEEPSPEED_PREFETCH_ELEMENTS)
    # tensors smaller than this stay whole on every rank: never gathered
    stage3_param_persistence_threshold: int = setting(integer(0),
                                                      DEEPSPEED_PERSISTENCE_ELEMENTS)
    # a parameter is kept gathered after use when its next use in the micro-batch's
    # forward-and-backward trace comes within this many elements of other parameters
    stage3_max_reuse_distance: int = setting(integer(0), DEEPSPEED_REUSE_ELEMENTS)


def stage_list(path: str, value: object) -> tuple[int, ...]:
    """Layers per pipeline stage: a list of positive integers."""
    if not isinstance(value, list) or not value or not all(
            isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value):
        raise fail(path, value, "must be a list of positive integers, one per pipeline stage")
    return tuple(value)


def layout_string(path: str, value: object) -> str:
    """Megatron-Core's pipeline layout string: pieces of E, t, m, L split by |
    (``workloads.pipeline_layout``)."""
    if not isinstance(value, str):
        raise fail(path, value, "must be a string such as 'Et*3|(t*4|)*14ttL' (Megatron-Core's "
                                "pipeline_model_parallel_layout)")
    try:
        parse(value)
    except LayoutSyntaxError as error:
        raise fail(path, value, str(error)) from None
    return value


def rank_order(path: str, value: object) -> str:
    """Megatron's rank order, e.g. ``tp-cp-dp-pp`` (``workloads.layout``)."""
    try:
        return "-".join(parse_order(str(value)))
    except ValueError as error:
        raise ScenarioError(f"{path}: {error}") from None


@dataclass(frozen=True)
class ParallelSpec:
    """Degrees and strategies, with Megatron's names: the ``parallelism`` section
    (``dp`` defaults to what the GPUs leave: set by the scenario loader)."""

    dp: int = setting(integer(1), 1)  # data-parallel size (default: the GPUs the others leave)
    tp: int = setting(integer(1), 1)  # tensor-parallel size
    cp: int = setting(integer(1), 1)  # context-parallel size (ring attention)
    pp: int = setting(integer(1), 1)  # pipeline stages
    sequence_parallel: bool = setting(boolean, False)  # Megatron's sequence parallelism (tp)
    # Transformer Engine's userbuffers: all-gathers and reduce-scatters split and
    # pipelined with the GEMMs beside them (Megatron-Core --tp-comm-overlap)
    tp_comm_overlap: bool = setting(boolean, False)
    # expert parallelism (Megatron-Core): a MoE layer's experts split over ep ranks,
    # carved with etp out of the tp x cp x dp ranks of a stage (the rest: expert
    # data parallelism, over which expert gradients are reduced)
    ep: int = setting(integer(1), 1)
    etp: int = setting(integer(1), 1)  # expert tensor-parallel size
    # how a MoE layer moves tokens to its experts (Megatron-Core's flag): alltoall (a
    # copy per routed expert), allgather (every rank gathers the group's tokens,
    # reduce-scatters the outputs) or flex (DeepEP / HybridEP: a token sent once to
    # each rank holding any of its experts, its outputs summed there for the return)
    moe_token_dispatcher_type: str = setting(choice(["alltoall", "allgather", "flex"]),
                                             "alltoall")
    # the flex dispatcher's kernels (Megatron-Core's --moe-flex-dispatcher-backend):
    # deepep (DeepEP's normal kernels, Megatron-Core's default) or hybridep (NVIDIA's
    # HybridEP, what its recipes run on GB200/B200), each at its published rates
    moe_flex_dispatcher_backend: str = setting(choice(["deepep", "hybridep"]), "deepep")
    # expert-parallel all-to-all overlap (Megatron-Core's
    # --overlap-moe-expert-parallel-comm): "1f1b" runs the steady state's forward and
    # backward as one step, each one's token exchanges under the other's compute
    # (``workloads.moe_overlap``); "dualpipe" runs DeepSeek-V3's bidirectional DualPipe
    # schedule, its forward and backward pairs combined the same way
    # (``workloads.dualpipe``); "none" runs them one after the other
    moe_overlap: str = setting(choice(["none", "1f1b", "dualpipe"]), "none")
    # Megatron-Core's --delay-wgrad-compute: a MoE layer's expert weight gradients run
    # after its dispatch backward has started, beside it (with moe_overlap: 1f1b)
    delay_wgrad_compute: bool = setting(boolean, False)
    schedule: Schedule = setting(member(Schedule), Schedule.ONE_F_ONE_B)  # pipeline schedule
    virtual_stages: int = setting(integer(1), 1)  # chunks per stage (interleaved)
    stage_layers: tuple[int, ...] | None = setting(stage_list, None)  # layers per stage
    # Megatron-Core's --pipeline-model-parallel-layout: what each virtual stage holds, in
    # order, e.g. "Et*3|(t*4|)*14ttL" (E embedding, t layer, m MTP layer, L loss;
    # workloads.pipeline_layout); instead of stage_layers and the two keys below
    pipeline_layout: str | None = setting(layout_string, None)
    # Megatron's --account-for-embedding-in-pipeline-split: the embedding counts as a
    # layer in the even split over stages (the first chunk holds one layer fewer)
    account_for_embedding_in_pipeline_split: bool = setting(boolean, False)
    # Megatron's --account-for-loss-in-pipeline-split: the loss counts as a layer in the
    # even split over stages (the last chunk holds one layer fewer)
    account_for_loss_in_pipeline_split: bool = setting(boolean, False)
    zero: int = setting(choice([0, 1, 2, 3]), 0)  # ZeRO stage (1: distributed optimizer)
    fsdp: FsdpSpec | None = setting(nested(FsdpSpec), None)  # PyTorch FSDP instead of ZeRO
    order: str = setting(rank_order, "tp-cp-dp-pp")  # rank order, fastest varying first
    # how gradients are reduced and parameters gathered: the framework's defaults
    # (``workloads.frameworks``), each overridable under the framework's own flag name
    framework: Framework = setting(member(Framework), Framework.MEGATRON)
    bucket_size: float | None = setting(SIZE, None)  # gradient bucket (default: framework's)
    overlap_grad_reduce: bool = setting(boolean, True)  # reduce buckets during the backward
    grad_reduce_in_fp32: bool | None = setting(boolean, None)  # None: the framework's
    overlap_param_gather: bool | None = setting(boolean, None)  # None: the framework's
    deepspeed: DeepSpeedSpec | None = setting(nested(DeepSpeedSpec), None)  # framework: deepspeed
    ranks_per_node: int = 8  # for FSDP hybrid_shard: the shard group stays in a server
    # consecutive ranks that share an NVLink domain (a server's, or a rack's in an NVL72
    # system): where DeepEP's dispatch goes over RDMA and where over NVLink
    ranks_per_domain: int = 8

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.dp * self.pp

    @property
    def zero_stage(self) -> int:
        return self.fsdp.zero if self.fsdp else self.zero

    @property
    def deepspeed_zero3(self) -> DeepSpeedSpec | None:
        """DeepSpeed's ZeRO-3 options where DeepSpeed runs ZeRO-3 (None elsewhere):
        per-tensor gathers by its parameter coordinator."""
        if self.framework is Framework.DEEPSPEED and self.fsdp is None and self.zero == 3:
            return self.deepspeed or DeepSpeedSpec()
        return None

    @property
    def fsdp2(self) -> bool:
        """Whether FSDP runs as FSDP2 (``fully_shard``): ``fsdp.version``, else 2
        under TorchTitan and 1 elsewhere."""
        if self.fsdp is None:
            return False
        version = self.fsdp.version or (2 if self.framework is Framework.TORCHTITAN else 1)
        return version == 2

    @property
    def megatron_fusions(self) -> bool:
        """Whether the run has Megatron-Core's fused kernels: the cross entropy's
        (NeMo's and Megatron-Bridge's ``cross_entropy_loss_fusion``) and the weight
        gradients accumulated by their GEMMs into ``main_grad`` (Megatron-LM's
        ``gradient_accumulation_fusion``, on unless ``--no-gradient-accumulation-fusion``)."""
        return self.framework is Framework.MEGATRON

    @property
    def reduces_every_micro_batch(self) -> bool:
        """Whether gradients are reduce-scattered after every micro-batch's backward:
        DeepSpeed ZeRO-2/3 (their partitioned gradients cannot accumulate
        unreduced; DeepSpeed refuses ``no_sync`` with them), and PyTorch FSDP
        without a pipeline (its default: gradient accumulation without
        ``no_sync``, as Composer and TorchTitan's loops run it; with a pipeline,
        torch.distributed.pipelining turns the sync off until each stage's last
        micro-batch). The others reduce at the last."""
        if self.fsdp is not None:
            return self.pp == 1 and not self.fsdp.no_sync
        return self.framework is Framework.DEEPSPEED and self.zero >= 2

    def gradient_plan(self, training: TrainingSpec) -> GradientPlan:
        """Gradient precision, bucket size and parameter-gather overlap: the
        scenario's keys, else the framework's defaults."""
        plan = resolve(self.framework, training.dtype_bytes,
                       high_precision(training.precision), self.dp * self.cp,
                       self.overlap_grad_reduce, self.grad_reduce_in_fp32, self.bucket_size,
                       self.overlap_param_gather)
        return replace(plan, param_bytes=gathered_param_bytes(training.recipe)) \
            if training.fp8_param_gather else plan

    def micro_batches(self, training: TrainingSpec) -> int:
        """Micro-batches each pipeline runs per iteration (gradient accumulation steps)."""
        return training.global_batch // (self.dp * training.micro_batch)
