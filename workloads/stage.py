"""The state a stage's program is built in: what every strategy appends ops to.

``Context`` holds what a stage's builder needs, computed once per program;
``Stage`` appends one pipeline stage's ops in program order and tracks what the
next op must wait for (the last compute op, blocking communication, gradients
ready for reduction).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property

from simulator.base.ir import COMPUTE_STREAM, PP_STREAM, Collective, Op, OpKind, Phase
from workloads import dualpipe
from workloads import kernels as K
from workloads.frameworks import GradientPlan
from workloads.models import ModelSpec
from workloads.routing import Routing
from workloads.training import ParallelSpec, TrainingSpec


class LayoutError(ValueError):
    """A parallel layout that cannot run; the message names the keys."""


@dataclass(frozen=True)
class Context:
    """Everything a stage's builder needs, computed once."""

    model: ModelSpec
    training: TrainingSpec
    parallel: ParallelSpec
    shard: K.Shard
    vocab: int
    chunks: list[range]  # virtual stage -> layers
    micro_batches: int
    dp_group: str  # the data-parallel group dimension for gradients
    shards: int  # ZeRO/FSDP shard count
    passes: dict  # forward? -> one layer pass's kernels and f/g markers (layer_passes.pass_plan)
    plan: GradientPlan  # gradient precision, buckets, parameter-gather overlap
    kind_passes: dict = field(default_factory=dict)  # the same for other kinds of layer:
    # (MoE, sliding-window) -> forward? -> plan
    routing: Routing | None = None  # MoE layers' expert loads per micro-batch
    again: dict = field(default_factory=dict)  # layer kind -> forward-plan positions a
    # selective recompute's modules re-run (workloads.recompute.positions)

    def pass_plan(self, layer: int, forward: bool) -> tuple:
        """The pass plan of ``layer``: its kind's (a dense full-attention layer's is
        ``passes``). A hot path: the plans are looked up per layer once."""
        return self.layer_plans[layer][forward]

    @cached_property
    def layer_plans(self) -> tuple[dict, ...]:
        """Each transformer layer's plans (forward? -> plan)."""
        return tuple(self.kind_passes.get(self.model.layer_kind(n), self.passes)
                     for n in range(self.model.layers))

    @cached_property
    def split_plans(self) -> tuple[tuple[tuple, tuple], ...]:
        """Each layer's backward plan under the zero-bubble split and the weight
        gradients it holds back (``dualpipe.split_weights``)."""
        made: dict[int, tuple[tuple, tuple]] = {}  # one split per kind of layer
        for plans in self.layer_plans:
            if id(plans[False]) not in made:
                made[id(plans[False])] = dualpipe.split_weights(plans[False])
        return tuple(made[id(plans[False])] for plans in self.layer_plans)

    @cached_property
    def recomputed(self) -> tuple[tuple[int, ...], ...]:
        """Each layer's forward-plan positions its backward re-runs first (the
        selective recompute's modules, ``workloads.recompute``; () for none)."""
        return tuple(self.again.get(self.model.layer_kind(n), ())
                     for n in range(self.model.layers))

    def params_of(self, layer: int) -> tuple[int, int]:
        """(dense, expert) parameters of ``layer`` on one rank."""
        return self.moe_params if self.model.is_moe_layer(layer) else (self.layer_params, 0)

    @cached_property
    def moe_params(self) -> tuple[int, int]:
        """(dense, expert) parameters of a MoE layer on one rank (its local experts)."""
        kernels = K.layer_kernels(self.model, self.shard, layer=self.model.first_moe_layer,
                                  ep=self.parallel.ep, etp=self.parallel.etp)
        expert = sum(k.params for k in kernels if K.is_expert(k))
        return sum(k.params for k in kernels) - expert, expert

    @property
    def last_virtual(self) -> int:
        return len(self.chunks) - 1

    @cached_property
    def dualpipe(self) -> bool:
        """Whether DualPipe's two directions run (``workloads.dualpipe``)."""
        return self.parallel.moe_overlap == "dualpipe"

    @property
    def chunks_per_stage(self) -> int:
        """Model chunks one stage holds: its virtual stages, or DualPipe's two."""
        return len(self.chunks) // self.parallel.pp

    def virtual(self, stage: int, chunk: int) -> int:
        """Virtual stage of ``stage``'s ``chunk``: ``chunk * pp + stage`` (DualPipe's V:
        ``dualpipe.virtual``)."""
        p = self.parallel.pp
        return dualpipe.virtual(p, stage, chunk) if self.dualpipe else chunk * p + stage

    def owner(self, k: int) -> int:
        """The stage holding virtual stage ``k``."""
        p = self.parallel.pp
        return dualpipe.owner(p, k) if self.dualpipe else k % p

    def starts(self, k: int) -> bool:
        """Whether virtual stage ``k`` begins its pipeline (holds the embedding)."""
        return k % self.parallel.pp == 0 if self.dualpipe else k == 0

    def ends(self, k: int) -> bool:
        """Whether virtual stage ``k`` ends its pipeline (holds the head)."""
        p = self.parallel.pp
        return k % p == p - 1 if self.dualpipe else k == self.last_virtual

    def microbatches(self, chunk: int) -> range:
        """The micro-batches ``chunk`` runs: all of them, or under DualPipe its
        direction's half."""
        if not self.dualpipe:
            return range(self.micro_batches)
        half = self.micro_batches // 2
        return range(chunk * half, (chunk + 1) * half)

    @cached_property
    def owns_logits(self) -> bool:
        """Whether the last stage holds the logits weight (untied, or tied across a
        pipeline, where the last stage keeps its own copy)."""
        return (not self.model.tied_embeddings) or self.parallel.pp > 1

    @cached_property
    def layer_params(self) -> int:
        """Parameters of one layer on one rank."""
        return sum(k.params for k in K.layer_kernels(self.model, self.shard))

    @cached_property
    def tp_bytes(self) -> dict[bool, tuple[float, float]]:
        """Forward? -> (bytes of a tensor-parallel call on one micro-batch's
        activations, of its all-gathers: under low precision the forward's carry
        the quantized tensor, ``LowPrecision.gather_bytes``)."""
        sh = self.shard
        elements = sh.tokens * self.model.hidden
        plain = elements * sh.dtype_bytes
        gathered = plain if sh.lowp is None else sh.lowp.gather_bytes(
            elements, self.parallel.tp_comm_overlap)
        return {True: (plain, gathered), False: (plain, plain)}

    @cached_property
    def act_bytes(self) -> float:
        """Bytes one micro-batch's activation tensor has when crossing a stage."""
        sh = self.shard
        return sh.tokens * self.model.hidden * sh.dtype_bytes / sh.norm_split


