"""DualPipe: DeepSeek-V3's bidirectional pipeline (``parallelism.moe_overlap:
dualpipe``; DeepSeek-AI, DeepSeek-V3 Technical Report, arXiv:2412.19437,
Sec. 3.2.1, and the schedule of github.com/deepseek-ai/DualPipe).

Micro-batches enter the pipeline from both ends. Each of the ``p`` ranks holds
two model chunks: chunk 0 is model stage ``r`` for the first half of the
micro-batches (0 .. m/2 - 1), which enter at rank 0; chunk 1 is model stage
``p - 1 - r`` for the second half (m/2 .. m - 1), which enter at rank p - 1.
So every rank keeps two copies' worth of parameters (the report's "two copies
of the model parameters"), whose gradients are summed between the two ranks
holding a stage (``mirror_reduce``, group ``mirror``).

Virtual stages number the chunks in a V: chunk 0 of rank r is ``r``, chunk 1 is
``2p - 1 - r`` (model stage ``k mod p``); each direction runs its own p virtual
stages, with the embedding at ``k mod p == 0`` and the head at ``k mod p ==
p - 1`` (``Context.virtual``, ``owner``, ``starts``, ``ends``).

The schedule (``schedule``) is the repository's eight steps; the steady state
runs a forward of one direction together with a backward of the other as one
combined step (``moe_overlap.combine``: each one's token exchanges under the
other's compute). Where the repository runs a zero-bubble backward (Qi et al.
2024), the layers' weight GEMMs compute only their input gradients
(``split_weights``) and a later W step, first in first out, their weight
gradients; the chunk's gradient reduction follows its last W. On equal stages
without communication the bubble is then the repository's ``(p/2 - 1)(F&B + B -
3W)`` exactly (``F&B = F + B`` without overlap), against 1F1B's ``(p - 1)(F +
B)`` (``makespan``; none at p = 2).

Left out: the activations a split backward keeps for its W step (each layer's
are freed when its input gradients are done), the split of the head's, the
embedding's and the MTP depth's GEMMs (run whole), DualPipeV (the cut-in-half V
schedule), and the mirror reduction overlapping the backward.
"""

from __future__ import annotations

from dataclasses import replace

from simulator.base.ir import DGRAD, DP_STREAM, GEMMS, WGRAD, Collective, Phase
from workloads.schedules import ALL, INPUT, WEIGHT, Schedule, Step


def needs(training, parallel) -> dict[str, bool]:
    """DualPipe's own requirements (the repository's, and what is not modelled with
    it), on top of every expert-parallel overlap's (``moe_overlap.check``): each
    one's description -> whether it holds."""
    m = parallel.micro_batches(training)
    return {"an even parallelism.pp of at least 2": parallel.pp >= 2 and parallel.pp % 2 == 0,
            f"an even number of micro-batches of at least 2 x pp = {2 * parallel.pp} "
            f"(global_batch / (dp x micro_batch) = {m})": m % 2 == 0 and m >= 2 * parallel.pp,
            "parallelism.schedule: 1f1b (DualPipe replaces it)":
                parallel.schedule is Schedule.ONE_F_ONE_B,
            "parallelism.virtual_stages: 1 (each rank holds its two chunks)":
                parallel.virtual_stages == 1}


