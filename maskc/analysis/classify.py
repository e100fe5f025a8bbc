"""Pass 6, tile classification: range mask + bound parameters → :class:`~maskc.kernel_ir.TileMap`.

Invariant: every tile gets exactly one class, and the classes are *sound*: a FULL tile has every
existing pair visible, an EMPTY tile none. They are *exact* (no PARTIAL tile is really full or
empty) when every region is exact (linear in k, or chunked): then each row's visible keys are sorted
disjoint intervals (regions unioned, denies subtracted), and a tile is FULL iff every row in it covers all
its keys, EMPTY iff no row touches any. Regions with opaque atoms are bounded per tile by interval
arithmetic and combined soundly (:mod:`maskc.analysis.sound`).

Memory is linear: exact masks are classified from q-pieces (:mod:`maskc.analysis.pieces`, :mod:`maskc.analysis.piece_tiles`)
or from rows' key intervals, a chunk of q_blocks at a time, and the result is run-length rows
(:mod:`maskc.analysis.tiles`) that grow with the runs, never with the tile grid, counted against ``max_bytes`` as
they are made. Only masks with opaque regions do work per tile (at most :data:`MAX_TILES` tiles). The
dense mask is never built.
"""
from __future__ import annotations

import functools

import numpy as np

from maskc import ir
from maskc.analysis.intervals import visible_slots
from maskc.analysis.keys import TooMany, row_keys, values_at
from maskc.analysis.piece_tiles import Breaks, piece_runs, slopes_ok
from maskc.analysis.pieces import plan_of, runs_from_pieces
from maskc.analysis.rows import RowValues
from maskc.analysis.sound import sound_runs
from maskc.analysis.tiles import agree, concat_csr, key_block_runs, merge_runs, runs_of_keys
from maskc.errors import BindError
from maskc.bound_params import BoundParams
from maskc.kernel_ir import MAX_DESCRIPTOR_BYTES, TileMap
from maskc.runs import MAX_TILES, RunBudget, sizes_text

# Rows are classified in chunks of whole q_blocks: arrays of this many int64 stay small enough to come
# from the allocator's free lists (fresh multi-page buffers cost page faults on every numpy op) and
# from the cache.
_CHUNK_ROWS = 8192
# q_blocks classified from pieces at once: the pieces' temporaries stay bounded at any length.
_PIECE_BLOCKS = 1 << 14
# Key intervals one enumeration may produce for chunked regions before the batch element's classes fall
# back to sound bounds (the enumeration's arrays then peak near 200 MB).
_BUDGET = 1 << 20

"""The most tiles one classification of a mask with opaque regions covers (batch elements x heads the mask
reads x q_blocks x kv_blocks), whose work is per tile: 2,097,152 tokens a side at 128 x 128 tiles; past it,
a BindError before any work. Exact masks have no such limit: their work grows with the runs."""


