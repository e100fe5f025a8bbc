"""Pass 6, tile classification: range mask + bound parameters → :class:`~maskc.kernel_ir.TileMap`.

Invariant: every tile gets exactly one class, and the classes are *sound*: a FULL tile has every
existing pair visible, an EMPTY tile none. They are *exact* (no PARTIAL tile is really full or
empty) when every region is exact, i.e. linear in k: then each row's visible keys are computed as
sorted disjoint intervals (regions unioned, denies subtracted, row by row), and a tile is FULL iff
every row in it covers all its keys, EMPTY iff no row touches any. Regions with opaque atoms are
bounded per tile by interval arithmetic and combined soundly. Memory and time are
O(seq_len * regions + tiles); the dense mask is never built.
"""
from __future__ import annotations

import numpy as np

from . import ir
from .errors import BindError
from .kernel_ir import EMPTY, FULL, PARTIAL, BoundParams, TileMap
from .intervals import compact, region_rows, union, visible_slots
from .keys import TooMany, row_keys, values_at
from .piece_tiles import Breaks, piece_runs, slopes_ok
from .pieces import plan_of, runs_from_pieces
from .rows import RowValues, TileIntervals
from .tiles import dense_of, merge_runs, runs_of

def _flat_tile_counts(tile: np.ndarray, lo: np.ndarray, hi: np.ndarray, rows_per_tile: np.ndarray,
                      kv_len: int, block_n: int):
    """For each q_block: which key blocks any of its rows touches, and which every row covers, from key
    intervals ``[lo, hi)`` of rows of the q_blocks ``tile`` (a row's intervals disjoint)."""
    qt_count, kt_count = len(rows_per_tile), -(-kv_len // block_n)
    width = kt_count + 1
    size = qt_count * width
    live = lo < hi
    base, lo, hi = tile[live].astype(np.int64) * width, lo[live], hi[live]
    # Difference arrays along each row block: +1 where a range of key blocks starts, -1 past it.
    touch = np.bincount(base + lo // block_n, minlength=size) - np.bincount(base + -((-hi) // block_n),
                                                                            minlength=size)
    c0 = -((-lo) // block_n)
    c1 = np.where(hi >= kv_len, kt_count, hi // block_n)      # the last, short tile ends at kv_len
    good = c0 < c1
    cover = np.bincount((base + c0)[good], minlength=size) - np.bincount((base + c1)[good], minlength=size)
    touched = np.cumsum(touch.reshape(qt_count, width), axis=1)[:, :kt_count] > 0
    covered = np.cumsum(cover.reshape(qt_count, width), axis=1)[:, :kt_count] == rows_per_tile[:, None]
    return touched, covered


def _tile_counts(slots, row_tile: np.ndarray, rows_per_tile: np.ndarray, kv_len: int, block_n: int):
    """_flat_tile_counts of slots (``row_tile[r]`` is row r's q_block; slots are disjoint within a row)."""
    if not slots:
        empty = np.zeros(0, np.int64)
        return _flat_tile_counts(empty, empty, empty, rows_per_tile, kv_len, block_n)
    return _flat_tile_counts(np.tile(row_tile, len(slots)), np.concatenate([lo for lo, _ in slots]),
                             np.concatenate([hi for _, hi in slots]), rows_per_tile, kv_len, block_n)


def _grid_counts(slots, n_rows, kv_len, block_m, block_n):
    """_tile_counts for rows 0..n_rows-1 (a chunk starting at a q_block)."""
    starts = np.arange(0, n_rows, block_m)
    return _tile_counts(slots, np.arange(n_rows) // block_m, np.minimum(block_m, n_rows - starts),
                        kv_len, block_n)


# Rows are classified in chunks of whole q_blocks: arrays of this many int64 stay small enough to come
# from the allocator's free lists (fresh multi-page buffers cost page faults on every numpy op) and
# from the cache.
_CHUNK_ROWS = 8192
# Tiles counted at once by difference arrays (q_blocks x key blocks, int64): bounded memory at any length.
_GRID_CELLS = 1 << 22


def _chunk_hulls(slots, kv_len: int, block_m: int, block_n: int):
    """Per q_block of one chunk of rows and per slot, the hull of the touched key blocks and the
    intersection of the covered ones; and which q_blocks need exact counting instead.

    The hull and intersection are exact when (a) consecutive non-empty rows' ranges overlap or abut,
    so the rows' union has no hole, and (b) the slots' hulls are disjoint, so a key block is covered
    by one slot in every row or by none. q_blocks failing either check are flagged.
    """
    n_rows = len(slots[0][0])
    kt = -(-kv_len // block_n)
    starts = np.arange(0, n_rows, block_m)
    rows_per_tile = np.minimum(block_m, n_rows - starts)
    fallback = np.zeros(len(starts), bool)
    first_row_of_tile = np.zeros(n_rows, bool)
    first_row_of_tile[starts] = True
    shift = block_n.bit_length() - 1 if block_n & (block_n - 1) == 0 else None
    big = np.int64(1) << 40
    hulls = []
    for lo, hi in slots:
        live = lo < hi
        if shift is not None:
            t0, t1, c0 = lo >> shift, (hi + (block_n - 1)) >> shift, (lo + (block_n - 1)) >> shift
            c1 = hi >> shift
        else:
            t0, t1, c0, c1 = lo // block_n, -((-hi) // block_n), -((-lo) // block_n), hi // block_n
        c1[hi >= kv_len] = kt                                    # the last, short tile ends at kv_len
        if live.all():
            h0, h1 = np.minimum.reduceat(t0, starts), np.maximum.reduceat(t1, starts)
            f0, f1 = np.maximum.reduceat(c0, starts), np.minimum.reduceat(c1, starts)
            hole = ((t0[1:] > t1[:-1]) | (t0[:-1] > t1[1:])) & ~first_row_of_tile[1:]
            if hole.any():
                fallback[np.nonzero(hole)[0] // block_m] = True
        else:
            n_live = np.add.reduceat(live.astype(np.int32), starts)
            some, full = n_live > 0, n_live == rows_per_tile
            h0 = np.where(some, np.minimum.reduceat(np.where(live, t0, big), starts), 0)
            h1 = np.where(some, np.maximum.reduceat(np.where(live, t1, -1), starts), 0)
            f0 = np.where(full, np.maximum.reduceat(np.where(live, c0, big), starts), 0)
            f1 = np.where(full, np.minimum.reduceat(np.where(live, c1, -1), starts), 0)
            idx = np.nonzero(live)[0]
            if len(idx) > 1:
                a, b = idx[:-1], idx[1:]
                hole = (a // block_m == b // block_m) & ((t0[b] > t1[a]) | (t0[a] > t1[b]))
                fallback[a[hole] // block_m] = True
        hulls.append(np.stack([h0, h1, f0, f1]))
    for i in range(len(hulls)):                                  # (b) overlapping hulls
        for j in range(i + 1, len(hulls)):
            (a0, a1, _, _), (b0, b1, _, _) = hulls[i], hulls[j]
            fallback |= (a0 < a1) & (b0 < b1) & (a0 < b1) & (b0 < a1)
    return hulls, fallback


def _counted_runs(slots, tiles: np.ndarray, kv_len: int, block_m: int, block_n: int, rows_per_tile=None):
    """Exact runs of the given q_blocks of a chunk by difference arrays (row ids, begin, end, kind).
    With ``rows_per_tile`` the slots hold exactly those q_blocks' rows, one after the other."""
    if rows_per_tile is None:
        n_rows = len(slots[0][0])
        rows_per_tile = np.minimum(block_m, n_rows - tiles * block_m)
        rows = np.concatenate([np.arange(t * block_m, t * block_m + n) for t, n in zip(tiles, rows_per_tile)])
        sub = [(lo[rows], hi[rows]) for lo, hi in slots]
    else:
        sub = slots
    touch, cover = _tile_counts(sub, np.repeat(np.arange(len(tiles)), rows_per_tile), rows_per_tile,
                                kv_len, block_n)
    offsets, runs = runs_of(np.where(cover, FULL, np.where(touch, PARTIAL, EMPTY)).astype(np.int8))
    return np.repeat(tiles, np.diff(offsets)), runs[:, 0], runs[:, 1], runs[:, 2]


def _exact_runs(allow, deny, params, b: int, head: int, seq_len: int, kv_len: int,
                block_m: int, block_n: int):
    """CSR tile runs of a mask whose regions are all exact, chunk by chunk of rows."""
    qt = -(-seq_len // block_m)
    chunk = max(block_m, _CHUNK_ROWS // block_m * block_m)
    width = 0
    per_chunk, fallback = [], np.ones(qt, bool)      # q_blocks no chunk covered are EMPTY rows
    parts = tuple([np.zeros(0, np.int64)] for _ in range(4))
    for row0 in range(0, seq_len, chunk):
        rows = RowValues(params, seq_len, kv_len, head, b, np.arange(row0, min(row0 + chunk, seq_len),
                                                                      dtype=np.int64))
        slots = [s for s in visible_slots(allow, deny, rows, kv_len) if (s[0] < s[1]).any()]
        tiles = slice(row0 // block_m, -(-min(row0 + chunk, seq_len) // block_m))
        if not slots:
            fallback[tiles] = False
            continue
        hulls, bad = _chunk_hulls(slots, kv_len, block_m, block_n)
        per_chunk.append((tiles, hulls))
        width = max(width, len(hulls))
        fallback[tiles] = bad
        if bad.any():
            for part, values in zip(parts, _counted_runs(slots, np.nonzero(bad)[0], kv_len, block_m, block_n)):
                part.append(values + (tiles.start if part is parts[0] else 0))
    # Every chunk's hulls as one array [slot, (h0, h1, f0, f1), q_block]; missing slots are empty.
    hull = np.zeros((width, 4, qt), np.int64)
    for tiles, hulls in per_chunk:
        for j, h in enumerate(hulls):
            hull[j, :, tiles] = h
    return _runs_from_hulls(hull, fallback, parts, qt)


def _single_slot_runs(h0, h1, f0, f1):
    """CSR runs of one slot's hulls: each q_block's PARTIAL, FULL, PARTIAL in order (no sort needed:
    the three never overlap, and two PARTIALs are adjacent only when the FULL range is empty)."""
    f0c, f1c = np.maximum(f0, h0), np.minimum(f1, h1)
    has_full = f0c < f1c
    cut0, cut1 = np.where(has_full, f0c, h1), np.where(has_full, f1c, h1)
    begin = np.stack([h0, cut0, cut1], axis=1)
    end = np.stack([cut0, cut1, h1], axis=1)
    kind = np.broadcast_to(np.array([PARTIAL, FULL, PARTIAL]), begin.shape)
    keep = begin < end
    offsets = np.zeros(len(h0) + 1, np.int32)
    np.cumsum(keep.sum(axis=1), out=offsets[1:])
    runs = np.stack([begin[keep], end[keep], kind[keep]], axis=1).astype(np.int32)
    return offsets, np.ascontiguousarray(runs)


def _runs_from_hulls(hull: np.ndarray, fallback: np.ndarray, parts, qt: int):
    """CSR runs: per q_block and slot, PARTIAL from the hull's start to the FULL range, FULL, then
    PARTIAL to the hull's end; q_blocks marked ``fallback`` contribute only the runs already in ``parts``."""
    if len(hull) == 1 and not fallback.any() and not any(len(p) > 1 for p in parts):
        return _single_slot_runs(*hull[0])
    tile_ids = np.arange(qt)
    for h0, h1, f0, f1 in hull:
        f0c, f1c = np.maximum(f0, h0), np.minimum(f1, h1)
        has_full = f0c < f1c
        cut0, cut1 = np.where(has_full, f0c, h1), np.where(has_full, f1c, h1)
        for begin, end, kind in ((h0, cut0, PARTIAL), (cut0, cut1, FULL), (cut1, h1, PARTIAL)):
            keep = ~fallback & (begin < end)
            for part, values in zip(parts, (tile_ids[keep], begin[keep], end[keep],
                                            np.full(int(keep.sum()), kind))):
                part.append(values)
    rows, begins, ends, kinds = (np.concatenate(p) for p in parts)
    return merge_runs(rows, begins, ends, kinds, qt)


def _opaque_grids(regions, rows, tiles: TileIntervals, seq_len, kv_len, block_m, block_n):
    """Sound (touch, cover) grids for the union of regions that have opaque atoms."""
    touch = cover = None
    for region in regions:
        t, c = _grid_counts([region_rows(region, rows, kv_len)], seq_len, kv_len, block_m, block_n)
        states = np.broadcast_arrays(*[tiles.atom_state(a.lin) for a in region.opaque], t)[:-1]
        surely_false = np.logical_or.reduce([s == -1 for s in states])
        surely_true = np.logical_and.reduce([s == 1 for s in states])
        t, c = t & ~surely_false, c & surely_true
        touch = t if touch is None else touch | t
        cover = c if cover is None else cover | c
    return touch, cover


# Key intervals one enumeration may produce for chunked regions before the batch element's classes fall
# back to sound bounds (the enumeration's arrays then peak near 200 MB).
_BUDGET = 1 << 20


def classify_batch_element(mask: ir.RangeMask, bound: BoundParams, b: int, block_m: int, block_n: int,
                           head: int = 0, heads: tuple[int, int] = (0, 0)):
    """CSR runs (offsets int32[QT+1], runs int32[n, 3]) of one batch element and head, and whether they
    are exact (chunked regions past the budget are classified soundly instead)."""
    S, K = bound.seq_len, bound.kv_len
    params = bound.batch[b]
    if mask.linear:
        plan = _piece_plan(mask)
        if plan is not None:
            return (*runs_from_pieces(plan, params, b, head, S, K, block_m, block_n), True)
        return (*_exact_runs(mask.allow, mask.deny, params, b, head, S, K, block_m, block_n), True)
    if mask.exact:
        try:
            return (*_chunked_runs(mask, params, b, head, S, K, block_m, block_n), True)
        except TooMany:
            pass
    return (*runs_of(_sound_classes(mask, params, b, head, heads, S, K, block_m, block_n)), False)


def _piece_plan(mask: ir.RangeMask):
    """The mask's :class:`~maskc.pieces.PiecePlan` (None where its forms are not affine on pieces), worked
    out on its first classification and kept on it (a RangeMask is immutable)."""
    if "_piece_plan" not in mask.__dict__:
        object.__setattr__(mask, "_piece_plan", plan_of(mask.allow, mask.deny))
    return mask.__dict__["_piece_plan"]


def _rows_of_blocks(blocks: np.ndarray, block_m: int, seq_len: int):
    """The rows of the given q_blocks, one after the other, and each q_block's row count."""
    counts = np.minimum(block_m, seq_len - blocks * block_m)
    rows = np.concatenate([np.arange(t * block_m, t * block_m + c) for t, c in zip(blocks, counts)])
    return rows.astype(np.int64), counts


def _keyed_classes(allow, deny, make, blocks: np.ndarray, S: int, K: int, block_m: int, block_n: int):
    """Exact classes int8[len(blocks), KT] of the given q_blocks, from their rows' key intervals."""
    rows, counts = _rows_of_blocks(blocks, block_m, S)
    row, lo, hi = row_keys(allow, deny, make, rows, K, _BUDGET)
    tile = np.repeat(np.arange(len(blocks)), counts)
    touched, covered = _flat_tile_counts(tile[row], lo, hi, counts, K, block_n)
    return np.where(covered, FULL, np.where(touched, PARTIAL, EMPTY)).astype(np.int8)


def _chunked_runs(mask: ir.RangeMask, params, b, head, S, K, block_m, block_n):
    """Exact CSR runs of a mask whose regions are all exact, some chunked: from q-pieces where the mask
    allows it (maskc.piece_tiles), row by row for the q_blocks the pieces cannot settle."""
    make = values_at(params, S, K, head, b)
    qt = -(-S // block_m)
    breaks = Breaks()
    parts = tuple([np.zeros(0, np.int64)] for _ in range(4))
    if not mask.deny and slopes_ok(mask.allow, breaks):
        found, bad = piece_runs(mask.allow, breaks, make, params, b, head, S, K, block_m, block_n, _BUDGET)
        for part, values in zip(parts, found):
            part.append(values)
    else:
        bad = np.ones(qt, bool)
    blocks = np.flatnonzero(bad)
    # A group of q_blocks at a time: bounded rows (intervals) and difference arrays over every key block.
    step = max(1, min(_CHUNK_ROWS // block_m, _GRID_CELLS // (-(-K // block_n) + 1)))
    for i in range(0, len(blocks), step):
        part_blocks = blocks[i:i + step]
        offsets, runs = runs_of(_keyed_classes(mask.allow, mask.deny, make, part_blocks, S, K, block_m, block_n))
        for part, values in zip(parts, (np.repeat(part_blocks, np.diff(offsets)), runs[:, 0], runs[:, 1],
                                        runs[:, 2])):
            part.append(values)
    rows, begins, ends, kinds = (np.concatenate(p) for p in parts)
    return merge_runs(rows, begins, ends, kinds, qt)


def _sound_classes(mask: ir.RangeMask, params, b, head, heads, S, K, block_m, block_n) -> np.ndarray:
    """Sound classes of a mask with inexact regions (or chunked ones past the budget), chunk by chunk of
    rows: linear regions exactly, the others bounded per tile by interval arithmetic."""
    exact_allow = [r for r in mask.allow if r.linear]
    exact_deny = [r for r in mask.deny if r.linear]
    opaque_allow = [r for r in mask.allow if not r.linear]
    opaque_deny = [r for r in mask.deny if not r.linear]
    qt, kt = -(-S // block_m), -(-K // block_n)
    classes = np.zeros((qt, kt), np.int8)
    chunk = max(block_m, _CHUNK_ROWS // block_m * block_m)
    for row0 in range(0, S, chunk):
        row1 = min(row0 + chunk, S)
        rows = RowValues(params, S, K, head, b, np.arange(row0, row1, dtype=np.int64))
        tiles = TileIntervals(params, S, K, heads, b, block_m, block_n, q_rows=(row0, row1))
        classes[row0 // block_m: -(-row1 // block_m)] = _opaque_chunk(
            exact_allow, exact_deny, opaque_allow, opaque_deny, rows, tiles, row1 - row0, K, block_m, block_n)
    return classes


def _piecewise_runs(regions, params, b, head, S, K, block_m, block_n):
    """Runs from the pieces' hulls, region by region; q_blocks they cannot settle (a piece unsure of
    its rows, a hole, or two regions' hulls overlapping) are counted row by row."""
    qt = -(-S // block_m)
    if not regions:                                              # nothing is ever visible
        return np.zeros(qt + 1, np.int32), np.zeros((0, 3), np.int32)
    hulls, bad = [], np.zeros(qt, bool)
    for region in regions:
        hull, region_bad = piece_hulls(region, params, b, head, S, K, block_m, block_n)
        hulls.append(hull)
        bad |= region_bad
    for i in range(len(hulls)):                                  # a key block touched by two regions
        for j in range(i + 1, len(hulls)):
            (a0, a1, _, _), (b0, b1, _, _) = hulls[i], hulls[j]
            bad |= (a0 < a1) & (b0 < b1) & (a0 < b1) & (b0 < a1)
    parts = tuple([np.zeros(0, np.int64)] for _ in range(4))
    # Counted a group of q_blocks at a time: each group's difference arrays span every key block.
    per_group = max(1, _GRID_CELLS // (-(-K // block_n) + 1))
    bad_blocks = np.nonzero(bad)[0]
    for g in range(0, len(bad_blocks), per_group):
        blocks = bad_blocks[g:g + per_group]
        counts = np.minimum(block_m, S - blocks * block_m)
        positions = np.concatenate([np.arange(t * block_m, t * block_m + c) for t, c in zip(blocks, counts)])
        rows = RowValues(params, S, K, head, b, positions)
        slots = visible_slots(regions, (), rows, K)
        if slots:
            for part, values in zip(parts, _counted_runs(slots, np.arange(len(blocks)), K, block_m, block_n,
                                                         rows_per_tile=counts)):
                part.append(blocks[values] if part is parts[0] else values)
    return _runs_from_hulls(np.stack(hulls), bad, parts, qt)


def _opaque_chunk(exact_allow, exact_deny, opaque_allow, opaque_deny, rows, tiles, n_rows, K, block_m, block_n):
    """Sound classes of one chunk of q_blocks for a mask with opaque regions."""
    slots = visible_slots(exact_allow, exact_deny, rows, K)
    touch, cover = _grid_counts(slots, n_rows, K, block_m, block_n)
    none = np.zeros_like(touch)
    d_touch_e, d_cover_e = (_grid_counts(compact(union([region_rows(r, rows, K) for r in exact_deny])),
                                         n_rows, K, block_m, block_n) if exact_deny else (none, none))
    a_touch_o, a_cover_o = (_opaque_grids(opaque_allow, rows, tiles, n_rows, K, block_m, block_n)
                            if opaque_allow else (none, none))
    d_touch_o, d_cover_o = (_opaque_grids(opaque_deny, rows, tiles, n_rows, K, block_m, block_n)
                            if opaque_deny else (none, none))
    # visible = (A_exact - D_exact) | (A_opaque - D_exact), minus D_opaque; all sound.
    full = ~d_touch_o & (cover | (a_cover_o & ~d_touch_e))
    empty = d_cover_o | (~touch & (~a_touch_o | d_cover_e))
    classes = np.full(touch.shape, PARTIAL, np.int8)
    classes[full] = FULL
    classes[empty] = EMPTY
    return classes


MAX_TILES = 1 << 28
"""The most tiles one classification covers (batch elements x heads the mask reads x q_blocks x kv_blocks):
2,097,152 tokens a side at 128 x 128 tiles. Time and the worst case's runs grow with it; past it, a
BindError before any work."""


def _check_grid(bound: BoundParams, block_m: int, block_n: int, heads: int) -> None:
    qt, kt = -(-bound.seq_len // block_m), -(-bound.kv_len // block_n)
    tiles = len(bound.batch) * heads * qt * kt
    if tiles > MAX_TILES:
        per = f" x {len(bound.batch)} batch elements" if len(bound.batch) > 1 else ""
        per += f" x {heads} heads" if heads > 1 else ""
        raise BindError(f"seq_len = {bound.seq_len} and kv_len = {bound.kv_len} at {block_m} x {block_n} tiles make "
                        f"{qt} x {kt}{per} = {tiles} tiles; maskc classifies at most {MAX_TILES} (2**28) at once",
                        hint="use larger tiles, or split the sequence with restrict() (context parallelism)")


def classify(mask, bound: BoundParams, block_m: int, block_n: int) -> TileMap:
    """Tile runs of every batch element (for masks that use h: sound for every head at once).

    ``mask`` is a RangeMask, or one per batch element (each specialized to that element's values).
    """
    masks = [mask] * len(bound.batch) if isinstance(mask, ir.RangeMask) else list(mask)
    kt = -(-bound.kv_len // block_n)
    heads = (0, (bound.num_heads or 1) - 1)
    _check_grid(bound, block_m, block_n, (bound.num_heads or 1) if any(m.uses_head for m in masks) else 1)
    offsets, runs = [np.zeros(1, np.int32)], []
    exact = True
    for b, mask in enumerate(masks):
        uses_head = mask.uses_head
        per_head = [classify_batch_element(mask, bound, b, block_m, block_n, h, heads)
                    for h in range((bound.num_heads or 1) if uses_head else 1)]
        o, r, element_exact = per_head[0]
        exact &= element_exact and not uses_head
        if len(per_head) > 1:   # a tile keeps a class only if every head agrees on it
            classes = dense_of(o, r, kt)
            for other in per_head[1:]:
                classes = np.where(classes == dense_of(other[0], other[1], kt), classes, PARTIAL).astype(np.int8)
            o, r = runs_of(classes)
        offsets.append(o[1:] + offsets[-1][-1])
        runs.append(r)
    all_runs = np.concatenate(runs) if runs else np.zeros((0, 3), np.int32)
    return TileMap(block_m, block_n, bound.seq_len, bound.kv_len, len(bound.batch),
                   np.concatenate(offsets).astype(np.int32), np.ascontiguousarray(all_runs, np.int32),
                   exact=exact)


def visible_pairs(mask: ir.RangeMask, bound: BoundParams) -> int:
    """How many (q, k) pairs are visible, summed over the batch; never builds the dense mask.

    Exact masks sum their rows' interval lengths (chunked regions enumerated; :class:`~maskc.keys.TooMany`
    past the budget); the pairs of other masks are counted by :mod:`maskc.audit`.
    """
    return sum(int(visible_keys_per_row(mask, bound, b).sum()) for b in range(len(bound.batch)))


def visible_keys_per_row(mask: ir.RangeMask, bound: BoundParams, b: int, rows: tuple[int, int] | None = None):
    """int64[rows]: how many keys each query row of batch element ``b`` sees (all rows, or [row0, row1)),
    from the rows' visible intervals (:func:`visible_intervals`): exact masks that do not read h only."""
    row0, row1 = rows or (0, bound.seq_len)
    counts = np.zeros(row1 - row0, np.int64)
    for start in range(row0, row1, _CHUNK_ROWS):
        q = np.arange(start, min(start + _CHUNK_ROWS, row1), dtype=np.int64)
        row, lo, hi = visible_intervals(mask, bound.batch[b], bound.seq_len, bound.kv_len, b, q)
        counts[start - row0: start - row0 + len(q)] = np.bincount(row, hi - lo, minlength=len(q)).astype(np.int64)
    return counts


def visible_intervals(mask: ir.RangeMask, params, seq_len: int, kv_len: int, b: int, q: np.ndarray):
    """Flat ``(row, lo, hi)``: the visible keys ``[lo, hi)`` of the rows ``q[row]`` of batch element ``b``,
    disjoint within a row, for an exact mask that does not read h (chunked regions enumerated,
    :class:`~maskc.keys.TooMany` past the budget); never the dense mask."""
    if not mask.exact or mask.uses_head:
        raise NotImplementedError("visible intervals of a non-exact mask: count pairs with maskc.audit")
    if mask.linear:
        slots = visible_slots(mask.allow, mask.deny, RowValues(params, seq_len, kv_len, 0, b, q), kv_len)
        row = np.tile(np.arange(len(q)), len(slots))
        lo = np.concatenate([lo for lo, _ in slots]) if slots else np.zeros(0, np.int64)
        hi = np.concatenate([hi for _, hi in slots]) if slots else np.zeros(0, np.int64)
        live = lo < hi
        return row[live], lo[live], hi[live]
    return row_keys(mask.allow, mask.deny, values_at(params, seq_len, kv_len, 0, b), q, kv_len, _BUDGET)
