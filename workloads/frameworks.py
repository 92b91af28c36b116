"""What each training framework does by default with data-parallel gradients
and parameters: the precision gradients are reduced in, the bucket size, and
whether the parameter all-gather of a sharded optimizer overlaps the forward.

A scenario names its framework (``parallelism.framework``) and may override
each figure with the framework's own flag name (``grad_reduce_in_fp32``,
``bucket_size``, ``overlap_param_gather``); ``resolve`` turns the spec into the
figures the program builder uses. Pure functions, no state.

Sources of the defaults:

- ``megatron`` (Megatron-Core as its performance recipes in NeMo and
  Megatron-Bridge configure it): with bf16, gradients are accumulated and
  reduced in fp32 (Megatron-LM ``arguments.py``: bf16 sets
  ``accumulate_allreduce_grads_in_fp32``; ``DistributedDataParallelConfig.
  grad_reduce_in_fp32``); with fp16 they stay fp16. Buckets hold
  ``max(40M, 1M x dp)`` parameters when ``overlap_grad_reduce`` is on, one
  bucket per model chunk otherwise (``DistributedDataParallelConfig.
  bucket_size``), and only the first model chunk is bucketed (later chunks'
  communication is overlapped anyway: ``disable_bucketing`` in ``get_model``).
  The distributed optimizer's parameter all-gather is overlapped with the next
  forward (``overlap_param_gather``), bucket by bucket.
- ``deepspeed``: gradients reduced in the model's half precision
  (``communication_data_type`` follows the gradients), buckets of
  ``reduce_bucket_size`` = 5e8 elements, the ZeRO-1/2 parameter all-gather
  after the step, not overlapped (DeepSpeed configuration reference).
- ``pytorch`` (DDP and FSDP with ``MixedPrecision(param_dtype=bf16)``):
  ``reduce_dtype`` defaults to the parameter dtype; DDP buckets of
  ``bucket_cap_mb`` = 25 MiB.
- ``torchtitan`` (FSDP2): as ``pytorch`` but ``mixed_precision_reduce =
  "float32"``, torchtitan's default.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

FP32_BYTES = 4
MIB = 2**20


class Framework(Enum):
    MEGATRON = "megatron"
    DEEPSPEED = "deepspeed"
    PYTORCH = "pytorch"
    TORCHTITAN = "torchtitan"


MEGATRON_MIN_BUCKET_PARAMS = 40_000_000  # DistributedDataParallelConfig.bucket_size
MEGATRON_BUCKET_PARAMS_PER_RANK = 1_000_000  # ... x dp: keeps collectives bandwidth-bound
DEEPSPEED_BUCKET_ELEMENTS = 500_000_000  # zero_optimization.reduce_bucket_size
PYTORCH_BUCKET_BYTES = 25 * MIB  # DistributedDataParallel(bucket_cap_mb=25)
DEEPSPEED_PREFETCH_ELEMENTS = 50_000_000  # zero_optimization.stage3_prefetch_bucket_size
DEEPSPEED_PERSISTENCE_ELEMENTS = 100_000  # zero_optimization.stage3_param_persistence_threshold
DEEPSPEED_REUSE_ELEMENTS = 1_000_000_000  # zero_optimization.stage3_max_reuse_distance


@dataclass(frozen=True)
class GradientPlan:
    """What the program builder needs to reduce gradients and gather parameters."""

    reduce_bytes: int  # bytes per gradient element reduced (and accumulated)
    bucket_bytes: float  # gradient bucket cap (inf: one bucket per model chunk)
    bucket_later_chunks: bool  # whether model chunks after the first are bucketed too
    overlap_param_gather: bool  # ZeRO-1/2 parameter all-gather overlapped with the forward
    param_bytes: float = 2.0  # bytes per parameter element gathered (low-precision
    # parameters: ``workloads.precision.gathered_param_bytes``)


def reduce_in_fp32(framework: Framework, precision: str) -> bool:
    """Whether ``framework`` reduces gradients in fp32 by default at ``precision``.

    >>> reduce_in_fp32(Framework.MEGATRON, "bf16"), reduce_in_fp32(Framework.MEGATRON, "fp16")
    (True, False)
    """
    if framework is Framework.MEGATRON:
        return precision == "bf16"
    return framework is Framework.TORCHTITAN


def default_bucket_bytes(framework: Framework, dp: int, reduce_bytes: int,
                         overlap_grad_reduce: bool) -> float:
    """The framework's gradient bucket cap in bytes.

    >>> default_bucket_bytes(Framework.MEGATRON, 64, 4, True) / 1e6
    256.0
    >>> default_bucket_bytes(Framework.MEGATRON, 64, 4, False)
    inf
    """
    if framework is Framework.MEGATRON:
        if not overlap_grad_reduce:
            return float("inf")
        params = max(MEGATRON_MIN_BUCKET_PARAMS, MEGATRON_BUCKET_PARAMS_PER_RANK * dp)
        return float(params * reduce_bytes)
    if framework is Framework.DEEPSPEED:
        return float(DEEPSPEED_BUCKET_ELEMENTS * reduce_bytes)
    return float(PYTORCH_BUCKET_BYTES)


def resolve(framework: Framework, precision_bytes: int, precision: str, dp: int,
            overlap_grad_reduce: bool, grad_reduce_in_fp32: bool | None,
            bucket_size: float | None, overlap_param_gather: bool | None) -> GradientPlan:
    """The gradient plan of a layout: each figure the scenario left unset (None)
    takes the framework's default."""
    fp32 = reduce_in_fp32(framework, precision) if grad_reduce_in_fp32 is None \
        else grad_reduce_in_fp32
    reduce_bytes = FP32_BYTES if fp32 else precision_bytes
    bucket = default_bucket_bytes(framework, dp, reduce_bytes, overlap_grad_reduce) \
        if bucket_size is None else bucket_size
    overlap = framework is Framework.MEGATRON if overlap_param_gather is None \
        else overlap_param_gather
    return GradientPlan(reduce_bytes, bucket, framework is not Framework.MEGATRON, overlap)


