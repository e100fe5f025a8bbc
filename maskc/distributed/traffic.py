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
from typing import TYPE_CHECKING

import numpy as np

from maskc.distributed.shard import Sharding

if TYPE_CHECKING:
    from maskc.pipeline import BoundMask


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

    bound: "BoundMask"
    sharding: Sharding
    recv: tuple[tuple[np.ndarray, ...], ...]            # recv[r][s]: int64 block ids, ascending
    calls: tuple[tuple[tuple[Call, ...], ...], ...]     # calls[r][s]
    depth: int = 1      # transfers posted this many steps ahead of the compute (the same on every rank)

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


def make_plan(bound: "BoundMask", sharding: Sharding, fetch: str = "seen", prefetch_tokens: int | None = None) -> Plan:
    """The plan of ``bound`` over ``sharding`` (see the module docstring); O(runs of the tiles at the
    sharding's block + R * blocks + calls). ``fetch="all"`` receives every block of every source instead
    (ring attention's traffic, for comparisons); the calls are the same. ``prefetch_tokens`` (default: four
    shards; a double-buffered ring holds two) bounds the K/V positions a rank has in flight, sent or
    received: transfers are posted as many steps ahead as that allows on every rank (:func:`_depth`)."""
    if fetch not in ("seen", "all"):
        raise ValueError(f"fetch must be 'seen' or 'all', got {fetch!r}")
    R = sharding.world_size
    tm = bound.tile_map(sharding.block, sharding.block)
    recv, calls = [], []
    for r in range(R):
        mine = sharding.rank_blocks[r]
        q_runs = [(q0, q1, *_touched(tm, mine[q0:q1])) for q0, q1 in _runs(mine)]
        edges = np.zeros(sharding.n_blocks + 1, np.int64)
        for _, _, starts, ends in q_runs:
            np.add.at(edges, starts, 1)
            np.add.at(edges, ends, -1)
        needed = np.nonzero(np.cumsum(edges)[:-1] > 0)[0]
        per_step_recv, per_step_calls = [], []
        for s in range(R):
            src = (r - s) % R
            if fetch == "all" and s:
                blocks = sharding.rank_blocks[src]
            else:
                blocks = needed[sharding.owner[needed] == src]
            per_step_recv.append(blocks)
            position = sharding.local_block[blocks] if s == 0 else np.arange(len(blocks))
            per_step_calls.append(tuple(_calls(sharding, mine, q_runs, blocks, position)))
        recv.append(tuple(per_step_recv))
        calls.append(tuple(per_step_calls))
    budget = 4 * sharding.local_len if prefetch_tokens is None else prefetch_tokens
    return Plan(bound, sharding, tuple(recv), tuple(calls), _depth(recv, sharding.block, budget))


def _depth(recv, block: int, budget: int) -> int:
    """The most steps d >= 1 such that no rank ever has more than ``budget`` positions of K/V in flight
    when it posts d steps ahead: received over steps s .. s+d-1 plus sent over the same steps. Posting
    ahead lets a rank take its K/V before a slower source reaches the same step."""
    R = len(recv)
    held = np.array([[len(recv[r][s]) + len(recv[(r + s) % R][s]) for s in range(1, R)] for r in range(R)],
                    np.int64).reshape(R, R - 1) * block
    depth = 1
    for d in range(2, R):
        window = np.lib.stride_tricks.sliding_window_view(held, d, axis=1).sum(axis=2)
        if window.max(initial=0) > budget:
            break
        depth = d
    return depth


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


def _calls(sharding: Sharding, mine: np.ndarray, q_runs, kv_blocks: np.ndarray, kv_position: np.ndarray):
    """The calls of a rank holding blocks ``mine`` (runs ``q_runs``: (start, stop, touched starts, touched
    ends)) against the buffer holding ``kv_blocks`` at ``kv_position`` (in blocks)."""
    block = sharding.block
    kv_runs = _runs(kv_blocks)
    for q0, q1, starts, ends in q_runs:
        for k0, k1 in kv_runs:
            first, last = int(kv_blocks[k0]), int(kv_blocks[k1 - 1]) + 1
            i = np.searchsorted(ends, first, side="right")      # the first touched range ending past `first`
            if i == len(ends) or starts[i] >= last:
                continue
            p = int(kv_position[k0])
            yield Call((q0 * block, q1 * block), (p * block, (p + k1 - k0) * block),
                       (int(mine[q0]) * block, (int(mine[q1 - 1]) + 1) * block), (first * block, last * block))
