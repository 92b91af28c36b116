"""Plug-in: a class's compute and pipeline streams run without SimPy processes.

In the reference engine every (rank, stream) is a SimPy process: a deep
pipeline's class resumes its compute process for every step and its pipeline
process for every send and receive, and most of a run's time goes to those
resumptions and the generic bookkeeping around them. Here a class
representative's compute stream and pipeline stream are *driven*: each
advances as far as what it needs is known, by callbacks, with no process.

- The compute stream plans ahead. Compute durations do not depend on the
  network, so once an op's inputs have ended (or have known ends in the
  future) it and every ready op after it are planned at once, from the time
  the stream is free (``_compute`` with ``at``: a step replayed from its
  template, a run of kernels batched). When an input is not known yet, the
  stream waits for it (a callback on the op's waiter) and goes on from there.
- The pipeline stream starts each message at the time the reference would: a
  send waits until the stream is free and its inputs have ended (a timeout to
  that time when it is in the future), then starts its gang's message group on
  the shared network, exactly as ``Gangs._p2p`` does; the stream is busy until
  the message group ends (a send) or has arrived (a receive), and goes on from
  its completion callback.

Messages still run on the network, so they share links with every other
transfer (data-parallel reductions in their core processes, other jobs)
exactly as in the reference; only the way the two streams wait changes. An op
the driver does not handle (a collective on the compute stream, a message that
is not one gang to one gang) hands the rest of that stream back to a core
process, which starts when the stream is free.

Contract: ``tests/test_engine_plugins.py`` (every combination with
``pipeline_streams`` against the reference core, and the replayed pipelines),
``tests/test_symmetry.py``.
"""

from __future__ import annotations

from collections.abc import Callable

from simulator.base.ir import COMPUTE_STREAM, PP_STREAM, OpKind
from simulator.engine.gangs import LOCKSTEP_TOLERANCE, MessageGroup
from simulator.engine.passes import Passes
from simulator.network.flows import succeed_at

DRIVEN = (COMPUTE_STREAM, PP_STREAM)


class PipelineStreams(Passes):
    """Representatives' compute and pipeline streams driven by callbacks."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._free: dict[tuple[int, str], float] = {}  # (rank, stream): free from then on
        self._driven_durations: dict[int, list[float]] = {}

    def _process(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        if stream not in DRIVEN or rank not in self.mates:
            return super()._process(rank, stream, indices, durations)
        self._driven_durations[rank] = durations
        self._free[(rank, stream)] = 0.0
        drive = self._drive_compute if stream == COMPUTE_STREAM else self._drive_pipeline
        self._later(0.0, lambda: drive(rank))
        return self.no_process()

    def _later(self, delay: float, then: Callable[[], None]) -> None:
        """Call ``then`` ``delay`` seconds from now (one SimPy event, no process)."""
        event = self.env.event()
        event.callbacks.append(lambda _event: then())
        succeed_at(self.env, event, delay)

    def _when_done(self, rank: int, op_index: int, then: Callable[[], None]) -> None:
        """Call ``then`` once ``op_index`` of ``rank`` has ended."""
        self._waiter(rank, op_index).callbacks.append(lambda _event: then())

    def _hand_back(self, rank: int, stream: str) -> None:
        """The rest of ``stream`` runs as a core process, from when it is free."""
        indices = self._streams[rank][stream]
        self.env.process(self._resumed(rank, stream, indices,
                                       self._driven_durations[rank]))

    def _resumed(self, rank: int, stream: str, indices: list[int], durations: list[float]):
        free = self._free[(rank, stream)]
        if free > self.env.now:
            yield self.env.timeout(free - self.env.now)
        yield from self._stream(rank, stream, indices, durations)

    # -- the compute stream ---------------------------------------------------------

    def _drive_compute(self, rank: int) -> None:
        """Plan the compute stream as far as its inputs are known."""
        key = (rank, COMPUTE_STREAM)
        indices = self._streams[rank][COMPUTE_STREAM]
        ops, done, durations = self.program.ops[rank], self.done[rank], \
            self._driven_durations[rank]
        pos, free = self._cursor[key], self._free[key]
        while pos < len(indices):
            op = ops[indices[pos]]
            if op.kind is not OpKind.COMPUTE:
                self._cursor[key], self._free[key] = pos, free
                self._hand_back(rank, COMPUTE_STREAM)
                return
            start = free
            for d in op.deps:
                end = done[d]
                if end is None:  # a call settled at its inputs' ends, even past ones
                    end = self.settle(rank, d, floor=0.0)
                    if end is None:  # not known yet: go on once it has ended
                        self._cursor[key], self._free[key] = pos, free
                        self._when_done(rank, d, lambda: self._drive_compute(rank))
                        return
                if end > start:
                    start = end
            pos, free = self._compute(rank, indices, pos, durations, at=start)
        self._cursor[key], self._free[key] = pos, free

    # -- the pipeline stream ----------------------------------------------------------

    def _drive_pipeline(self, rank: int) -> None:
        """Run the pipeline stream's sends and receives, each at the reference's time."""
        key = (rank, PP_STREAM)
        indices = self._streams[rank][PP_STREAM]
        ops, done = self.program.ops[rank], self.done[rank]
        pos = self._cursor[key]
        while pos < len(indices):
            i = indices[pos]
            op = ops[i]
            plan = self.group_plan(rank, op) if op.kind is not OpKind.COLLECTIVE else None
            if plan is None:
                self._hand_back(rank, PP_STREAM)
                return
            start = self._free[key]
            for d in op.deps:
                end = done[d]
                if end is None:
                    self._when_done(rank, d, lambda: self._drive_pipeline(rank))
                    return
                if end > start:
                    start = end
            if start > self.env.now:  # the message starts then, in the network's time order
                self._later(start - self.env.now, lambda: self._drive_pipeline(rank))
                return
            self._cursor[key] = pos = pos + 1
            order = plan[0]
            message_key, group = self._message(rank, op, order, MessageGroup)
            if op.kind is OpKind.SEND:
                self.send_group(message_key, group, op)
            if group.done.callbacks is not None:  # not arrived yet: go on when it has
                group.done.callbacks.append(lambda _event, i=i, op=op, k=message_key, g=group,
                                            arrival=start, plan=plan: self._arrived_at(
                                                rank, i, op, arrival, k, g, plan))
                return
            self._arrived_at(rank, i, op, start, message_key, group, plan, drive=False)

    def _arrived_at(self, rank: int, op_index: int, op, arrival: float, key: tuple,
                    group: MessageGroup, plan: tuple, drive: bool = True) -> None:
        """A send's or receive's message group has ended: its spans, its end (as
        ``Gangs._p2p`` records them), and the stream goes on."""
        _, positions, plan_id = plan
        own = positions[0]
        row = group.first_row + own
        start = max(arrival, group.start)
        self._record(rank, op, arrival if op.kind is OpKind.RECV else start, start,
                     group.ends[own], row)
        self.mate_blocks.setdefault(rank, {})[row] = plan_id
        early, late = group.spread
        if late - early > LOCKSTEP_TOLERANCE * max(late, 1e-6):
            self.check_lockstep(rank, op, [((r,), max(arrival, group.ends[at])) for r, at in
                                            zip((rank, *self.mates[rank]), positions,
                                                strict=True)])
        end = max(arrival, late)
        self._finish(rank, op_index, end)
        if op.kind is OpKind.RECV:
            del self._messages[key]
        self._free[(rank, PP_STREAM)] = end
        if drive:
            self._drive_pipeline(rank)