def schedule(p: int, m: int, rank: int) -> list[tuple[Step, ...]]:
    """Rank ``rank``'s steps, one or two (a combined forward and backward) at a
    time: the repository's steps 1-8. Phase 0 is the direction that reaches the
    rank first (chunk 0 on the first half of the ranks, chunk 1 on the second);
    micro-batches of chunk c are ``c m/2 ..`` in order. Zero-bubble backwards
    (step 3's, the second half of step 6's, step 7's) compute their input
    gradients (``part`` ``input``) and leave their weight gradients to a W step
    (``weight``) taken first in, first out.

    >>> [" ".join(f"{'F' if s.forward else 'B'}{s.microbatch}{s.part[0]}" for s in item)
    ...  for item in schedule(2, 4, 0)]
    ['F0a', 'F2a', 'F1a', 'B2a', 'F3a B0a', 'B3a', 'B1i', 'B1w']
    """
    half, h = p // 2, m // 2
    side = min(rank, p - 1 - rank)
    second = rank >= half
    middle = rank in (half - 1, half)
    done = {True: [0, 0], False: [0, 0]}
    held: list[Step] = []  # zero-bubble backwards whose weight gradients wait

    def step(forward: bool, phase: int, split: bool = False) -> Step:
        chunk = phase ^ second
        n = done[forward][chunk]
        done[forward][chunk] += 1
        s = Step(forward, chunk * h + n, chunk, INPUT if split else ALL)
        held.extend([s] if split else [])
        return s

    def weight() -> tuple[Step]:
        s = held.pop(0)
        return (Step(False, s.microbatch, s.chunk, WEIGHT),)

    out: list[tuple[Step, ...]] = []
    out += [(step(True, 0),) for _ in range((half - side - 1) * 2)]  # 1: nF0
    for _ in range(side + 1):  # 2: nF0F1
        out += [(step(True, 0),), (step(True, 1),)]
    for _ in range(half - side - 1):  # 3: nB1W1F1
        out += [(step(False, 1, True),), weight(), (step(True, 1),)]
    for i in range(h - p + side + 1):  # 4: nF0B1F1B0 (the middle ranks' first not combined)
        pair = (step(True, 0), step(False, 1))
        out += [(pair[0],), (pair[1],)] if i == 0 and middle else [pair]
        out.append((step(True, 1), step(False, 0)))
    for _ in range(half - side - 1):  # 5: nB1F1B0
        out.append((step(False, 1),))
        out.append((step(True, 1), step(False, 0)))
    split, turn = False, (side + 1) // 2
    for i in range(side + 1):  # 6: nB1B0, from the middle on zero-bubble
        split = split or (i == turn and side % 2 == 1)
        out.append((step(False, 1, split),))
        split = split or (i == turn and side % 2 == 0)
        out.append((step(False, 0, split),))
    for _ in range(half - side - 1):  # 7: nWB0
        out += [weight(), (step(False, 0, True),)]
    out += [weight() for _ in range(side + 1)]  # 8: nW
    assert not held
    return out


def virtual(p: int, rank: int, chunk: int) -> int:
    """Virtual stage of ``rank``'s chunk: ``rank``, or ``2p - 1 - rank`` (a V).

    >>> [virtual(4, r, 1) for r in range(4)]
    [7, 6, 5, 4]
    """
    return rank if chunk == 0 else 2 * p - 1 - rank


def owner(p: int, k: int) -> int:
    """The rank holding virtual stage ``k`` (``virtual``'s inverse)."""
    return k if k < p else 2 * p - 1 - k


def makespan(p: int, m: int, forward: float, backward: float, weight: float = 0.0
             ) -> float:
    """Time to run the schedule on equal stages with no communication cost (a
    combined step takes ``forward + backward``; a zero-bubble backward
    ``backward - weight``, its W step ``weight``): forward of model stage s waits
    for stage s - 1's, backward for stage s + 1's (or its own forward on the
    last stage), each rank runs its steps in order.

    >>> makespan(2, 4, 1.0, 2.0), makespan(8, 20, 1.0, 2.0, 1.0) <= 20 * 3.0 + 3 * (3.0 + 2.0 - 3.0)
    (12.0, True)
    """
    cost = {ALL: backward, INPUT: backward - weight, WEIGHT: weight}
    order = [schedule(p, m, r) for r in range(p)]
    done: dict[tuple[bool, int, int], float] = {}
    free, pos = [0.0] * p, [0] * p
    while any(pos[r] < len(order[r]) for r in range(p)):
        progressed = False
        for r in range(p):
            while pos[r] < len(order[r]):
                item = order[r][pos[r]]
                ready = [_ready(done, p, r, s) for s in item]
                if any(t is None for t in ready):
                    break
                free[r] = max(free[r], *ready) + sum(
                    forward if s.forward else cost[s.part] for s in item)
                for s in item:
                    if s.part != WEIGHT:
                        done[(s.forward, s.microbatch, virtual(p, r, s.chunk) % p)] = free[r]
                pos[r] += 1
                progressed = True
        if not progressed:
            raise ValueError("DualPipe schedule deadlocks")
    return max(free)


