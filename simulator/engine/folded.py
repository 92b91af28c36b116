"""A folded run: each class of ranks kept as its representative's spans, any
rank's expanded exactly on demand.

A gang run (``simulator.engine.gangs``) simulates one representative per class
of ranks in lockstep; its mates' timelines are the representative's, each
naming its own call in the communication log. Where a gang's calls are logged
as one block of consecutive rows (a message group, the calls of every group it
holds whole), a mate's row is the representative's plus a fixed offset: the
block's *plan* (``mate_blocks``: representative -> {its row: plan};
``plans[plan]``: mate -> offset), one entry per call instead of one per mate.
Other calls map each mate's row explicitly (``mate_calls``). ``Folded`` holds
which rank stands for which and those maps; ``replicate`` copies the
representatives' spans to any ranks.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd


@dataclass
class Folded:
    """Which rank stands for which (``represents``: representative -> mates) and
    each mate's own log rows (see the module doc): enough to expand the
    representatives' spans into any rank's, exactly, when asked."""

    represents: dict[int, tuple[int, ...]]
    mate_calls: dict[int, dict[int, int]]  # mate -> {representative's row: its own}
    mate_blocks: dict[int, dict[int, int]] = field(default_factory=dict)
    plans: list[dict[int, int]] = field(default_factory=list)  # mate -> row offset

    def __call__(self, spans: pd.DataFrame, nodes: list[int]) -> pd.DataFrame:
        """Every rank's spans."""
        return replicate(spans, self.represents, nodes, self)

    def ranks(self, spans: pd.DataFrame, ranks: list[int], nodes: list[int]) -> pd.DataFrame:
        """The spans of ``ranks`` only, each copied from its representative."""
        wanted = set(ranks)
        subset = {rep: tuple(m for m in mates if m in wanted)
                  for rep, mates in self.represents.items()
                  if rep in wanted or wanted.intersection(mates)}
        out = replicate(spans, subset, nodes, self)
        return out[out["rank"].isin(wanted)].reset_index(drop=True)

    def classes(self) -> list[list[int]]:
        """Each class's ranks, its representative first."""
        return [[rep, *mates] for rep, mates in self.represents.items()]

    def representative(self) -> dict[int, int]:
        """rank -> the rank whose spans it has."""
        return {m: rep for rep, mates in self.represents.items() for m in (rep, *mates)}

    def expand_rows(self, table: pd.DataFrame) -> pd.DataFrame:
        """A per-rank table of representatives (column ``rank``) with a row for every
        rank: each rank gets its representative's figures."""
        of = self.representative()
        ranks = np.array(sorted(of), dtype=np.int64)
        reps = np.array([of[r] for r in ranks], dtype=np.int64)
        parts = []
        for rep, block in table.groupby("rank", sort=True):
            mine = ranks[reps == rep]
            copy = block.loc[block.index.repeat(len(mine))].copy()
            copy["rank"] = np.tile(mine, len(block))
            parts.append(copy)
        return (pd.concat(parts).sort_values(["rank"], kind="stable")
                .reset_index(drop=True)) if parts else table


def replicate(spans: pd.DataFrame, represents: dict[int, tuple[int, ...]],
              nodes: list[int], folded: Folded | None = None) -> pd.DataFrame:
    """Sorted representatives' spans, copied for each rank they represent, in rank
    order (so the result is sorted too, without sorting it again). ``folded``
    maps a mate's copied ``call`` (the representative's log row) to its own."""
    by_rank = {}
    starts = np.searchsorted(spans["rank"].to_numpy(), list(represents), side="left")
    ends = np.searchsorted(spans["rank"].to_numpy(), list(represents), side="right")
    for rep, a, b in zip(represents, starts, ends, strict=True):
        for rank in (rep, *represents[rep]):
            by_rank[rank] = (rep, a, b)
    order = sorted(by_rank)
    blocks = [by_rank[rank][1:] for rank in order]
    lengths = [b - a for a, b in blocks]

    def copied(values: np.ndarray) -> np.ndarray:  # block copies: much faster than a take
        return np.concatenate([values[a:b] for a, b in blocks])

    columns = {}
    for name, column in spans.items():
        if name == "rank":
            columns[name] = np.repeat(np.asarray(order, dtype=column.dtype), lengths)
        elif name == "node":
            columns[name] = np.repeat(np.asarray(nodes)[order].astype(column.dtype), lengths)
        elif name == "call":
            columns[name] = _mates_own_calls(copied(column.to_numpy()), order, lengths,
                                             [by_rank[r][0] for r in order], folded)
        elif isinstance(column.dtype, pd.CategoricalDtype):
            columns[name] = pd.Categorical.from_codes(copied(column.cat.codes.to_numpy()),
                                                      dtype=column.dtype)
        else:
            columns[name] = copied(column.to_numpy())
    return pd.DataFrame(columns, copy=False)


def _mates_own_calls(calls: np.ndarray, order: list[int], lengths: list[int],
                     reps: list[int], folded: Folded | None) -> np.ndarray:
    """Replace, in each mate's block of ``calls``, the representative's rows by the
    mate's own (its own group's call or message)."""
    if folded is None:
        return calls
    blocks = {rep: _sorted_map(rows) for rep, rows in folded.mate_blocks.items()}
    position = 0
    for rank, rep, length in zip(order, reps, lengths, strict=True):
        block = calls[position:position + length]
        original = block.copy()
        if rank != rep and rep in blocks:
            keys, plans = blocks[rep]
            offsets = np.array([plan.get(rank, 0) for plan in folded.plans] or [0])
            hit, at = _lookup(keys, original)
            block[hit] = original[hit] + offsets[plans[at[hit]]]
        remap = folded.mate_calls.get(rank)
        if remap:
            keys, values = _sorted_map(remap)
            hit, at = _lookup(keys, original)
            block[hit] = values[at[hit]]
        position += length
    return calls


def _sorted_map(mapping: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    keys = np.fromiter(mapping, dtype=np.int64, count=len(mapping))
    values = np.fromiter(mapping.values(), dtype=np.int64, count=len(mapping))
    sort = np.argsort(keys)
    return keys[sort], values[sort]


def _lookup(keys: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Which of ``values`` are in sorted ``keys``, and where."""
    if len(keys) == 0:
        return np.zeros(len(values), dtype=bool), np.zeros(len(values), dtype=np.int64)
    at = np.minimum(np.searchsorted(keys, values), len(keys) - 1)
    return keys[at] == values, at
