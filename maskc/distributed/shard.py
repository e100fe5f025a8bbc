"""Mask-aware sharding for context parallelism: which query blocks each rank holds.

Invariant: every block of ``block`` tokens goes to exactly one rank and every rank gets the same number of
blocks (the same number of tokens: the rest of the model sees equal shards); each rank's blocks are in
ascending order, its shard is their rows concatenated, and ``permutation`` lists the original position of
every row of rank 0's shard, then rank 1's, ... The assignment balances the visible pairs per rank.

How: the sequence is cut into ``units_per_rank * world_size`` equal units of consecutive blocks; units
are dealt heaviest first to the least-loaded rank with room (LPT with a capacity), then loads are evened by
swapping units between the heaviest rank and the others. The fewest units per rank that reach
``tolerance`` (max / mean pairs) win (when none does, the lowest imbalance, with a small charge per run of
blocks: ``Sharding.score``): contiguous slices when the work is uniform (sliding windows,
bidirectional documents), two units per rank for causal (this is zig-zag: rank r gets units r and 2R-1-r),
more for documents, shared prompts and HSTU users, whose runs of heavy blocks the units follow. Fewer units
mean fewer, larger kernel calls and, for local masks, less K/V to fetch.
"""
from __future__ import annotations

import functools
import heapq
from dataclasses import dataclass

import numpy as np

from maskc.distributed.work import block_pairs

# A rank's time per kernel call, relative (see Sharding.score): at 128K tokens per GPU one call costs ~0.16 ms
# of host time forward and backward (README, run 20) against ~0.1-1 s of attention per step.
RUN_COST = 1e-3


class ShardingError(ValueError):
    """Lengths that cannot be split into equal shards of whole blocks."""


