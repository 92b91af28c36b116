"""Gradient buckets for data-parallel all-reduce.

As in PyTorch DDP and Megatron-LM, parameters are packed into buckets in the
order their gradients become ready in the backward pass; a bucket closes once
it holds at least ``bucket_bytes`` (a tensor is never split, so one larger than
the cap gets a bucket of its own), and its all-reduce may start as soon as the
backward op that makes its last gradient has finished.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Bucket:
    bytes: float
    ready_after: int  # index of the op whose end makes the bucket complete


def make_buckets(grads: Sequence[tuple[int, float]], bucket_bytes: float) -> list[Bucket]:
    """Pack ``(op index, gradient bytes)`` pairs, in ready order, into buckets.

    >>> make_buckets([(3, 10.0), (5, 20.0), (7, 5.0)], 25.0)
    [Bucket(bytes=30.0, ready_after=5), Bucket(bytes=5.0, ready_after=7)]
    """
    buckets: list[Bucket] = []
    size, last = 0.0, -1
    for op_index, nbytes in grads:
        if nbytes <= 0:
            continue
        size, last = size + nbytes, op_index
        if size >= bucket_bytes:
            buckets.append(Bucket(size, last))
            size = 0.0
    if size > 0:
        buckets.append(Bucket(size, last))
    return buckets
