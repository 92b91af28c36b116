"""The per-rank program of one data-parallel training iteration.

Each rank runs ``global_batch / (dp * micro_batch)`` micro-batches, forward then
backward, accumulating gradients; only the last micro-batch's backward
all-reduces them (DDP ``no_sync`` / Megatron's behaviour). Gradients are packed
into buckets (``workloads.buckets``) whose all-reduce, on the ``dp`` stream,
waits for the backward op that completes the bucket, so it overlaps the rest of
the backward; with ``overlap_grad_reduce`` off every bucket waits for the end of
the backward. The optimizer step waits for every bucket.

Activations are allocated when a layer's forward ends and freed when its
backward ends, so the engine tracks memory over time.
"""

from __future__ import annotations

from simulator.ir import COMPUTE_STREAM, Collective, KernelClass, Op, OpKind, Phase, Program
from workloads import kernels as K
from workloads.buckets import make_buckets
from workloads.memory import (
    GRAD_BYTES,
    Recompute,
    activation_bytes_per_layer,
    head_activation_bytes,
    model_state_bytes,
)
from workloads.models import ModelSpec
from workloads.training import DataParallelSpec, TrainingSpec

ADAM_BYTES_PER_PARAM = 28  # read fp32 master, m, v and the grad; write them and the weight
DP_STREAM = "dp"


def _forward(k: K.Kernel, mb: int, layer: int, mem: float = 0.0) -> Op:
    return Op(OpKind.COMPUTE, k.name, COMPUTE_STREAM, Phase.FORWARD, kernel=k.cls,
              flops=k.flops, bytes=k.bytes, shape=k.shape, microbatch=mb, layer=layer,
              mem_delta=mem)


def _backward(k: K.Kernel, mb: int, layer: int, mem: float = 0.0) -> Op:
    return Op(OpKind.COMPUTE, k.name, COMPUTE_STREAM, Phase.BACKWARD, kernel=k.cls,
              flops=K.backward_flops(k), bytes=2.0 * k.bytes, shape=k.shape, microbatch=mb,
              layer=layer, mem_delta=mem)


class _Builder:
    """Appends ops and remembers which op made which gradients."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.grads: list[tuple[int, float]] = []

    def add(self, op: Op, params: int = 0) -> int:
        self.ops.append(op)
        if params:
            self.grads.append((len(self.ops) - 1, GRAD_BYTES * params))
        return len(self.ops) - 1


def _micro_batch(b: _Builder, model: ModelSpec, t: TrainingSpec, mb: int) -> None:
    """Forward and backward of one micro-batch."""
    args = (model, t.micro_batch, t.seq_len, t.dtype_bytes)
    emb, layer, head = K.embedding_kernels(*args), K.layer_kernels(*args), K.head_kernels(*args)
    # Fused attention keeps no score matrix: Korthikanti's selective figure.
    act = activation_bytes_per_layer(t.seq_len, t.micro_batch, model.hidden, model.heads,
                                     recompute=Recompute.SELECTIVE)
    head_act = head_activation_bytes(t.seq_len, t.micro_batch, model.vocab, t.dtype_bytes)
    for k in emb:
        b.add(_forward(k, mb, -1))
    for n in range(model.layers):
        for i, k in enumerate(layer):
            b.add(_forward(k, mb, n, act if i == len(layer) - 1 else 0.0))
    for i, k in enumerate(head):
        b.add(_forward(k, mb, model.layers, head_act if i == len(head) - 1 else 0.0))
    for i, k in enumerate(reversed(head)):
        b.add(_backward(k, mb, model.layers, -head_act if i == len(head) - 1 else 0.0), k.params)
    for n in reversed(range(model.layers)):
        for i, k in enumerate(reversed(layer)):
            b.add(_backward(k, mb, n, -act if i == len(layer) - 1 else 0.0), k.params)
    for k in reversed(emb):
        b.add(_backward(k, mb, -1), k.params)


def build_data_parallel(model: ModelSpec, training: TrainingSpec,
                        parallel: DataParallelSpec) -> Program:
    """One iteration of pure data parallelism over ``parallel.dp`` ranks."""
    b = _Builder()
    micro_batches = parallel.micro_batches(training)
    for mb in range(micro_batches):
        b.grads.clear()  # only the last micro-batch's gradients are reduced
        _micro_batch(b, model, training, mb)
    last_backward = len(b.ops) - 1
    reduces: list[int] = []
    if parallel.dp > 1:
        for i, bucket in enumerate(make_buckets(b.grads, parallel.bucket_bytes)):
            ready = bucket.ready_after if parallel.overlap_grad_reduce else last_backward
            reduces.append(b.add(Op(
                OpKind.COLLECTIVE, f"allreduce[{i}]", DP_STREAM, Phase.BACKWARD, deps=(ready,),
                bytes=bucket.bytes, collective=Collective.ALL_REDUCE, group=DP_STREAM)))
    params = K.parameter_count(model, training.seq_len)
    b.add(Op(OpKind.COMPUTE, "optimizer", COMPUTE_STREAM, Phase.OPTIMIZER,
             deps=tuple(reduces), kernel=KernelClass.ELEMENTWISE,
             bytes=ADAM_BYTES_PER_PARAM * params))
    ops = tuple(b.ops)
    return Program(
        ops=(ops,) * parallel.dp,
        groups={DP_STREAM: (tuple(range(parallel.dp)),)},
        static_memory=(model_state_bytes(params),) * parallel.dp,
        model_flops=K.model_flops(model, training.global_batch, training.seq_len),
        tokens=training.global_batch * training.seq_len,
        notes={"micro_batches": micro_batches, "parameters": params,
               "buckets": len(reduces)},
    )