def classify_batch_element(mask: ir.RangeMask, bound: BoundParams, b: int, block_m: int, block_n: int,
                           head: int = 0, budget: RunBudget | None = None):
    """CSR runs (offsets int32[QT+1], runs int32[n, 3]) of one batch element and head, and whether they
    are exact (chunked regions past the budget are classified soundly instead): sound for that head (the
    caller agrees the heads). ``budget`` counts the runs as they are made."""
    S, K = bound.seq_len, bound.kv_len
    params = bound.batch[b]
    counted = budget.add if budget is not None else (lambda runs: None)
    if mask.linear:
        plan = _piece_plan(mask)
        step = _PIECE_BLOCKS * block_m if plan is not None else max(block_m, _CHUNK_ROWS // block_m * block_m)
        parts = []
        for row0 in range(0, S, step):
            rows = (row0, min(S, row0 + step))
            parts.append(runs_from_pieces(plan, params, b, head, S, K, block_m, block_n, rows) if plan is not None
                         else _row_runs(mask.allow, mask.deny, params, b, head, S, K, block_m, block_n, rows))
            counted(parts[-1][1])
        return (*concat_csr(parts, -(-S // block_m)), True)
    if mask.exact:
        try:
            found = _chunked_runs(mask, params, b, head, S, K, block_m, block_n)
            counted(found[1])
            return (*found, True)
        except TooMany:
            _check_grid(bound, block_m, block_n, 1, "past the chunk budget, this mask's classes")
    return (*sound_runs(mask, params, b, head, S, K, block_m, block_n, _CHUNK_ROWS, counted), False)


def _piece_plan(mask: ir.RangeMask):
    """The mask's :class:`~maskc.analysis.pieces.PiecePlan` (None where its forms are not affine on pieces), worked
    out on its first classification and kept on it (a RangeMask is immutable)."""
    return ir.kept_on(mask, "_piece_plan", lambda: plan_of(mask.allow, mask.deny))


def _piece_breaks(mask: ir.RangeMask) -> Breaks | None:
    """Where the q-pieces of a mask with chunked regions end (:mod:`maskc.analysis.piece_tiles`), None where its
    forms do not meet the piece conditions (or it has deny regions): worked out once and kept on the mask."""
    def breaks_of() -> Breaks | None:
        breaks = Breaks()
        return breaks if not mask.deny and slopes_ok(mask.allow, breaks) else None
    return ir.kept_on(mask, "_piece_breaks", breaks_of)


def _row_runs(allow, deny, params, b: int, head: int, seq_len: int, kv_len: int, block_m: int, block_n: int,
              rows: tuple[int, int]):
    """CSR runs of the q_blocks of rows [row0, row1) (whole q_blocks) of an exact mask linear in k, from each
    row's visible slots."""
    row0, row1 = rows
    values = RowValues(params, seq_len, kv_len, head, b, np.arange(row0, row1, dtype=np.int64))
    slots = [(lo, hi, lo, hi) for lo, hi in visible_slots(allow, deny, values, kv_len)]
    qt = -(-(row1 - row0) // block_m)
    if not slots:
        return np.zeros(qt + 1, np.int32), np.zeros((0, 3), np.int32)
    block = np.arange(row1 - row0) // block_m
    return runs_of_keys(block, slots, np.bincount(block, minlength=qt), kv_len, block_n, qt)


def _chunked_runs(mask: ir.RangeMask, params, b, head, S, K, block_m, block_n):
    """Exact CSR runs of a mask whose regions are all exact, some chunked: from q-pieces where the mask
    allows it (maskc.analysis.piece_tiles), row by row for the q_blocks the pieces cannot settle."""
    make = values_at(params, S, K, head, b)
    qt = -(-S // block_m)
    breaks = _piece_breaks(mask)
    parts = tuple([np.zeros(0, np.int64)] for _ in range(4))
    if breaks is not None:
        found, bad = piece_runs(mask.allow, breaks, make, params, b, head, S, K, block_m, block_n, _BUDGET)
        for part, values in zip(parts, found):
            part.append(values)
    else:
        bad = np.ones(qt, bool)
    blocks = bad.nonzero()[0]
    if breaks is not None and not len(blocks):         # the pieces' runs alone, in order already
        q_block, begin, end, kind = found
        return merge_runs(q_block, begin, end, kind, qt, ordered=True)
    step = max(1, _CHUNK_ROWS // block_m)           # a group of q_blocks at a time: bounded rows (intervals)
    for i in range(0, len(blocks), step):
        group = blocks[i:i + step]
        counts = np.minimum(block_m, S - group * block_m)
        rows = np.concatenate([np.arange(t * block_m, t * block_m + c) for t, c in zip(group, counts)])
        row, lo, hi = row_keys(mask.allow, mask.deny, make, rows, K, _BUDGET)
        offsets, runs = key_block_runs(np.repeat(np.arange(len(group)), counts), row, lo, hi, counts, K, block_n,
                                       len(group))
        per = offsets[1:] - offsets[:-1]
        for part, values in zip(parts, (np.repeat(group, per), runs[:, 0], runs[:, 1], runs[:, 2])):
            part.append(values)
    rows, begins, ends, kinds = (np.concatenate(p) for p in parts)
    return merge_runs(rows, begins, ends, kinds, qt)


def _check_grid(bound: BoundParams, block_m: int, block_n: int, heads: int, what: str = "this mask's classes") -> None:
    """Work per tile (masks with opaque regions): at most MAX_TILES tiles, else a BindError."""
    qt, kt = -(-bound.seq_len // block_m), -(-bound.kv_len // block_n)
    tiles = len(bound.batch) * heads * qt * kt
    if tiles > MAX_TILES:
        per = f" x {len(bound.batch)} batch elements" if len(bound.batch) > 1 else ""
        per += f" x {heads} heads" if heads > 1 else ""
        raise BindError(f"seq_len = {bound.seq_len} and kv_len = {bound.kv_len} at {block_m} x {block_n} tiles make "
                        f"{qt} x {kt}{per} = {tiles} tiles; {what} are bounded tile by tile (the mask has "
                        f"regions maskc cannot solve for k), at most {MAX_TILES} (2**28) tiles at once",
                        hint="use larger tiles, or split the sequence with restrict() (context parallelism)")


def classify(mask, bound: BoundParams, block_m: int, block_n: int, max_bytes: int = MAX_DESCRIPTOR_BYTES) -> TileMap:
    """Tile runs of every batch element (for masks that use h: sound for every head at once).

    ``mask`` is a RangeMask, or one per batch element (each specialized to that element's values).
    ``max_bytes`` caps the run-length rows (with their offsets and work order): a BindError naming it
    before any work when the rows alone pass it, else as soon as the runs made pass it (a chunk of q_blocks
    at a time).
    """
    masks = [mask] * len(bound.batch) if isinstance(mask, ir.RangeMask) else list(mask)
    kt = -(-bound.kv_len // block_n)
    qt = -(-bound.seq_len // block_m)
    what = functools.partial(sizes_text, bound.seq_len, bound.kv_len, block_m, block_n, len(bound.batch))
    budget = RunBudget(max_bytes, what, 8 * len(bound.batch) * qt + 4)     # offsets and work order
    if not all(m.exact for m in masks):
        _check_grid(bound, block_m, block_n, (bound.num_heads or 1) if any(m.uses_head for m in masks) else 1)
    parts = []
    exact = True
    for b, mask in enumerate(masks):
        uses_head = mask.uses_head
        per_head = [classify_batch_element(mask, bound, b, block_m, block_n, h, budget)
                    for h in range((bound.num_heads or 1) if uses_head else 1)]
        exact &= all(e for _, _, e in per_head) and not uses_head
        # a tile keeps a class only if every head agrees on it
        parts.append(agree([(o, r) for o, r, _ in per_head], kt) if len(per_head) > 1 else per_head[0][:2])
    offsets, runs = concat_csr(parts, len(bound.batch) * qt)
    return TileMap(block_m, block_n, bound.seq_len, bound.kv_len, len(bound.batch), offsets, runs, exact=exact)


def visible_pairs(mask: ir.RangeMask, bound: BoundParams) -> int:
    """How many (q, k) pairs are visible, summed over the batch (and the heads of a mask that reads h); never
    builds the dense mask.

    Exact masks sum their rows' interval lengths (chunked regions enumerated;
    :class:`~maskc.analysis.keys.TooMany` past the budget); the pairs of other masks are counted by
    :mod:`maskc.audit`.
    """
    heads = range(bound.num_heads or 1) if mask.uses_head else (0,)
    return sum(int(visible_keys_per_row(mask, bound, b, head=h).sum()) for b in range(len(bound.batch))
               for h in heads)


def visible_keys_per_row(mask: ir.RangeMask, bound: BoundParams, b: int, rows: tuple[int, int] | None = None,
                         head: int = 0):
    """int64[rows]: how many keys each query row of batch element ``b`` (and head ``head``) sees (all rows,
    or [row0, row1)), from the rows' visible intervals (:func:`visible_intervals`): exact masks only."""
    row0, row1 = rows or (0, bound.seq_len)
    counts = np.zeros(row1 - row0, np.int64)
    for start in range(row0, row1, _CHUNK_ROWS):
        q = np.arange(start, min(start + _CHUNK_ROWS, row1), dtype=np.int64)
        row, lo, hi = visible_intervals(mask, bound.batch[b], bound.seq_len, bound.kv_len, b, q, head)
        counts[start - row0: start - row0 + len(q)] = np.bincount(row, hi - lo, minlength=len(q)).astype(np.int64)
    return counts


def visible_intervals(mask: ir.RangeMask, params, seq_len: int, kv_len: int, b: int, q: np.ndarray,
                      head: int = 0):
    """Flat ``(row, lo, hi)``: the visible keys ``[lo, hi)`` of the rows ``q[row]`` of batch element ``b`` and
    head ``head`` (read by masks that read h), disjoint within a row, for an exact mask (chunked regions
    enumerated, :class:`~maskc.analysis.keys.TooMany` past the budget); never the dense mask."""
    if not mask.exact:
        raise NotImplementedError("visible intervals of a non-exact mask: count pairs with maskc.audit")
    if mask.linear:
        slots = visible_slots(mask.allow, mask.deny, RowValues(params, seq_len, kv_len, head, b, q), kv_len)
        row = np.tile(np.arange(len(q)), len(slots))
        lo = np.concatenate([lo for lo, _ in slots]) if slots else np.zeros(0, np.int64)
        hi = np.concatenate([hi for _, hi in slots]) if slots else np.zeros(0, np.int64)
        live = lo < hi
        return row[live], lo[live], hi[live]
    return row_keys(mask.allow, mask.deny, values_at(params, seq_len, kv_len, head, b), q, kv_len, _BUDGET)
