"""Pipeline parallelism (GPipe, 1F1B, interleaved 1F1B; Narayanan et al. 2021):
layers per (virtual) stage, the point-to-point groups, layout checks, and the
messages between stages.

Each stage runs its schedule (``workloads.schedules``); a forward step
receives activations from the previous virtual stage and sends its output on;
a backward step receives the output gradient and sends the input gradient
back. Point-to-point groups are named ``pp.f<k>`` / ``pp.b<k>`` for the boundary
after virtual stage k. Tied embeddings on different stages all-reduce their
gradients (``embd``).
"""

from __future__ import annotations

from collections.abc import Sequence

from simulator.base.ir import PP_STREAM, Collective, OpKind, Phase
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.schedules import steps_for
from workloads.stage import Context, LayoutError, Stage
from workloads.strategies.dimension import Bounds, Dimension
from workloads.training import ParallelSpec, TrainingSpec


def _divisors(bounds: Bounds) -> list[int]:
    """Every pipeline size that splits the layers evenly."""
    return [p for p in range(1, bounds.layers + 1) if bounds.layers % p == 0
            and p <= bounds.world]


def _splits_layers(sizes, bounds: Bounds) -> bool:
    return bounds.layers % sizes["pp"] == 0


DIMENSIONS = (Dimension("pp", PP_STREAM, "pipeline-parallel sizes, e.g. 1-16 (divisors of "
                        "the layers)", _divisors, _splits_layers, shown=True),)


def split_even(total: int, parts: int) -> list[int]:
    """``total`` into ``parts`` near-equal counts, larger ones first.

    >>> split_even(10, 4)
    [3, 3, 2, 2]
    """
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


def virtual_stage_layers(layers: int, pp: int, v: int,
                         stage_layers: Sequence[int] | None) -> list[range]:
    """Layers of each virtual stage k = chunk * pp + stage, numbered in model order.

    Even by default (Megatron needs layers divisible by pp * v); with
    ``stage_layers`` each stage's layers are split over its v chunks.

    >>> virtual_stage_layers(8, 2, 2, None)
    [range(0, 2), range(2, 4), range(4, 6), range(6, 8)]
    """
    if stage_layers is None:
        if layers % (pp * v):
            raise LayoutError(f"model.layers ({layers}) must be divisible by parallelism.pp x "
                              f"virtual_stages ({pp * v}); or give parallelism.stage_layers")
        counts = [layers // pp] * pp
    else:
        counts = list(stage_layers)
    per_chunk = [split_even(c, v) for c in counts]  # per stage, per chunk
    out, start = [], 0
    for chunk in range(v):
        for stage in range(pp):
            n = per_chunk[stage][chunk]
            out.append(range(start, start + n))
            start += n
    return out



def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Stage sizes, virtual stages and the schedule fit the model and the batch."""
    pp, v = parallel.pp, parallel.virtual_stages
    if parallel.stage_layers is not None:
        layers = parallel.stage_layers
        if len(layers) != pp or sum(layers) != model.layers or min(layers) < v:
            raise LayoutError(f"parallelism.stage_layers {list(layers)} must have pp ({pp}) "
                              f"entries of at least virtual_stages ({v}) layers summing to "
                              f"model.layers ({model.layers})")
    if v > 1 and pp < 2:
        raise LayoutError("parallelism.virtual_stages > 1 needs parallelism.pp >= 2")
    steps_for(parallel.schedule, pp, parallel.micro_batches(training), v, 0)
    virtual_stage_layers(model.layers, pp, v, parallel.stage_layers)


def groups(ctx: Context, layout: Layout) -> dict[str, tuple[tuple[int, ...], ...]]:
    """The (sender, receiver) pairs of every virtual-stage boundary, both ways, and
    the first and last stages for tied embeddings."""
    out = {}
    pipelines = layout.groups("pp")
    p = ctx.parallel.pp
    for k in range(ctx.last_virtual):
        if ctx.ends(k):  # (DualPipe: no boundary between its two directions)
            continue
        a, b = ctx.owner(k), ctx.owner(k + 1)
        out[f"pp.f{k}"] = tuple((g[a], g[b]) for g in pipelines)
        out[f"pp.b{k}"] = tuple((g[b], g[a]) for g in pipelines)
    if ctx.dualpipe:
        out["mirror"] = tuple((g[r], g[p - 1 - r]) for g in pipelines for r in range(p // 2))
    elif p > 1:
        out["embd"] = tuple((g[0], g[-1]) for g in pipelines)
    return out


def receive(b: Stage, k: int, forward: bool, mb: int, layer: int) -> None:
    """Virtual stage ``k`` receives its input (forward) or output gradient (backward)."""
    if forward:
        b.p2p(OpKind.RECV, f"pp.f{k - 1}", Phase.FORWARD, mb, layer)
    else:
        b.p2p(OpKind.RECV, f"pp.b{k}", Phase.BACKWARD, mb, layer)


def send(b: Stage, k: int, forward: bool, mb: int, layer: int) -> None:
    """Virtual stage ``k`` sends its output (forward) or input gradient (backward)."""
    if forward:
        b.p2p(OpKind.SEND, f"pp.f{k}", Phase.FORWARD, mb, layer)
    else:
        b.p2p(OpKind.SEND, f"pp.b{k - 1}", Phase.BACKWARD, mb, layer)


def tied_embedding_sync(b: Stage) -> None:
    """First and last stages all-reduce the tied embedding's gradients."""
    ctx, p = b.ctx, b.ctx.parallel.pp
    if ctx.model.tied_embeddings and p > 1 and b.stage in (0, p - 1) and not ctx.dualpipe:
        # (DualPipe's mirror reduction sums every copy: ``dualpipe.mirror_reduce``)
        size = ctx.plan.reduce_bytes * ctx.vocab * ctx.model.hidden // ctx.shard.tp
        b.reduces.append(b.collective(Collective.ALL_REDUCE, size, PP_STREAM, "embd",
                                      Phase.BACKWARD, -1, -1, deps=(b.last_compute,),
                                      blocking=False, name="embedding_grads"))
