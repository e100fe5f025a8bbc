"""Brute-force audits of a bound mask, one query block at a time (O(block_m * kv_len) memory).

For what the passes cannot state exactly on their own: how many visible pairs a non-affine mask has,
and how many of its PARTIAL tiles are really FULL or EMPTY (the price of conservative classes).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from maskc.analysis.evaluate import Evaluator
from maskc.kernel_ir import EMPTY, FULL, PARTIAL


def _row_blocks(bound, batch_index: int, block_m: int, head: int = 0):
    """(q_block index, bool[rows, kv_len]) for every query block, evaluated pair by pair."""
    ev = Evaluator(bound.mask.resolved, bound.params.batch[batch_index], bound.seq_len, bound.kv_len,
                   head, batch_index)
    k = np.arange(bound.kv_len, dtype=np.int64)[None, :]
    for i, start in enumerate(range(0, bound.seq_len, block_m)):
        q = np.arange(start, min(start + block_m, bound.seq_len), dtype=np.int64)[:, None]
        yield i, np.broadcast_to(ev.visible(q, k), (q.shape[0], bound.kv_len))


def count_visible_pairs(bound, block_m: int = 256) -> int:
    """Visible pairs summed over the batch (and over heads for masks that read h), by brute force."""
    heads = range(bound.num_heads) if bound.mask.ranges.uses_head else (0,)
    return sum(int(rows.sum()) for b in range(bound.batch) for h in heads
               for _, rows in _row_blocks(bound, b, block_m, h))


@dataclass(frozen=True)
class TileAudit:
    partial: int            # tiles classified PARTIAL
    really_full: int        # ... whose pairs are in fact all visible
    really_empty: int       # ... whose pairs are in fact all hidden
    unsound: int            # FULL or EMPTY tiles that are wrong (must be 0)


def audit_tiles(bound, block_m: int = 128, block_n: int = 128) -> TileAudit:
    """Compare the tile classes with brute force, query block by query block. For a mask that reads h the
    truth is every head's at once, as the classes are: a tile is FULL (EMPTY) when it is for every head."""
    classes = bound.tile_map(block_m, block_n).classes
    kt = classes.shape[2]
    heads = range(bound.num_heads) if bound.mask.ranges.uses_head else (0,)
    partial = really_full = really_empty = unsound = 0
    for b in range(bound.batch):
        for blocks in zip(*(_row_blocks(bound, b, block_m, h) for h in heads)):
            i, rows = blocks[0]
            pairs = np.minimum(block_n, bound.kv_len - np.arange(kt) * block_n) * rows.shape[0]
            seen = [_seen_per_key_block(r, kt, block_n) for _, r in blocks]
            truth = np.where(np.logical_and.reduce([s == 0 for s in seen]), EMPTY,
                             np.where(np.logical_and.reduce([s == pairs for s in seen]), FULL, PARTIAL))
            got = classes[b, i]
            partial += int((got == PARTIAL).sum())
            really_full += int(((got == PARTIAL) & (truth == FULL)).sum())
            really_empty += int(((got == PARTIAL) & (truth == EMPTY)).sum())
            unsound += int(((got != PARTIAL) & (got != truth)).sum())
    return TileAudit(partial, really_full, really_empty, unsound)


def _seen_per_key_block(rows: np.ndarray, kt: int, block_n: int) -> np.ndarray:
    """int[kt]: the visible pairs of a query block's rows in each key block."""
    pad = np.zeros((rows.shape[0], kt * block_n), bool)
    pad[:, :rows.shape[1]] = rows
    return pad.reshape(rows.shape[0], kt, block_n).sum(axis=(0, 2))
