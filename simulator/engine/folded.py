"""A folded run: each class of ranks kept as its representative's spans, any
rank's expanded exactly on demand.

A gang run (``simulator.engine.gangs``) simulates one representative per class
of ranks in lockstep; its mates' timelines are the representative's, each
naming its own call in the communication log (``mate_calls``). ``Folded``
holds which rank stands for which and those calls; ``replicate`` copies the
representatives' spans to any ranks.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd


@dataclass
class Folded:
    """Which rank stands for which (``represents``: representative -> mates) and
    each mate's own log rows (``mate_calls``): enough to expand the
    representatives' spans into any rank's, exactly, when asked."""

    represents: dict[int, tuple[int, ...]]
    mate_calls: dict[int, dict[int, int]]

    def __call__(self, spans: pd.DataFrame, nodes: list[int]) -> pd.DataFrame:
        """Every rank's spans."""
        return replicate(spans, self.represents, nodes, self.mate_calls)

    def ranks(self, spans: pd.DataFrame, ranks: list[int], nodes: list[int]) -> pd.DataFrame:
        """The spans of ``ranks`` only, each copied from its representative."""
        wanted = set(ranks)
        subset = {rep: tuple(m for m in mates if m in wanted)
                  for rep, mates in self.represents.items()
                  if rep in wanted or wanted.intersection(mates)}
        out = replicate(spans, subset, nodes, self.mate_calls)
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
              nodes: list[int], mate_calls: dict[int, dict[int, int]] | None = None
              ) -> pd.DataFrame:
    """Sorted representatives' spans, copied for each rank they represent, in rank
    order (so the result is sorted too, without sorting it again). ``mate_calls``
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
                                             mate_calls or {})
        elif isinstance(column.dtype, pd.CategoricalDtype):
            columns[name] = pd.Categorical.from_codes(copied(column.cat.codes.to_numpy()),
                                                      dtype=column.dtype)
        else:
            columns[name] = copied(column.to_numpy())
    return pd.DataFrame(columns, copy=False)


def _mates_own_calls(calls: np.ndarray, order: list[int], lengths: list[int],
                     mate_calls: dict[int, dict[int, int]]) -> np.ndarray:
    """Replace, in each mate's block of ``calls``, the representative's rows by the
    mate's own (its own group's call or message)."""
    position = 0
    for rank, length in zip(order, lengths, strict=True):
        remap = mate_calls.get(rank)
        if remap:
            block = calls[position:position + length]
            keys = np.fromiter(remap, dtype=np.int64, count=len(remap))
            values = np.fromiter(remap.values(), dtype=np.int64, count=len(remap))
            sort = np.argsort(keys)
            keys, values = keys[sort], values[sort]
            at = np.minimum(np.searchsorted(keys, block), len(keys) - 1)
            hit = keys[at] == block
            block[hit] = values[at[hit]]
        position += length
    return calls
