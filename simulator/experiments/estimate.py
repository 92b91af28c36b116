"""A layout's memory and a first estimate of its iteration time, without a
simulation: what a search uses to drop layouts that do not fit and to rank
the rest, so that only the promising ones are simulated.

Both come from the same model the simulation runs. The program builder makes
the first and the last pipeline stage's ops (``workloads.program``), with as
few micro-batches as reach the same peak: 1F1B and interleaved 1F1B never
hold more than their warm-up's micro-batches, so ``min(m, 2p)`` micro-batches
give the same memory and the same steps (GPipe holds all m, so it keeps m).

- **Memory** (``peak``): the stage's static bytes (model states, NCCL buffers)
  plus its ops' memory events in program order, the simulator's own
  accounting (``analysis.summary.peak_memory``); the largest stage's peak.
- **Time** (``Estimate.seconds``): each pipeline step's kernels from the
  compute model (host-bound launches included) plus its tensor- and
  context-parallel collectives at their time alone on the fabric (the tuner's
  choice), or its data-parallel collectives (ZeRO-3's gathers and
  reduce-scatters, on their own stream) where those take longer, the kernels
  slowed by ``overlap_slowdown`` while those run beside them; then the
  pipeline closed form for stages of unequal speed,
  ``(m v - 1) t_max + (p - 1) t_first + t_last`` over a chunk's forward and
  backward times (a stage's chunks summed, so the last stage's head counts in
  full, then divided by v; the fill and the drain pass every stage once; the
  middle stages run like the first) plus two messages per stage, and the
  messages on the steady state's critical cycle (``_cycle_messages``); then the
  optimizer step, the last data-parallel collective (the gradients of the
  first layers, which nothing overlaps) and what the gradient reduction
  takes beyond the last backward. Kernels run at the slowest GPU's fixed
  speed (``cluster.slow``, ``gpu_speed_spread``: synchronous training waits
  for it); faults present from the start are in the fabric it prices the
  collectives on (those of the first rank's groups). It leaves out throttling
  and faults that start later (``unmodelled`` names them), contention between
  collectives and the order of kernels and gathers within a step, so it is
  mostly optimistic; a search reports its error where it simulates.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simulator.analysis.summary import peak_memory
from simulator.base.ir import (
    CP_STREAM,
    DP_STREAM,
    EXCHANGE_STREAMS,
    TP_STREAM,
    Collective,
    OpKind,
)
from simulator.collectives.tuner import isolated_time
from simulator.compute import stragglers
from simulator.compute.host import host_bound
from simulator.compute.host_costs import HostPlan
from simulator.compute.jitter import mean_factor
from simulator.compute.model import ComputeModel
from simulator.config.scenario import Scenario
from workloads import dualpipe
from workloads import program as builder
from workloads.layout import Layout as RankLayout
from workloads.layout import parse_order
from workloads.schedules import ALL, Schedule


@dataclass(frozen=True)
class Estimate:
    """What the first pass knows of a layout."""

    peak_bytes: float  # the largest stage's peak memory
    peak_stage: int
    seconds: float  # estimated iteration time
    compute_s: float  # the busiest stage's kernels over the iteration
    bubble_s: float  # the pipeline's fill and drain in the estimate
    comm_s: float  # blocking tp, cp and ep communication on the busiest stage
    breakdown: dict  # bytes by category at the peak (parameters, activations, ...)


def reduced(scenario: Scenario) -> Scenario:
    """``scenario`` with as few micro-batches as reach its peak memory and steps."""
    p, m = scenario.parallel.pp, scenario.parallel.micro_batches(scenario.training)
    if scenario.parallel.schedule is Schedule.GPIPE or m <= 2 * p:
        return scenario
    per = scenario.training.global_batch // m
    return replace(scenario, training=replace(scenario.training, global_batch=per * 2 * p))


def _typical_step(steps, seconds: np.ndarray, on_path: np.ndarray, data: np.ndarray,
                  slowdown: float) -> tuple[float, float]:
    """(one micro-batch's forward and backward through every chunk of the stage in
    the steady state, data-parallel seconds the steps that reduce gradients
    leave beyond their compute). A step lasts its compute chain or its
    data-parallel stream (ZeRO-3's gathers), whichever is longer, the chain
    stretched by the GPU's ``overlap_slowdown`` for as long as the stream runs
    beside it; each chunk and direction counts its typical (median) step, so a
    chunk that holds more (the last stage's head, the first's embedding) counts
    in full; steps that reduce the gradients are left out of the steady state,
    their excess counted once. A combined forward and backward
    (``moe_overlap``, DualPipe) is left out: the same kinds of step run alone
    in the warm-up and the cool-down, and give their times (the estimate does not
    credit the overlap). A backward split under a zero-bubble schedule counts its
    input and weight parts' typical steps together where no whole one runs."""
    typical: dict[tuple, list[float]] = {}
    exposed = 0.0
    for first, end, key in steps:
        if key[0] == "combined":
            continue
        chain = float(seconds[first:end][on_path[first:end]].sum())
        stream = float(seconds[first:end][data[first:end]].sum())
        chain += (slowdown - 1) * min(chain, stream)
        forward, chunk, edge = key[0], key[1], key[2]
        part = next((x for x in key[3:] if isinstance(x, str)), ALL)
        if edge and not forward:
            exposed += max(0.0, stream - chain)
            typical.setdefault((forward, chunk, part), []).append(chain)
        else:
            typical.setdefault((forward, chunk, part), []).append(max(chain, stream))
    median = {kind: float(np.median(v)) for kind, v in typical.items()}
    step = sum(seconds if part == ALL or (forward, chunk, ALL) not in median else 0.0
               for (forward, chunk, part), seconds in median.items())
    return step, exposed


def _pipeline(ctx, first: float, last: float, m: int, message: float
              ) -> tuple[float, float]:
    """(steady-state seconds, fill and drain seconds) of ``m`` micro-batches on
    ``p`` stages whose first and last take ``first`` and ``last`` seconds per
    micro-batch's forward and backward through all their chunks, ``message``
    seconds per pipeline transfer. DualPipe runs each micro-batch through one of
    a rank's two chunks, a combined step sending a forward's and a backward's
    transfer, and fills and drains as ``dualpipe.bubble`` says."""
    parallel = ctx.parallel
    p, v = parallel.pp, ctx.chunks_per_stage
    if ctx.dualpipe:
        chunk = max(first, last) / v
        return m * (chunk + message), dualpipe.bubble(p, chunk) + 2 * (p - 1) * message
    first, last = first / v, last / v  # a chunk's F + B
    step = max(first, last) + _cycle_messages(parallel.schedule, p) * message
    # fill and drain pass every stage once (the middle ones like the first)
    return m * v * step, (p - 1) * first + last - step + 2 * (p - 1) * message


def _cycle_messages(schedule: Schedule, p: int) -> float:
    """Pipeline messages on the steady state's critical cycle, per chunk's forward
    and backward. In 1F1B, micro-batch i's forward through every stage and its
    backward back must end before stage 0 starts micro-batch i + p, while stage
    0 itself runs p forwards and backwards: 2 (p - 1) messages per p
    micro-batches. In interleaved 1F1B each chunk's output goes round the ring
    of stages (the last stage sends to the first) while stage 0 runs the p
    micro-batches of one chunk: a message per step each way. GPipe's forwards
    and backwards stream without such a cycle."""
    if p == 1 or schedule is Schedule.GPIPE:
        return 0.0
    return 2.0 if schedule is Schedule.INTERLEAVED else 2.0 * (p - 1) / p


def unmodelled(scenario: Scenario) -> list[str]:
    """The scenario keys the estimate leaves out (the simulations include them)."""
    machine = scenario.machine
    return [key for key, given in (("cluster.throttle", machine.throttle),
                                   ("faults with at:", machine.changes)) if given]


class Estimator:
    """First-pass figures for layouts of one cluster (its fabric, tuner and
    compute model are built once and shared)."""

    def __init__(self, scenario: Scenario) -> None:
        fabrics = scenario.fabric_states()  # (as the run starts: faults later are left out)
        self.graph, self.fabric, self.tuner = (fabrics.fabric.graph, fabrics.fabric,
                                               fabrics.lowering)
        self.model = ComputeModel.for_training(scenario.gpu, scenario.training,
                                               scenario.parallel.framework.value,
                                               scenario.machine.cluster.host_rates())
        self.gpus = self.graph.graph["gpus"]
        self._collective: dict[tuple, float] = {}
        self._groups_seen: dict[tuple, tuple[int, ...]] = {}  # (dim, rank) -> group
        machine = scenario.machine  # synchronous training waits for its slowest GPU
        speed = stragglers.factors(machine.slow, machine.gpu_speed_spread, scenario.seed,
                                   [self.fabric.tray_of(g) for g in self.gpus])
        self.slowest = 1.0 if speed is None else float(speed.max())

    def estimate(self, scenario: Scenario) -> Estimate:
        small = reduced(scenario)
        parallel = small.parallel
        ctx = builder.make_context(small.model, small.training, parallel, scenario.seed)
        layout = RankLayout({"tp": parallel.tp, "cp": parallel.cp, "dp": parallel.dp,
                             "pp": parallel.pp}, parse_order(parallel.order))
        groups = builder._groups(ctx, layout)
        self._groups_seen.clear()  # (this layout's groups only)
        stages = sorted({0, parallel.pp - 1})
        per_stage = {s: self._stage(ctx, s, layout, groups, small) for s in stages}
        peak_stage = max(stages, key=lambda s: per_stage[s][0])
        m = parallel.micro_batches(scenario.training)
        message = per_stage[0][2]
        comm = max(per_stage[s][3] for s in stages) * m / ctx.micro_batches
        steady, bubble = _pipeline(ctx, per_stage[0][1], per_stage[stages[-1]][1], m, message)
        tail = max(per_stage[s][4] for s in stages)
        return Estimate(per_stage[peak_stage][0], peak_stage, steady + bubble + tail,
                        steady, bubble, comm, per_stage[peak_stage][5])

    def _stage(self, ctx, stage: int, layout, groups, scenario: Scenario):
        """(peak bytes, forward + backward seconds per chunk, a message's seconds,
        blocking communication over the reduced run, optimizer + last DP call,
        bytes by category at the peak)."""
        b = builder.build_stage(ctx, stage)
        ops = b.ops
        static = builder.static_memory(ctx, stage)
        events = [(float(i), delta, what) for i, op in enumerate(ops) for delta, what in op.mem]
        peak, breakdown = peak_memory(static, events)
        rank = layout.rank({"tp": 0, "cp": 0, "dp": 0, "pp": stage})
        host = HostPlan.of(scenario.training, ctx.parallel.framework.value,
                           scenario.machine.cluster.host_dispatch)
        kernels = host_bound(ops, b.steps, self.model.durations(ops) * self.slowest,
                             host) * mean_factor(scenario.compute_jitter)
        peer = layout.rank({"tp": 0, "cp": 0, "dp": 0,
                            "pp": stage + 1 if stage + 1 < ctx.parallel.pp else stage - 1})
        seconds = np.array([self._op_seconds(op, rank, peer, groups) if op.kind is not
                            OpKind.COMPUTE else k for op, k in zip(ops, kernels, strict=True)])
        blocking = np.array([op.stream in (TP_STREAM, CP_STREAM, *EXCHANGE_STREAMS) for op in ops])
        on_path = np.array([op.kind is OpKind.COMPUTE for op in ops]) | blocking
        data = np.array([op.stream == DP_STREAM for op in ops])
        step, exposed = _typical_step(b.steps, seconds, on_path, data,
                                      scenario.gpu.overlap_slowdown)
        message = max((seconds[i] for i, op in enumerate(ops) if op.kind is OpKind.SEND),
                      default=0.0)
        outside = [i for i in range(len(ops)) if not any(f <= i < e for f, e, _ in b.steps)]
        optimizer = sum(seconds[i] for i in outside if ops[i].kind is OpKind.COMPUTE)
        last_dp = max((seconds[i] for i in outside if ops[i].kind is OpKind.COLLECTIVE),
                      default=0.0)
        comm = float(seconds[blocking].sum())
        return peak, step, message, comm, optimizer + last_dp + exposed, breakdown

    def _slowest_group(self, groups, dim: str, rank: int) -> tuple[int, ...]:
        """The group of ``dim`` the step waits for: the one over the most NVLink
        domains (a group that leaves its rack or server runs over the NICs;
        synchronous training waits for it), else ``rank``'s own."""
        key = (dim, rank)
        if key not in self._groups_seen:
            own = next((g for g in groups.get(dim, ()) if rank in g), (rank,))
            spread = {g: len({self.fabric.node_of(self.gpus[r]) for r in g})
                      for g in groups.get(dim, ())}
            worst = max(spread, key=spread.get, default=own)
            self._groups_seen[key] = worst if spread.get(worst, 0) > spread.get(own, 0) else own
        return self._groups_seen[key]

    def _op_seconds(self, op, rank: int, peer: int, groups) -> float:
        """A collective, or a pipeline message to the next stage, alone on the
        fabric (cached per shape)."""
        if op.kind is OpKind.COLLECTIVE:
            members, kind = self._slowest_group(groups, op.group, rank), op.collective
        elif op.kind is OpKind.SEND:
            members, kind = (rank, peer), Collective.SEND_RECV
        else:
            return 0.0  # a receive: the send's time
        key = (kind, op.bytes, members)
        if key not in self._collective:
            gpus = [self.gpus[r] for r in members]
            self._collective[key] = isolated_time(self.fabric, self.tuner(kind, gpus, op.bytes))
        return self._collective[key]