def prefetch_points(numels: list[int], window: float) -> list[int]:
    """Where DeepSpeed ZeRO-3's parameter coordinator issues each tensor's
    all-gather, for tensors in the order the pass uses them: at the fetch of
    tensor j it waits for j's parameters (gathering them now if they are not in
    flight) and prefetches the following tensors while fewer than ``window``
    elements are in flight (``stage3_prefetch_bucket_size``). ``points[i] = j``:
    tensor i is gathered when tensor j is fetched (``j == i``: on demand).

    >>> prefetch_points([10, 10, 10, 10], 15)
    [0, 0, 0, 1]
    >>> prefetch_points([10, 10, 10], 0)
    [0, 1, 2]
    """
    points, inflight, issued = [], 0.0, 0
    for j, numel in enumerate(numels):
        if issued == j:  # not prefetched: gathered on demand
            points.append(j)
            issued += 1
        else:
            inflight -= numel  # prefetched: in use now, no longer in flight
        while issued < len(numels) and inflight < window:
            points.append(j)
            inflight += numels[issued]
            issued += 1
    return points


def reuse_plan(uses: list[tuple[object, int]], persistent: set,
               max_reuse: float) -> tuple[list[bool], list[bool]]:
    """(gathers, releases) for each use (tensor, elements) of DeepSpeed ZeRO-3's
    trace of one forward and backward: whether the use all-gathers its tensor (it
    is not in memory) and whether the tensor is released after it.

    After a module runs, the coordinator releases its parameters unless the trace
    reaches their next use before ``max_reuse`` elements of other parameters
    (``stage3_max_reuse_distance``; ``__params_to_release`` walks the modules
    after this one, adding their elements). The trace ends with the backward, so
    the last use of each tensor releases it. Persistent tensors
    (``stage3_param_persistence_threshold``) are never gathered or released but
    count in the distance.

    >>> reuse_plan([("a", 5), ("b", 5), ("b", 5), ("a", 5)], set(), 6)
    ([True, True, False, True], [True, False, True, True])
    """
    nxt: dict[object, int] = {}
    later = [-1] * len(uses)
    for i in range(len(uses) - 1, -1, -1):
        later[i] = nxt.get(uses[i][0], -1)
        nxt[uses[i][0]] = i
    before = [0]  # elements of uses[:i]
    for _, numel in uses:
        before.append(before[-1] + numel)
    held, gathers, releases = set(), [], []
    for i, (tensor, _) in enumerate(uses):
        if tensor in persistent:
            gathers.append(False)
            releases.append(False)
            continue
        gathers.append(tensor not in held)
        j = later[i]
        keep = j >= 0 and before[j] - before[i + 1] < max_reuse
        (held.add if keep else held.discard)(tensor)
        releases.append(not keep)
    return gathers, releases
