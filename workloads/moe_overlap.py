"""Expert-parallel all-to-all overlap: Megatron-Core's combined 1F1B schedule
(``parallelism.moe_overlap: 1f1b``, Megatron-Core's
``--overlap-moe-expert-parallel-comm``, v0.14; the batch-level overlap of the
DeepSeek-V3 report, Sec. 3.2.1, without DualPipe's bidirectional pipeline).

In the steady state of a 1F1B schedule a stage runs one micro-batch's forward
and another's backward back to back; they are independent, so the combined
schedule runs them as one step, layer by layer, with each token exchange of one
under the other's compute. Per pair of layers (the forward's next, the
backward's next, in their own orders), the compute stream runs

    forward attention     while the backward's combine runs,
    backward experts      while the forward's dispatch runs,
    forward experts       while the backward's dispatch runs,
    backward attention    while the forward's combine runs,

which is the order ``interleave`` gives when each pass is cut after each of its
all-to-alls (``segments``) and the cuts are taken backward first, then forward,
in turn. Everything else (tensor- and pipeline-parallel communication, the
embedding, the head, recomputed modules, gradient reductions) stays in its
pass where it was. The ops of the two passes are built as usual and only
reordered (``merge``), so each keeps its own dependencies: the overlap comes out
of the streams, nothing is assumed hidden.

Pairs (``pairs``): with a pipeline, Megatron-Core requires the interleaved
schedule (virtual stages); it runs one more warm-up forward than without the
overlap (``WARMUP``), so that every steady-state forward meets the backward of
another micro-batch or chunk (without a pipeline: the first forward alone,
then forward i + 1 with backward i, then the last backward). The extra
forward's activations are the schedule's memory cost.

``parallelism.delay_wgrad_compute`` (Megatron-Core's ``--delay-wgrad-compute``)
splits each routed-expert GEMM's backward into its input gradient and its
weight gradient, run after the layer's dispatch backward has started
(``layer_passes.delayed_wgrad``), so that all-to-all leaves earlier.

``parallelism.moe_overlap: dualpipe`` runs DeepSeek's bidirectional DualPipe
schedule instead (``workloads.dualpipe``), its forward and backward pairs
combined the same way.

Left out: the memory the two passes' buffers share (each pass's activations
are allocated and freed as before).
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.base.ir import EXCHANGE_STREAMS, Op
from workloads import dualpipe
from workloads.memory import Recompute
from workloads.schedules import Schedule, Step

MODES = ("none", "1f1b", "dualpipe")  # (dualpipe: ``workloads.dualpipe``)
# warm-up forwards the combined schedule adds to each stage's (Megatron-Core's
# interleaved schedule adds one with the overlap on; without a pipeline it runs the
# first forward alone): one more micro-batch's activations in flight
WARMUP = 1


def extra_warmup(parallel, micro_batches: int) -> int:
    """Warm-up forwards the combined schedule adds: ``WARMUP``, or every forward
    when an interleaved schedule has as many micro-batches as stages (Megatron-Core
    then runs all forwards first, so nothing is combined)."""
    if parallel.schedule is Schedule.INTERLEAVED and micro_batches == parallel.pp:
        return micro_batches * parallel.virtual_stages
    return WARMUP


def check(model, training, parallel) -> str | None:
    """Why ``parallelism.moe_overlap`` cannot run as set (None when it can): what
    every overlap needs, with Megatron-Core's own requirements for ``1f1b`` and
    DualPipe's for ``dualpipe`` (``dualpipe.needs``)."""
    mode = parallel.moe_overlap
    if mode == "none":
        return check_delay(parallel)
    need = {"model.experts > 0": model.experts > 0, "parallelism.ep > 1": parallel.ep > 1,
            "parallelism.moe_token_dispatcher_type: alltoall or flex":
                parallel.moe_token_dispatcher_type != "allgather",
            **(dualpipe.needs(training, parallel) if mode == "dualpipe" else {
                "parallelism.schedule: interleaved when pp > 1 (Megatron-Core requires "
                "virtual pipeline stages)":
                    parallel.pp == 1 or parallel.schedule is Schedule.INTERLEAVED,
                "parallelism.schedule: 1f1b or interleaved":
                    parallel.schedule is not Schedule.GPIPE,
                "at least two micro-batches per rank (training.global_batch / (dp x "
                f"micro_batch) = {parallel.micro_batches(training)}) to pair one's forward "
                "with another's backward": parallel.micro_batches(training) >= 2}),
            "training.recompute other than full": training.recompute is not Recompute.FULL,
            "no ZeRO-3, FSDP or DeepSpeed ZeRO-3 (not modelled with it)":
                parallel.zero_stage < 3 and parallel.fsdp is None}
    missing = [what for what, ok in need.items() if not ok]
    if missing:
        return f"parallelism.moe_overlap: '{mode}' needs {'; '.join(missing)}"
    return None


