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

from simulator.base.ir import PP_STREAM, Collective, OpKind, Phase
from workloads.layout import Layout
from workloads.models import ModelSpec
from workloads.pipeline_layout import LayoutSyntaxError, layer_counts
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


def fill_chunks(total: int, parts: int) -> list[int]:
    """A stage's ``total`` layers over its ``parts`` chunks in order, each
    ``ceil(total / parts)`` until the rest (the issue's Megatron [4, 4, 4, 1] for
    13 over 4; Megatron-Core itself refuses a stage its virtual stages do not
    divide: ``transformer_config.py``, "must be divisible by virtual pipeline
    parallel degree"; ``pipeline_layout`` writes any other split).

    >>> fill_chunks(13, 4), fill_chunks(8, 2)
    ([4, 4, 4, 1], [4, 4])
    """
    each = -(-total // parts)
    return [max(0, min(each, total - each * n)) for n in range(parts)]


def virtual_stage_layers(model: ModelSpec, parallel: ParallelSpec) -> list[range]:
    """Layers of each virtual stage k = chunk * pp + stage, numbered in model order
    (``layers_per_virtual_stage``).

    >>> from workloads.models import MODELS
    >>> virtual_stage_layers(MODELS["gpt3-2.7b"], ParallelSpec(pp=2, virtual_stages=2))
    [range(0, 8), range(8, 16), range(16, 24), range(24, 32)]
    """
    out, start = [], 0
    for n in layers_per_virtual_stage(model, parallel):
        out.append(range(start, start + n))
        start += n
    return out


def layers_per_virtual_stage(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """Transformer layers of each virtual stage: the ``pipeline_layout``'s; with
    the embedding or the loss counted in the split, Megatron's
    (``_accounted``); else each stage's (``stage_layers``, even by default:
    Megatron needs layers divisible by pp x v) filled into its chunks
    (``fill_chunks``)."""
    pp, v, layers = parallel.pp, parallel.virtual_stages, model.layers
    if parallel.pipeline_layout is not None:
        try:
            return layer_counts(parallel.pipeline_layout, pp, v, layers, model.mtp_layers)
        except LayoutSyntaxError as error:
            raise LayoutError(f"parallelism.pipeline_layout: {parallel.pipeline_layout!r} "
                              f"{error}") from None
    if parallel.account_for_embedding_in_pipeline_split or \
            parallel.account_for_loss_in_pipeline_split:
        return _accounted(layers, parallel)
    if parallel.stage_layers is None:
        if layers % (pp * v):
            raise LayoutError(f"model.layers ({layers}) must be divisible by parallelism.pp x "
                              f"virtual_stages ({pp * v}); or give parallelism.stage_layers "
                              "or parallelism.pipeline_layout")
        counts = [layers // pp] * pp
    else:
        counts = list(parallel.stage_layers)
    per_chunk = [fill_chunks(c, v) for c in counts]  # per stage, per chunk
    return [per_chunk[stage][chunk] for chunk in range(v) for stage in range(pp)]


def _accounted(layers: int, parallel: ParallelSpec) -> list[int]:
    """Megatron-Core's split with the embedding and/or the loss counted as a layer
    (``transformer_block.get_num_layers_to_build``): (layers + 1 each) / pp per
    stage, / v per chunk, one fewer in the first chunk of the first stage
    (embedding) and the last chunk of the last (loss)."""
    pp, v = parallel.pp, parallel.virtual_stages
    embedding = int(parallel.account_for_embedding_in_pipeline_split)
    loss = int(parallel.account_for_loss_in_pipeline_split)
    key = "account_for_embedding_in_pipeline_split" if embedding else \
        "account_for_loss_in_pipeline_split"
    total = layers + embedding + loss
    counted = " + ".join([f"model.layers ({layers})"] + ["1 (the embedding)"] * embedding
                         + ["1 (the loss)"] * loss)
    if total % (pp * v):
        raise LayoutError(f"parallelism.{key}: {counted} = {total} must be divisible by "
                          f"parallelism.pp ({pp}) x virtual_stages ({v})")
    counts = [total // (pp * v)] * (pp * v)
    counts[0] -= embedding
    counts[-1] -= loss
    if min(counts) < 0:
        raise LayoutError(f"parallelism.{key}: {counted} = {total} over pp x virtual_stages "
                          f"({pp * v}) leaves no layer for the embedding or the loss to replace")
    return counts


def layers_per_stage(model: ModelSpec, parallel: ParallelSpec) -> list[int]:
    """Transformer layers of each pipeline stage, its chunks together."""
    counts, pp = layers_per_virtual_stage(model, parallel), parallel.pp
    return [sum(counts[stage::pp]) for stage in range(pp)]


def check(model: ModelSpec, training: TrainingSpec, parallel: ParallelSpec) -> None:
    """Stage sizes, virtual stages and the schedule fit the model and the batch; one
    way of splitting the layers at a time."""
    pp, v = parallel.pp, parallel.virtual_stages
    _one_split(parallel)
    if parallel.stage_layers is not None:
        layers = parallel.stage_layers
        if len(layers) != pp or sum(layers) != model.layers or min(layers) < v:
            raise LayoutError(f"parallelism.stage_layers {list(layers)} must have pp ({pp}) "
                              f"entries of at least virtual_stages ({v}) layers summing to "
                              f"model.layers ({model.layers})")
    if v > 1 and pp < 2:
        raise LayoutError("parallelism.virtual_stages > 1 needs parallelism.pp >= 2")
    steps_for(parallel.schedule, pp, parallel.micro_batches(training), v, 0)
    virtual_stage_layers(model, parallel)


SPLITS = ("pipeline_layout", "account_for_embedding_in_pipeline_split",
          "account_for_loss_in_pipeline_split", "stage_layers")  # ways of splitting the layers


def _one_split(parallel: ParallelSpec) -> None:
    """The layout string stands alone (Megatron-Core refuses it with the others),
    and ``stage_layers`` with neither account_for key (Megatron's uneven stages
    refuse them too)."""
    given = [key for key in SPLITS if getattr(parallel, key) not in (None, False)]
    if len(given) < 2 or (given[0] != "pipeline_layout" and "stage_layers" not in given):
        return
    raise LayoutError(f"parallelism.{given[0]}: {getattr(parallel, given[0])!r} cannot be "
                      f"combined with parallelism.{given[1]}; give one of them")


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