def bubble(p: int, chunk: float) -> float:
    """Fill and drain seconds of the schedule on ``p`` equal stages whose chunk's
    forward and backward take ``chunk`` seconds together, a backward twice a
    forward and half of it the weights' gradients (Narayanan et al. 2021; Qi et
    al. 2024, zero bubble: B = W = F for a linear layer): ``makespan`` beyond
    the work, the same for every number of micro-batches from 2p on.

    >>> bubble(2, 3.0), bubble(8, 3.0)
    (0.0, 6.0)
    """
    return makespan(p, 2 * p, chunk / 3, 2 * chunk / 3, chunk / 3) - 2 * p * chunk


def _ready(done: dict, p: int, rank: int, s: Step) -> float | None:
    """When step ``s`` of ``rank`` may start (None: not yet known)."""
    stage = virtual(p, rank, s.chunk) % p
    if s.part == WEIGHT:
        return 0.0  # (after its own input gradients, on this rank)
    if s.forward:
        return 0.0 if stage == 0 else done.get((True, s.microbatch, stage - 1))
    return done.get((True, s.microbatch, stage) if stage == p - 1
                    else (False, s.microbatch, stage + 1))


def chunks(parallel, layers: list[range]) -> list[range]:
    """The layers of each virtual stage: ``layers`` (one direction's stages), twice
    under DualPipe (virtual stage ``k`` runs model stage ``k mod p``)."""
    return layers + layers if parallel.moe_overlap == "dualpipe" else layers


def mirror_reduce(b, params: float) -> None:
    """DualPipe's gradient sum over a stage's two copies: rank r's and rank p - 1 - r's
    gradients of their two chunks (``params`` per rank: the shard the data-parallel
    reduction left under ZeRO 1/2), all-reduced after that reduction, before the
    optimizer step (the repository's example sums them the same way)."""
    ctx = b.ctx
    if not ctx.dualpipe:
        return
    b.reduces.append(b.collective(
        Collective.ALL_REDUCE, ctx.plan.reduce_bytes * params, DP_STREAM, "mirror",
        Phase.BACKWARD, -1, -1, deps=(*b.reduces, b.last_compute), blocking=False,
        name="mirror_all_reduce"))


def split_weights(plan: tuple) -> tuple[tuple, tuple]:
    """A backward plan under the zero-bubble split (Qi et al. 2024, "Zero Bubble
    Pipeline Parallelism", ICLR; DualPipe's W chunks): each GEMM with weights
    becomes its input gradient (half its backward, no weights), where it was,
    and its weight gradient (the other half), held for a later W step; a weight
    gradient already apart (``delay_wgrad_compute``'s) is held whole; returns
    (the plan without them, the held items in order).

    >>> from workloads.kernels import Kernel
    >>> from simulator.base.ir import KernelClass
    >>> fc = Kernel("fc1", KernelClass.GEMM, 2.0, 1.0, params=4)
    >>> plan, held = split_weights((("kernel", fc, 4.0, 2.0), ("ep", "dispatch")))
    >>> [(i[1].name, i[2]) for i in plan[:1]], [(i[1].name, i[1].params) for i in held]
    ([('fc1_dgrad', 2.0)], [('fc1_wgrad', 4)])
    """
    out, held = [], []
    for item in plan:
        weights = item[0] in ("kernel", "expert") and item[1].cls in GEMMS and item[1].params
        if weights and item[1].name.endswith(WGRAD):
            held.append(item)
        elif weights:
            dgrad, wgrad = halves(item)
            out.append(dgrad)
            held.append(wgrad)
        else:
            out.append(item)
    return tuple(out), tuple(held)


def halves(item: tuple) -> tuple[tuple, tuple]:
    """A GEMM's backward item as its input gradient (half the FLOPs and bytes, no
    weights) and its weight gradient (the other half, the weights)."""
    what, kernel, flops, nbytes = item[0], item[1], item[2] / 2, item[3] / 2
    return ((what, replace(kernel, name=f"{kernel.name}{DGRAD}", params=0), flops, nbytes),
            (what, replace(kernel, name=f"{kernel.name}{WGRAD}"), flops, nbytes))
