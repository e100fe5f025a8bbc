"""Work per query block: how many (q, k) pairs each block of query rows sees, the quantity sharding balances.

Exact masks: from the rows' visible intervals, head by head for masks that read h (no pair is evaluated).
Others: FULL tiles counted whole, the mask evaluated pair by pair inside PARTIAL tiles only (one query block
at a time, per head for masks that read h). Both are exact counts; the second costs O(pairs in PARTIAL tiles).
"""
from __future__ import annotations

import numpy as np

from maskc.analysis.classify import visible_keys_per_row
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.keys import TooMany
from maskc.kernel_ir import FULL, PARTIAL

_CHUNK_ROWS = 1 << 16       # rows per interval pass: bounded memory at millions of tokens


def block_pairs(bound, block: int) -> np.ndarray:
    """int64[ceil(seq_len / block)]: visible pairs of each block of ``block`` query rows, summed over the
    batch (and over the heads for a mask that reads h)."""
    S = bound.seq_len
    nb = -(-S // block)
    total = np.zeros(nb, np.int64)
    compiled = bound.mask
    if compiled.exact:
        chunk = max(block, _CHUNK_ROWS // block * block)
        heads = range(bound.num_heads) if compiled.ranges.uses_head else (0,)
        try:
            for b, element in enumerate(bound.params.batch):
                ranges = compiled.specialized(element.ints)
                for row0 in range(0, S, chunk):
                    row1 = min(row0 + chunk, S)
                    for h in heads:
                        counts = visible_keys_per_row(ranges, bound.params, b, (row0, row1), h)
                        total[row0 // block: -(-row1 // block)] += np.add.reduceat(counts,
                                                                                   np.arange(0, row1 - row0, block))
            return total
        except TooMany:           # chunked regions with more intervals than classification enumerates
            total[:] = 0
    return _counted_block_pairs(bound, block)


def _counted_block_pairs(bound, block: int) -> np.ndarray:
    """block_pairs by the tiles: FULL whole, PARTIAL pair by pair (all of a query block's at once)."""
    S, K = bound.seq_len, bound.kv_len
    tm = bound.tile_map(block, block)
    qt = tm.n_q_blocks
    heads = range(bound.num_heads) if bound.mask.ranges.uses_head else (0,)
    total = np.zeros(qt, np.int64)
    for b in range(bound.batch):
        evaluators = [Evaluator(bound.mask.resolved, bound.params.batch[b], S, K, h, b) for h in heads]
        for i in range(qt):
            r = b * qt + i
            runs = tm.runs[tm.run_offsets[r]:tm.run_offsets[r + 1]].astype(np.int64)
            rows = np.arange(i * block, min((i + 1) * block, S), dtype=np.int64)[:, None]
            begin, end = runs[:, 0] * block, np.minimum(runs[:, 1] * block, K)
            full = runs[:, 2] == FULL
            total[i] += len(heads) * len(rows) * int((end - begin)[full].sum())
            partial = runs[:, 2] == PARTIAL
            if partial.any():
                keys = np.concatenate([np.arange(k0, k1) for k0, k1 in zip(begin[partial], end[partial])])
                total[i] += sum(int(np.count_nonzero(ev.visible(rows, keys[None, :]))) for ev in evaluators)
    return total