@dataclass
class Stage:
    """Appends one stage's ops, tracking what the next op must wait for."""

    ctx: Context
    stage: int
    ops: list[Op] = field(default_factory=list)
    last_compute: int | None = None
    ready: list[int] = field(default_factory=list)  # non-compute ops the next compute waits for
    grads: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # chunk -> grads
    last_backward: dict[int, int] = field(default_factory=dict)  # chunk -> op index
    reduces: list[int] = field(default_factory=list)
    # layer -> the overlapped parameter all-gather its first forward waits for
    param_ready: dict[int, int] = field(default_factory=dict)
    expert_grads: dict[int, list[tuple[int, float]]] = field(default_factory=dict)  # over edp
    steps: list[tuple[int, int, tuple]] = field(default_factory=list)  # Program.steps
    coordinator: object | None = None  # DeepSpeed ZeRO-3's (sharded.Coordinator), made once
    offloaded: frozenset = frozenset()  # layers whose activations go to host memory (offload)
    # zero-bubble backwards whose weight gradients wait for a W step, first in first out:
    # (the step, [(layer, weight-gradient items)]) (``workloads.dualpipe``)
    held: list = field(default_factory=list)

    def compute(self, kernel: K.Kernel, phase: Phase, mb: int, layer: int, flops: float,
                nbytes: float, mem: tuple = (), extra: Sequence[int] = ()) -> int:
        """Append a kernel after what the next compute waits for (a hot path: a
        large run appends millions)."""
        ready = self.ready
        deps = (*ready, *extra) if ready or extra else ()
        self.ops.append(_new(Op, (OpKind.COMPUTE, kernel.name, COMPUTE_STREAM, phase, deps,
                                  kernel.cls, flops, nbytes, kernel.shape, None, "", mb, layer,
                                  mem)))  # every field, in order: tuple.__new__ is 2x Op()
        self.last_compute = i = len(self.ops) - 1
        if ready:
            self.ready = []
        return i

    def after_compute(self) -> tuple[int, ...]:
        """What a communication op issued now waits for: the ops the next compute
        waits for and the last compute."""
        return tuple(self.ready) + ((self.last_compute,) if self.last_compute is not None else ())

    def collective(self, kind: Collective, nbytes: float, stream: str, group: str, phase: Phase,
                   mb: int, layer: int, deps: tuple[int, ...] | None = None,
                   blocking: bool = True, mem: tuple = (), name: str = "") -> int:
        """Append a collective call (a hot path, as ``compute``)."""
        self.ops.append(_new(Op, (OpKind.COLLECTIVE, name or COLLECTIVE_NAME[kind], stream,
                                  phase, self.after_compute() if deps is None else deps,
                                  None, 0.0, nbytes, None, kind, group, mb, layer, mem)))
        i = len(self.ops) - 1
        if blocking:
            self.ready.append(i)
        return i

    def p2p(self, kind: OpKind, dim: str, phase: Phase, mb: int, layer: int) -> int:
        self.ops.append(_new(Op, (kind, "send" if kind is OpKind.SEND else "recv", PP_STREAM,
                                  phase, self.after_compute(), None, 0.0, self.ctx.act_bytes,
                                  None, None, dim, mb, layer, ())))
        i = len(self.ops) - 1
        if kind is OpKind.RECV:
            self.ready.append(i)
        return i


_new = tuple.__new__  # builds an Op from all its fields without NamedTuple's keyword layer
COLLECTIVE_NAME = {kind: kind.value for kind in Collective}  # hot path: a dict, not .value
UNFUSED_ATTENTION = ("attn_scores", "softmax", "attn_values")


def plan_kernels(plan: Sequence[tuple]) -> list[tuple[int, K.Kernel]]:
    """(position, kernel) of a layer pass plan's kernels, plain, a routed expert's or
    pipelined with tensor-parallel communication (``layer_passes.pass_plan``: the kernel
    is item 1)."""
    return [(n, item[1]) for n, item in enumerate(plan)
            if item[0] in ("kernel", "expert", "overlapped")]


def kernel_cost(kernel: K.Kernel, backward: bool, training: TrainingSpec) -> tuple[float, float]:
    """(FLOPs, bytes) a kernel executes. Selective recompute re-runs the unfused
    attention core's forward inside its backward (Korthikanti et al. 2022)."""
    if not backward:
        return kernel.flops, kernel.bytes
    if kernel.backward_bytes is not None:  # its own (a cast's, a norm's, an accumulating GEMM's)
        return K.backward_flops(kernel), kernel.backward_bytes
    flops, nbytes = K.backward_flops(kernel), 2.0 * kernel.bytes
    if kernel.name in UNFUSED_ATTENTION and "core_attn" in training.modules:
        flops, nbytes = flops + kernel.flops, nbytes + kernel.bytes
    return flops, nbytes
