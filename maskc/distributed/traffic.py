"""What each rank fetches, sends and computes at each step of context-parallel attention.

Notation: R ranks, numbered in the process group; step s = 0 .. R-1. At step s rank r works with the K/V
of its *source* (r - s) mod R: step 0 its own shard, step s > 0 a buffer received from the source, which
holds the source's blocks that r needs, ascending. So at step s every rank receives from r - s and sends
to r + s: a ring's pattern, but each message carries only the blocks the receiver's queries see (a
block of keys is needed when its tile with some query block of the receiver, in some batch element, is not
EMPTY), and a pair with nothing to send exchanges nothing.

A *call* is one single-device attention (``maskc.attention`` on a ``BoundMask.restrict`` sub-block): a run
of consecutive query blocks of the rank against a run of consecutive key blocks of the step's buffer,
listed only when some tile between them is not EMPTY. The calls' outputs are merged by their LSE.

Invariants: ``recv[r][s]`` is, for s > 0, exactly the blocks of rank (r - s) that rank r needs (for s = 0,
those of its own); the calls of (r, s) cover every non-EMPTY tile between r's blocks and ``recv[r][s]``
exactly once, and each call's rows and keys are contiguous both in the shard or buffer and in the
original sequence.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .shard import Sharding


@dataclass(frozen=True)
class Call:
    """One attention call: rows ``q_rows`` of the rank's shard against rows ``kv_rows`` of the step's K/V
    (the shard itself at step 0); ``q_range`` and ``kv_range`` are the same rows as original positions."""

    q_rows: tuple[int, int]
    kv_rows: tuple[int, int]
    q_range: tuple[int, int]
    kv_range: tuple[int, int]


@dataclass(frozen=True, eq=False)
class Plan:
    """The sharding, and per rank and step the blocks received and the calls (see the module docstring).
    Pure data, the same on every rank; ``bound`` is the mask it was made for."""

    bound: object
    sharding: Sharding
    recv: tuple[tuple[np.ndarray, ...], ...]            # recv[r][s]: int64 block ids, ascending
    calls: tuple[tuple[tuple[Call, ...], ...], ...]     # calls[r][s]

    world_size = property(lambda self: self.sharding.world_size)
    block = property(lambda self: self.sharding.block)
    seq_len = property(lambda self: self.sharding.seq_len)
    local_len = property(lambda self: self.sharding.local_len)
    permutation = property(lambda self: self.sharding.permutation)
    imbalance = property(lambda self: self.sharding.imbalance)

    def rows(self, rank: int) -> np.ndarray:
        return self.sharding.rows(rank)

    def source(self, rank: int, step: int) -> int:
        return (rank - step) % self.world_size

    def send(self, rank: int, step: int) -> np.ndarray:
        """The blocks ``rank`` sends at ``step`` (to rank + step): what that rank receives then."""
        return self.recv[(rank + step) % self.world_size][step] if step else self.recv[rank][0][:0]

    def received_blocks(self, rank: int) -> int:
        """Blocks of K/V ``rank`` receives in one forward pass."""
        return sum(len(b) for b in self.recv[rank][1:])

    def restricted(self, call: Call):
        """The call's sub-block of the bound mask (cached: its descriptor and kernels are reused)."""
        cache = self.__dict__.setdefault("_restricted", {})
        key = (call.q_range, call.kv_range)
        if key not in cache:
            cache[key] = self.bound.restrict(call.q_range, call.kv_range)
        return cache[key]

    def shard(self, x, rank: int, dim: int = 2):
        """``rank``'s rows of ``x`` (a torch tensor or numpy array holding the whole sequence along ``dim``)."""
        rows = self.rows(rank)
        if hasattr(x, "index_select"):
            import torch
            return x.index_select(dim, torch.as_tensor(rows, device=x.device))
        return np.take(x, rows, axis=dim)

    def unshard(self, shards, dim: int = 2):
        """The whole sequence from every rank's shard (in rank order): the inverse of :meth:`shard`."""
        inverse = np.argsort(self.permutation)
        if hasattr(shards[0], "index_select"):
            import torch
            return torch.cat(list(shards), dim).index_select(dim, torch.as_tensor(inverse, device=shards[0].device))
        return np.take(np.concatenate(shards, axis=dim), inverse, axis=dim)


