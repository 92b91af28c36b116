"""What the host spends issuing each kernel of a pipeline step, per framework:
launches, Python-side module overheads, per-expert loops and CUDA graphs.

``compute.host.race`` charges these seconds; this module says how many.

- A kernel launch costs ``training.kernel_launch`` (PyTorch's eager dispatch and
  the driver); a backward kernel two (input and weight gradients), one each
  for a delayed weight gradient's halves (``ir.DGRAD``, ``ir.WGRAD``).
- Transformer Engine's ``GroupedLinear`` (Megatron-Core's ``TEGroupedMLP``) issues
  one cuBLAS GEMM per local expert: ``general_grouped_gemm``
  (``transformer_engine/pytorch/cpp_extensions/gemm.py``) calls
  ``nvte_multi_tensor_gemm``, which takes ``multi_stream_cublas_gemm``, a loop
  of one GEMM per expert, on every GPU unless ``NVTE_USE_CUTLASS_GROUPED_GEMM``
  is set on Hopper (``common/gemm/cublaslt_gemm.cu``). Each is charged one
  launch: an upper bound, as the loop runs in C++ without PyTorch's dispatch.
- A Transformer Engine module's Python code runs before its kernels: TE pull
  request #1191 (2024) measures Megatron-Core's ``TEColumnParallelLinear`` at
  115 us of CPU time per forward (BF16, TP 1, after that request's own
  optimisations) and Megatron-Core's own ``ColumnParallelLinear`` (the output
  layer's) at 74 us. Under ``megatron`` each forward GEMM of a TE module (QKV,
  projection, FC1, FC2, shared and routed experts) carries its module's time
  less the launches already counted; the router's ``gating`` is a plain
  ``torch.nn.functional.linear`` (one launch). ``pytorch`` and ``torchtitan``
  layers are ``torch.nn.Linear``: 13.48 us of CPU a forward on a DGX H100's
  host (TE issue #2053), one launch, nothing more. Backward module overheads
  are not published: not charged. The measurements are on x86 hosts at the
  reference launch cost ``REFERENCE_LAUNCH``; a scenario's ``kernel_launch``
  scales them (it stands for the host's pace; 0 turns the host off).
- Captured kernels (``workloads.cuda_graphs``) cost nothing each; each captured
  region of a step costs ``GRAPH_REGION_LAUNCHES`` launches: Transformer
  Engine's graphed callable copies its inputs into the graph's static buffers
  and replays the graph (``Graphed.forward`` and ``backward`` in
  ``transformer_engine/pytorch/graph.py``: ``copy_``, then ``replay()``), no
  Python module code. ``full_iteration`` launches one graph an iteration,
  charged nowhere (one launch against thousands of kernels).
- Host synchronisations: a MoE layer's dispatcher (``compute.host.host_syncs``,
  dropped where its experts are captured: drop-and-pad MoE has no token-count
  copy); Megatron-Core's optimizer step waits for the gradient norm
  (``clip_grad_norm_fp32``'s ``total_norm.item()``, ``--clip-grad`` 1.0 by
  default) and under fp16 for the loss scaler's ``found_inf.item()``
  (``MixedPrecisionOptimizer``), then issues the optimizer's kernels with no
  lead: one launch each exposed. The loss's NaN check after every micro-batch's
  forward (``pretrain_gpt.loss_func``, ``--check-for-nan-in-loss-and-grad`` on by
  default) falls at a step's end, which ``race`` already starts without lead.

Not modelled: the same flag's NaN check of each gradient bucket's norm before
its reduction in the last micro-batch's backward (``check_grads`` in
``megatron/core/distributed/param_and_grad_buffer.py``: a sync per bucket), the
per-expert quantisation of FP8 and MXFP8 grouped GEMMs' inputs (one launch per
expert's split).

Grace hosts (GB200, GB300 NVL72) issue every op more slowly: TE issue #2053
measures ``torch.nn.Linear``'s forward at 37.08 us of CPU on GB200 against 13.48 us
on a DGX H100 (and TE's ``Linear`` 2.7 times either), so the cluster's
``host_dispatch`` (``topologies.clusters.HOSTS``: Grace 37.08 / 13.48) multiplies
the launch cost and with it the module overheads.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator.base.ir import DGRAD, GEMMS, ROUTED_EXPERT, WGRAD, Op, Phase
from workloads import cuda_graphs

REFERENCE_LAUNCH = 13.6e-6  # the default kernel_launch, on the hosts measured below
TE_LINEAR_FORWARD = 115e-6  # TE PR #1191: TEColumnParallelLinear forward, CPU time, BF16, TP 1
MCORE_LINEAR_FORWARD = 74e-6  # TE PR #1191: Megatron-Core ColumnParallelLinear forward
GRAPH_REGION_LAUNCHES = 2  # TE graph.py Graphed: copy_ into the static input, replay()
# not TE modules: TopKRouter.gating (torch.nn.functional.linear) and unfused attention's
# batched GEMMs (torch.baddbmm, torch.bmm in Megatron-Core's DotProductAttention)
TORCH_LINEARS = ("router", "attn_scores", "attn_values")
MCORE_LINEARS = ("logits",)  # GPTModel.output_layer: tensor_parallel.ColumnParallelLinear
MODULE_FRAMEWORKS = ("megatron",)  # frameworks whose linear layers are TE modules


@dataclass(frozen=True)
class HostPlan:
    """How one training job's host issues its kernels."""

    kernel_launch: float  # seconds per kernel launch (training.kernel_launch)
    framework: str = "pytorch"  # parallelism.framework's value
    graphs: bool = False  # training.cuda_graphs
    scope: tuple = ()  # training.cuda_graph_scope (empty: full)
    optimizer_syncs: int = 0  # host waits for the GPU before the optimizer's kernels

    @classmethod
    def of(cls, training, framework: str, dispatch: float = 1.0) -> HostPlan:
        """A job's plan from its TrainingSpec and framework name, on a host whose
        CPU issues PyTorch's ops ``dispatch`` times as slowly as the reference
        x86 host (``ClusterSpec.host_dispatch``: Grace 2.75)."""
        syncs = (1 + (training.precision == "fp16")) if framework == "megatron" else 0
        return cls(training.kernel_launch * dispatch, framework, training.cuda_graphs,
                   tuple(training.cuda_graph_scope), syncs)

    @property
    def idle(self) -> bool:
        """Whether the host costs nothing (no launch cost)."""
        return self.kernel_launch <= 0

    def host_seconds(self, ops: Sequence[Op], compute: Sequence[int]) -> tuple[np.ndarray,
                                                                              np.ndarray]:
        """(host seconds before each kernel of ``compute``, whether a graph replays it)."""
        kept = cuda_graphs.captured(self.scope) if self.graphs else frozenset()
        labels = cuda_graphs.blocks(ops, compute) if kept else [cuda_graphs.OUTSIDE] * len(compute)
        inside = np.array([label in kept for label in labels], bool)
        per_iteration = self.graphs and cuda_graphs.ITERATION in self.scope
        out = np.empty(len(compute))
        for n, i in enumerate(compute):
            if inside[n]:
                opens = n == 0 or not inside[n - 1] or _region(ops[compute[n - 1]]) != _region(
                    ops[i])
                out[n] = GRAPH_REGION_LAUNCHES * self.kernel_launch if opens and not \
                    per_iteration else 0.0
            else:
                out[n] = self.eager(ops[i])
        return out, inside

    def eager(self, op: Op) -> float:
        """Host seconds to issue ``op`` eagerly: its launches and its module's Python."""
        n = launches(op, self.framework)
        return n * self.kernel_launch + max(
            0.0, module_forward(op, self.framework) * self.kernel_launch / REFERENCE_LAUNCH
            - n * self.kernel_launch)

    def describe(self, ops: Sequence[Op] = ()) -> str:
        """The host's mechanisms, for the summary's ``compute_model`` line
        (``ops``: a rank's program, whose MoE layers' dispatchers synchronise)."""
        if self.idle:
            return "host: no launch cost (training.kernel_launch 0)"
        parts = [f"host: {self.kernel_launch * 1e6:.3g} us a kernel launch"]
        if self.framework in MODULE_FRAMEWORKS:
            parts.append("Transformer Engine module overheads and per-expert GEMM launches "
                         "(megatron)")
        if self.graphs:
            parts.append(f"CUDA graphs: {cuda_graphs.describe(self.scope)}")
        syncs = ["MoE dispatcher per MoE layer"] if any(
            op.name.startswith(ROUTED_EXPERT) for op in ops) else []
        if self.optimizer_syncs:
            syncs.append("optimizer grad norm" + (" and found-inf" if self.optimizer_syncs > 1
                                                  else ""))
        return ", ".join(parts) + "; host syncs: " + (", ".join(syncs) or "none")


def _region(op: Op) -> tuple:
    return op.layer, op.phase


def launches(op: Op, framework: str) -> int:
    """Kernel launches of ``op``: two for a whole backward, one a GEMM per local
    expert in Transformer Engine's grouped GEMM (``megatron``)."""
    n = 2 if op.phase is Phase.BACKWARD and not op.name.endswith((DGRAD, WGRAD)) else 1
    if framework in MODULE_FRAMEWORKS and op.kernel in GEMMS and op.shape is not None \
            and len(op.shape) > 3:
        n *= len(op.shape) - 3
    return n


def module_forward(op: Op, framework: str) -> float:
    """CPU seconds of the module call whose forward GEMM ``op`` is, at the
    reference host (0 where no module overhead is published or none applies)."""
    if framework not in MODULE_FRAMEWORKS or op.phase is not Phase.FORWARD \
            or op.kernel not in GEMMS or op.name.startswith(TORCH_LINEARS):
        return 0.0
    if op.name.startswith(MCORE_LINEARS):
        return MCORE_LINEAR_FORWARD
    return TE_LINEAR_FORWARD