def check_delay(parallel) -> str | None:
    """Why ``parallelism.delay_wgrad_compute`` cannot run (None when it can)."""
    if parallel.delay_wgrad_compute and parallel.moe_overlap == "none":
        return ("parallelism.delay_wgrad_compute: true needs parallelism.moe_overlap: '1f1b' "
                "or 'dualpipe' (Megatron-Core delays the experts' weight gradients within "
                "the combined 1F1B schedule)")
    return None


def pairs(steps: list[Step], warmup: int) -> list[tuple[Step, ...]]:
    """The schedule's steps as the combined schedule runs them: the ``warmup``
    forwards alone, then each steady-state forward with the backward after it as
    one pair, then the cool-down's backwards alone (a 1F1B-like list). The
    schedule is built with one more warm-up forward (``WARMUP``) so that no
    forward meets its own backward.

    >>> from workloads.schedules import one_f_one_b
    >>> [tuple(("F" if s.forward else "B") + str(s.microbatch) for s in p)
    ...  for p in pairs(one_f_one_b(1, 3, 0, WARMUP), 1)]
    [('F0',), ('F1', 'B0'), ('F2', 'B1'), ('B2',)]
    """
    steady = range(warmup, warmup + 2 * (len(steps) // 2 - warmup), 2)
    return [*((s,) for s in steps[:warmup]), *((steps[n], steps[n + 1]) for n in steady),
            *((s,) for s in steps[steady.stop:])]


def segments(ops: list[Op], first: int, end: int) -> list[range]:
    """Ops ``first`` to ``end`` cut after each run of token exchanges (ops on the
    ``ep`` and ``ep_rdma`` streams): a pass's compute up to and including an
    all-to-all, and so on.

    >>> from simulator.base.ir import OpKind, Phase
    >>> op = lambda s: Op(OpKind.COMPUTE, "x", s, Phase.FORWARD)
    >>> segments([op("compute"), op("ep"), op("compute"), op("ep"), op("ep")], 0, 5)
    [range(0, 2), range(2, 5)]
    """
    out, start = [], first
    for i in range(first, end):
        if ops[i].stream in EXCHANGE_STREAMS and (
                i + 1 == end or ops[i + 1].stream not in EXCHANGE_STREAMS):
            out.append(range(start, i + 1))
            start = i + 1
    if start < end:
        out.append(range(start, end))
    return out


def interleave(forward: list[range], backward: list[range]) -> list[int]:
    """The combined order: the backward's first segment, the forward's first,
    the backward's second, and so on, then what is left of either.

    >>> interleave([range(0, 2), range(2, 3)], [range(3, 5)])
    [3, 4, 0, 1, 2]
    """
    order: list[int] = []
    for n in range(max(len(forward), len(backward))):
        for part in (backward, forward):
            if n < len(part):
                order.extend(part[n])
    return order


def combine(b, forward: Step, backward: Step, build: Callable) -> None:
    """Append a forward and a backward to stage ``b`` as one combined step: each
    built by ``build(b, step)`` from the state before both, then interleaved
    (``merge``)."""
    first, entry = len(b.ops), (list(b.ready), b.last_compute)
    build(b, forward)
    mid, forward_state = len(b.ops), (b.ready, b.last_compute)
    b.ready, b.last_compute = list(entry[0]), entry[1]
    build(b, backward)
    merge(b, first, mid, forward_state)


def key(pair: tuple[Step, Step], step_key: Callable) -> tuple:
    """A combined step's key (``Program.steps``): its two steps' keys and how many
    micro-batches the forward's is after the backward's (steps of one key hold the
    same ops but for their micro-batches)."""
    forward, backward = pair
    return ("combined", step_key(forward), step_key(backward),
            forward.microbatch - backward.microbatch)


def merge(b, first: int, mid: int, forward_state: tuple[list, int | None]) -> None:
    """Reorder stage ``b``'s ops from ``first`` on (a forward pass's up to ``mid``, a
    backward pass's after it, both built from the same state) into the combined
    order, renumber every dependency and every index the stage keeps, and leave
    the stage waiting for what either pass left (``forward_state``: the ready ops
    and last compute the forward pass left)."""
    end = len(b.ops)
    order = interleave(segments(b.ops, first, mid), segments(b.ops, mid, end))
    new = {old: first + n for n, old in enumerate(order)}

    def moved(i):
        return new.get(i, i) if i is not None else None

    old_ops = b.ops[first:]
    b.ops[first:] = [_renumbered(old_ops[i - first], new) for i in order]
    ready, last = forward_state
    b.ready = [moved(i) for i in (*ready, *b.ready)]
    b.last_compute = max((moved(i) for i in (last, b.last_compute) if i is not None),
                         default=None)
    for grads in (b.grads, b.expert_grads):
        for layer, items in grads.items():
            grads[layer] = [(moved(i), size) for i, size in items]
    b.last_backward = {chunk: moved(i) for chunk, i in b.last_backward.items()}
    b.reduces = [moved(i) for i in b.reduces]
    b.param_ready = {layer: moved(i) for layer, i in b.param_ready.items()}


def _renumbered(op: Op, new: dict[int, int]) -> Op:
    if not op.deps:
        return op
    return op._replace(deps=tuple(new.get(d, d) for d in op.deps))