def make_plan(bound, sharding: Sharding) -> Plan:
    """The plan of ``bound`` over ``sharding`` (see the module docstring); O(runs of the tiles at the
    sharding's block + calls)."""
    R = sharding.world_size
    tm = bound.tile_map(sharding.block, sharding.block)
    recv, calls = [], []
    for r in range(R):
        starts, ends = _touched(tm, sharding.rank_blocks[r])
        edges = np.zeros(sharding.n_blocks + 1, np.int64)
        np.add.at(edges, starts, 1)
        np.add.at(edges, ends, -1)
        needed = np.cumsum(edges)[:-1] > 0
        per_step_recv, per_step_calls = [], []
        for s in range(R):
            src = (r - s) % R
            blocks = np.nonzero(needed & (sharding.owner == src))[0]
            per_step_recv.append(blocks)
            position = sharding.local_block[blocks] if s == 0 else np.arange(len(blocks))
            per_step_calls.append(tuple(_calls(sharding, r, blocks, position, tm)))
        recv.append(tuple(per_step_recv))
        calls.append(tuple(per_step_calls))
    return Plan(bound, sharding, tuple(recv), tuple(calls))


def _runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """[start, stop) index ranges of ``ids`` over which the ids go up by one."""
    if not len(ids):
        return []
    cut = np.nonzero(np.diff(ids) != 1)[0] + 1
    starts = np.concatenate([[0], cut])
    stops = np.concatenate([cut, [len(ids)]])
    return list(zip(starts.tolist(), stops.tolist()))


def _touched(tm, q_blocks: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, ends): sorted disjoint [start, end) kv-block ranges touched (not EMPTY) by any of
    ``q_blocks`` in any batch element."""
    rows = (np.arange(tm.batch)[:, None] * tm.n_q_blocks + np.asarray(q_blocks)[None, :]).reshape(-1)
    lo, hi = tm.run_offsets[rows].astype(np.int64), tm.run_offsets[rows + 1].astype(np.int64)
    counts = hi - lo
    first = np.concatenate([[0], np.cumsum(counts)[:-1]])
    idx = np.repeat(lo - first, counts) + np.arange(counts.sum())      # the rows' runs, gathered
    begin, end = tm.runs[idx, 0].astype(np.int64), tm.runs[idx, 1].astype(np.int64)
    if not len(begin):
        return begin, end
    order = np.lexsort((end, begin))
    begin, end = begin[order], end[order]
    new = np.ones(len(begin), bool)
    new[1:] = begin[1:] > np.maximum.accumulate(end)[:-1]
    heads = np.nonzero(new)[0]
    return begin[heads], np.maximum.reduceat(end, heads)


def _calls(sharding: Sharding, rank: int, kv_blocks: np.ndarray, kv_position: np.ndarray, tm):
    """The calls of ``rank`` against the buffer holding ``kv_blocks`` at ``kv_position`` (in blocks)."""
    block = sharding.block
    mine = sharding.rank_blocks[rank]
    for q0, q1 in _runs(mine):
        q_blocks = mine[q0:q1]
        starts, ends = _touched(tm, q_blocks)
        for k0, k1 in _runs(kv_blocks):
            first, last = int(kv_blocks[k0]), int(kv_blocks[k1 - 1]) + 1
            i = np.searchsorted(ends, first, side="right")      # the first touched range ending past `first`
            if i == len(ends) or starts[i] >= last:
                continue
            p = int(kv_position[k0])
            yield Call((q0 * block, q1 * block), (p * block, (p + k1 - k0) * block),
                       (int(q_blocks[0]) * block, (int(q_blocks[-1]) + 1) * block), (first * block, last * block))