@dataclass(frozen=True, eq=False)
class Sharding:
    """Query (and key/value) blocks per rank; see the module docstring.

    ``rank_blocks`` int64[world_size, blocks_per_rank], ascending per rank; ``work`` int64[n_blocks] the
    visible pairs of each block; ``units_per_rank`` how finely the sequence was cut to balance it."""

    seq_len: int
    block: int
    rank_blocks: np.ndarray
    work: np.ndarray
    units_per_rank: int

    world_size = property(lambda self: self.rank_blocks.shape[0])
    blocks_per_rank = property(lambda self: self.rank_blocks.shape[1])
    n_blocks = property(lambda self: self.rank_blocks.size)
    local_len = property(lambda self: self.seq_len // self.world_size)

    @functools.cached_property
    def owner(self) -> np.ndarray:
        """int64[n_blocks]: the rank holding each block."""
        out = np.empty(self.n_blocks, np.int64)
        out[self.rank_blocks] = np.arange(self.world_size)[:, None]
        return out

    @functools.cached_property
    def local_block(self) -> np.ndarray:
        """int64[n_blocks]: each block's index among its rank's blocks (its rows start at that times block)."""
        out = np.empty(self.n_blocks, np.int64)
        out[self.rank_blocks] = np.arange(self.blocks_per_rank)[None, :]
        return out

    @functools.cached_property
    def permutation(self) -> np.ndarray:
        """int64[seq_len]: original position of each row of the shards laid end to end (rank-major)."""
        return (self.rank_blocks.reshape(-1, 1) * self.block + np.arange(self.block)).reshape(-1)

    def rows(self, rank: int) -> np.ndarray:
        """int64[local_len]: the original positions of ``rank``'s shard, in shard order."""
        n = self.local_len
        return self.permutation[rank * n:(rank + 1) * n]

    @property
    def loads(self) -> np.ndarray:
        """int64[world_size]: visible pairs per rank."""
        return self.work[self.rank_blocks].sum(axis=1)

    @property
    def imbalance(self) -> float:
        """max / mean of visible pairs per rank (1.0 is perfect; 1.0 when nothing is visible)."""
        return _imbalance(self.loads)

    @property
    def runs(self) -> int:
        """The most runs of consecutive blocks a rank holds (each is a separate kernel call per step)."""
        return int(1 + (np.diff(self.rank_blocks, axis=1) != 1).sum(axis=1).max())

    @property
    def score(self) -> float:
        """What :func:`shard` minimizes when no cut reaches its tolerance: the imbalance, plus RUN_COST of a
        rank's time per call, taking a rank's calls per step to grow as runs squared (its runs against each
        source's): 34 runs of 32 rows cost more than a 5% imbalance."""
        return self.imbalance * (1.0 + RUN_COST * self.runs ** 2)


def _imbalance(loads: np.ndarray) -> float:
    mean = loads.mean()
    return float(loads.max() / mean) if mean > 0 else 1.0


def shard(bound, world_size: int, block: int = 128, tolerance: float = 1.02, min_block: int | None = None,
          ranks_per_node: int | None = None) -> Sharding:
    """Balance ``bound``'s visible pairs over ``world_size`` ranks in blocks of ``block`` query rows (the
    module docstring says how); seq_len must be a multiple of world_size * block. When no cut reaches
    ``tolerance``, halved blocks are tried down to ``min_block`` (default block // 4): a few very heavy
    rows (clear's text tokens see every key) need small blocks to be spread over the ranks.
    ``ranks_per_node``: shard over nodes first, then over each node's ranks (see :func:`assign`)."""
    if bound.kv_len != bound.seq_len:
        raise ShardingError(f"context parallelism shards one sequence: kv_len ({bound.kv_len}) must equal "
                            f"seq_len ({bound.seq_len})")
    _check_lengths(bound.seq_len, world_size, block)
    min_block = max(1, block // 4) if min_block is None else min_block
    blocks = [block]
    while blocks[-1] % 2 == 0 and blocks[-1] // 2 >= min_block:
        blocks.append(blocks[-1] // 2)
    best, finest = None, None
    for b in blocks:
        if b == block:
            work = block_pairs(bound, b)
        else:                            # counted once at the finest block, summed for the others
            finest = block_pairs(bound, blocks[-1]) if finest is None else finest
            work = finest.reshape(-1, b // blocks[-1]).sum(axis=1)
        candidate = assign(work, world_size, bound.seq_len, b, tolerance, ranks_per_node)
        if best is None or candidate.score < best.score - 1e-12:
            best = candidate
        if best.imbalance <= tolerance:
            break
    assert best is not None
    return best


def _check_lengths(seq_len: int, world_size: int, block: int) -> None:
    if world_size < 1 or block < 1:
        raise ShardingError(f"world_size ({world_size}) and block ({block}) must be positive")
    if seq_len % (world_size * block):
        raise ShardingError(f"seq_len {seq_len} is not a multiple of world_size * block = {world_size} * {block}: "
                            "pad the sequence (a padding document), or take a smaller block")


def assign(work: np.ndarray, world_size: int, seq_len: int, block: int, tolerance: float = 1.02,
           ranks_per_node: int | None = None) -> Sharding:
    """The sharding of blocks with the given ``work`` (see :func:`shard`; pure, for any weights).

    With ``ranks_per_node`` (a divisor of world_size, smaller than it) the blocks are first dealt to the
    nodes as to world_size / ranks_per_node ranks, then each node's blocks (in order) to its ranks: a node
    keeps long stretches of the sequence, so fewer K/V blocks cross the slow links between nodes. Ranks
    n * ranks_per_node ... (n + 1) * ranks_per_node - 1 are node n's. ``units_per_rank`` is then the inner
    level's."""
    if ranks_per_node and 1 < ranks_per_node < world_size and world_size % ranks_per_node == 0:
        _check_lengths(seq_len, world_size, block)
        nodes = assign(work, world_size // ranks_per_node, seq_len, block, tolerance)
        rank_blocks, units = [], 1
        for node_blocks in nodes.rank_blocks:
            inner = assign(np.asarray(work)[node_blocks], ranks_per_node, len(node_blocks) * block, block, tolerance)
            rank_blocks += [node_blocks[rb] for rb in inner.rank_blocks]
            units = max(units, inner.units_per_rank)
        return Sharding(seq_len, block, np.stack(rank_blocks), np.asarray(work, np.int64), units)
    _check_lengths(seq_len, world_size, block)
    work = np.asarray(work, np.int64)
    per_rank = seq_len // (world_size * block)
    if len(work) != per_rank * world_size:
        raise ShardingError(f"{len(work)} block weights for {per_rank * world_size} blocks")
    best = None
    for units in (u for u in range(1, per_rank + 1) if per_rank % u == 0):
        unit_work = work.reshape(world_size * units, -1).sum(axis=1)
        candidate = _from_units(_deal(unit_work, world_size, units), world_size, units, seq_len, block, work)
        if best is None or candidate.score < best.score - 1e-12:
            best = candidate
        if candidate.imbalance <= tolerance:
            return candidate
    assert best is not None
    return best


def _from_units(owner: np.ndarray, world_size: int, units: int, seq_len: int, block: int, work) -> Sharding:
    """The sharding where rank ``owner[u]`` holds unit u (``units`` per rank, in order)."""
    unit_blocks = np.arange(len(owner) * (seq_len // block // len(owner))).reshape(len(owner), -1)
    rank_blocks = np.stack([unit_blocks[np.nonzero(owner == r)[0]].reshape(-1) for r in range(world_size)])
    return Sharding(seq_len, block, rank_blocks, np.asarray(work, np.int64), units)


def zigzag(work: np.ndarray, world_size: int, seq_len: int, block: int) -> Sharding:
    """The mask-blind layout of load-balanced ring attention (PyTorch's context_parallel for causal): 2R
    equal chunks, rank r holding chunks r and 2R-1-r (contiguous slices when a rank has a single block).
    For comparisons."""
    _check_lengths(seq_len, world_size, block)
    per_rank = seq_len // (world_size * block)
    units = 2 if per_rank % 2 == 0 else 1
    ranks = np.arange(world_size)
    owner = np.concatenate([ranks, ranks[::-1]]) if units == 2 else ranks
    return _from_units(owner, world_size, units, seq_len, block, work)


def _deal(unit_work: np.ndarray, ranks: int, capacity: int) -> np.ndarray:
    """int64[units]: an owner per unit, ``capacity`` units per rank, heaviest first to the least loaded rank
    with room (ties to the lower rank), then evened by swaps (:func:`_even`)."""
    owner = np.empty(len(unit_work), np.int64)
    heap = [(0, r) for r in range(ranks)]
    room = [capacity] * ranks
    for u in np.argsort(-unit_work, kind="stable"):
        load, r = heapq.heappop(heap)
        owner[u] = r
        room[r] -= 1
        if room[r]:
            heapq.heappush(heap, (load + int(unit_work[u]), r))
    return _gather_equal(unit_work, _even(unit_work, owner, ranks), ranks)


def _gather_equal(unit_work: np.ndarray, owner: np.ndarray, ranks: int) -> np.ndarray:
    """The same loads with fewer runs: units of equal work are interchangeable, so each rank's share of a
    weight class is given back as consecutive units of that class (clear's image rows, the middle of a
    sliding window), rank 0 first."""
    owner = owner.copy()
    values, inverse, counts = np.unique(unit_work, return_inverse=True, return_counts=True)
    for c in np.nonzero(counts > 1)[0]:
        units = np.nonzero(inverse == c)[0]                   # ascending positions
        owner[units] = np.repeat(np.arange(ranks), np.bincount(owner[units], minlength=ranks))
    return owner


def _even(unit_work: np.ndarray, owner: np.ndarray, ranks: int, max_swaps: int = 1000) -> np.ndarray:
    """Swap a unit of the heaviest rank with a lighter unit of another rank while that lowers the larger of
    the two loads; each swap strictly lowers the heaviest rank's load, so this ends."""
    owner = owner.copy()
    loads = np.bincount(owner, unit_work, minlength=ranks).astype(np.int64)
    for _ in range(max_swaps):
        a = int(np.argmax(loads))
        mine = np.nonzero(owner == a)[0]
        best = None                      # (new max of the pair, unit of a, unit of b, b)
        for b in np.argsort(loads, kind="stable"):
            gap = loads[a] - loads[b]
            if b == a or gap <= 0:
                continue
            theirs = np.nonzero(owner == b)[0]
            order = np.argsort(unit_work[theirs], kind="stable")
            theirs, tw = theirs[order], unit_work[theirs][order]
            # For each unit x of a, the unit y of b whose weight is nearest w[x] - gap / 2.
            want = unit_work[mine] - gap / 2
            at = np.clip(np.searchsorted(tw, want), 1, max(len(tw) - 1, 1))
            for pick in (at - 1, np.minimum(at, len(tw) - 1)):
                d = unit_work[mine] - tw[pick]
                ok = (d > 0) & (d < gap)
                if not ok.any():
                    continue
                new_max = np.maximum(loads[a] - d, loads[b] + d)
                i = int(np.argmin(np.where(ok, new_max, np.iinfo(np.int64).max)))
                if best is None or new_max[i] < best[0]:
                    best = (int(new_max[i]), int(mine[i]), int(theirs[pick[i]]), int(b))
        if best is None:
            break
        _, x, y, b = best
        d = int(unit_work[x] - unit_work[y])
        owner[x], owner[y] = b, a
        loads[a] -= d
        loads[b] += d
    return owner
