"""Steps of one kind built once and copied (a large run's stage holds hundreds
of steps of a few kinds): ``Pattern`` keeps a step's ops with each dependency
as an offset inside the step or a place in the stage's state when it began,
and stamps them for another micro-batch; ``stampable`` says where that is exact
(the program builder's ``build_stage`` uses both, ``program.STAMP`` turns it off
for the tests that compare).
"""

from __future__ import annotations

from simulator.base.ir import Op
from workloads.stage import Context, Stage, _new
from workloads.strategies import data


def stampable(ctx: Context) -> bool:
    """Whether a step's ops and the stage's state after it are those of the first
    step of its kind, moved: only the ops, the ops the next compute waits for and
    the last compute change (no ZeRO-3/FSDP gathers or per-micro-batch reductions,
    no DeepSpeed coordinator, no overlapped parameter gathers, which keep state of
    their own)."""
    parallel = ctx.parallel
    return (parallel.zero_stage < 3 and parallel.fsdp is None and
            parallel.deepspeed_zero3 is None and not parallel.reduces_every_micro_batch
            and not data.gathers_ahead(ctx))


class Pattern:
    """A step's ops as a pattern to copy for later steps of its kind: each op's
    fields around its dependencies and micro-batch, and where each dependency
    points (an offset inside the step, or the stage's state when the step began:
    the ops the next compute waited for and the last compute), and the state the
    step left, in the same terms."""

    __slots__ = ("ops", "entry", "after")

    def __init__(self, ops: list, entry: tuple[bool, ...], after: tuple) -> None:
        self.ops, self.after = ops, after
        self.entry = entry  # which of the state's entries were set (not None)

    @classmethod
    def of(cls, b: Stage, first: int, mbs: tuple[int, ...], entry: tuple) -> Pattern | None:
        """The pattern of ``b``'s ops from ``first`` on, built for the micro-batches
        ``mbs`` (one; a combined step's two: the first is the one ``stamp`` is given,
        the others keep their distance from it) from the state ``entry`` (the ready
        ops, then the last compute); None where a dependency points elsewhere (it
        cannot be moved)."""
        where = {d: -1 - n for n, d in enumerate(entry) if d is not None}
        where.update({i: i - first for i in range(first, len(b.ops))})
        ops = []
        for op in b.ops[first:]:
            if any(d not in where for d in op.deps):
                return None
            deps = tuple(where[d] for d in op.deps)
            ops.append((op[:4], deps, all(d >= 0 for d in deps), op[5:11],
                        op.microbatch - mbs[0] if op.microbatch in mbs else None,
                        op.microbatch, op[12:]))
        after = (*b.ready, b.last_compute)
        if any(d is not None and d not in where for d in after):
            return None
        return cls(ops, tuple(d is not None for d in entry),
                   tuple(None if d is None else where[d] for d in after))

    def stamp(self, b: Stage, mb: int) -> bool:
        """Append the pattern's ops for micro-batch ``mb`` (a combined step's first:
        the other at the same distance) after ``b``'s ops, from
        ``b``'s state now (False, nothing appended, when that state has another
        shape), and leave ``b`` in the state the step leaves."""
        entry = (*b.ready, b.last_compute)
        if tuple(d is not None for d in entry) != self.entry:
            return False
        base, ops = len(b.ops), b.ops
        add = base.__add__
        for pre, deps, inside, mid, own, other, post in self.ops:
            moved = tuple(map(add, deps)) if inside else tuple(
                base + d if d >= 0 else entry[-1 - d] for d in deps)
            ops.append(_new(Op, (*pre, moved, *mid, other if own is None else mb + own,
                                 *post)))
        after = [None if d is None else base + d if d >= 0 else entry[-1 - d]
                 for d in self.after]
        b.ready, b.last_compute = after[:-1], after[-1]
        return True
