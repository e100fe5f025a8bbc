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
from .kernel_ir import EMPTY, FULL, PARTIAL, BoundParams, TileMap
from .rows import RowValues, TileIntervals, k_bound_rows

_NONE = np.iinfo(np.int64).max // 4      # the endpoints of an empty interval, sorted last


def _region_rows(region: ir.RegionBounds, rows: RowValues, kv_len: int):
    """The row-wise interval [lo, hi) of a region's linear part (lo = hi = _NONE where empty)."""
    n = rows.q.shape[0]
    lo = np.zeros(n, np.int64)
    hi = np.full(n, kv_len, np.int64)
    for b in region.lower:
        lo = np.maximum(lo, k_bound_rows(b, rows, lower=True))
    for b in region.upper:
        hi = np.minimum(hi, k_bound_rows(b, rows, lower=False) + 1)
    ok = lo < hi
    for g in region.guards:
        ok = ok & (rows.lin(g.lin) <= 0)
    return np.where(ok, lo, _NONE), np.where(ok, hi, _NONE)


def _union(intervals: list[tuple[np.ndarray, np.ndarray]]):
    """Per row, the union of intervals as sorted, disjoint, non-adjacent slots (empty slots last)."""
    if len(intervals) <= 1:
        return intervals
    lo = np.stack([i[0] for i in intervals])
    hi = np.stack([i[1] for i in intervals])
    order = np.argsort(lo, axis=0, kind="stable")
    lo, hi = np.take_along_axis(lo, order, 0), np.take_along_axis(hi, order, 0)
    out = []
    cur_lo, cur_hi = lo[0], hi[0]
    for j in range(1, len(intervals)):
        new = lo[j] > cur_hi                       # touching intervals merge: [a, b) + [b, c)
        out.append((np.where(new, cur_lo, _NONE), np.where(new, cur_hi, _NONE)))
        cur_lo = np.where(new, lo[j], cur_lo)
        cur_hi = np.where(new, hi[j], np.maximum(cur_hi, hi[j]))
    out.append((cur_lo, cur_hi))
    return out


def _compact(slots):
    """Per row, non-empty slots first in order of lo; columns empty in every row dropped."""
    if len(slots) <= 1:
        return slots
    lo = np.stack([s[0] for s in slots])
    hi = np.stack([s[1] for s in slots])
    order = np.argsort(lo, axis=0, kind="stable")
    lo, hi = np.take_along_axis(lo, order, 0), np.take_along_axis(hi, order, 0)
    live = (lo < hi).any(axis=1)
    return [(lo[j], hi[j]) for j in range(len(slots)) if live[j]] or [(lo[0], hi[0])]


def _subtract(slots, deny):
    """Per row, slots minus one interval: each slot leaves a left and a right piece."""
    dlo, dhi = deny
    out = []
    for lo, hi in slots:
        left_hi = np.minimum(hi, dlo)
        right_lo = np.maximum(lo, dhi)
        out.append((np.where(lo < left_hi, lo, _NONE), np.where(lo < left_hi, left_hi, _NONE)))
        out.append((np.where(right_lo < hi, right_lo, _NONE), np.where(right_lo < hi, hi, _NONE)))
    return out


def _visible_slots(allow, deny, rows: RowValues, kv_len: int):
    """Per row, the keys of exact allow regions minus exact deny regions, as disjoint slots.
    At most len(allow) + len(deny) slots: subtracting m disjoint intervals splits n into n + m."""
    slots = _compact(_union([_region_rows(r, rows, kv_len) for r in allow]))
    if deny:
        for interval in _compact(_union([_region_rows(r, rows, kv_len) for r in deny])):
            slots = _compact(_subtract(slots, interval))
    return slots


def _tile_counts(slots, seq_len: int, kv_len: int, block_m: int, block_n: int):
    """For each tile: does any row touch it, and does every row cover it (slots disjoint per row)."""
    qt_count, kt_count = -(-seq_len // block_m), -(-kv_len // block_n)
    width = kt_count + 1
    size = qt_count * width
    row_base = (np.arange(seq_len, dtype=np.int64) // block_m) * width
    touch = np.zeros(size, np.int64)
    cover = np.zeros(size, np.int64)
    for lo, hi in slots:
        live = lo < hi
        if not live.all():
            base, lo, hi = row_base[live], lo[live], hi[live]
        else:
            base = row_base
        if not len(lo):
            continue
        # Difference arrays along each row block: +1 where a range of key blocks starts, -1 past it.
        touch += np.bincount(base + lo // block_n, minlength=size)
        touch -= np.bincount(base + -((-hi) // block_n), minlength=size)
        c0 = -((-lo) // block_n)
        c1 = np.where(hi >= kv_len, kt_count, hi // block_n)      # the last, short tile ends at kv_len
        good = c0 < c1
        cover += np.bincount((base + c0)[good], minlength=size)
        cover -= np.bincount((base + c1)[good], minlength=size)
    touch = np.cumsum(touch.reshape(qt_count, width), axis=1)[:, :kt_count] > 0
    rows_per_tile = np.minimum(block_m, seq_len - np.arange(qt_count) * block_m)[:, None]
    cover = np.cumsum(cover.reshape(qt_count, width), axis=1)[:, :kt_count] == rows_per_tile
    return touch, cover


def _opaque_grids(regions, rows, tiles: TileIntervals, seq_len, kv_len, block_m, block_n):
    """Sound (touch, cover) grids for the union of regions that have opaque atoms."""
    touch = cover = None
    for region in regions:
        t, c = _tile_counts([_region_rows(region, rows, kv_len)], seq_len, kv_len, block_m, block_n)
        states = np.broadcast_arrays(*[tiles.atom_state(a.lin) for a in region.opaque], t)[:-1]
        surely_false = np.logical_or.reduce([s == -1 for s in states])
        surely_true = np.logical_and.reduce([s == 1 for s in states])
        t, c = t & ~surely_false, c & surely_true
        touch = t if touch is None else touch | t
        cover = c if cover is None else cover | c
    return touch, cover


def classify_batch_element(mask: ir.RangeMask, bound: BoundParams, b: int, block_m: int, block_n: int,
                           head: int = 0, heads: tuple[int, int] = (0, 0)) -> np.ndarray:
    """int8[QT, KT] classes for one batch element and one head (see the module docstring)."""
    S, K = bound.seq_len, bound.kv_len
    params = bound.batch[b]
    rows = RowValues(params, S, K, head, b, np.arange(S, dtype=np.int64))
    exact_allow = [r for r in mask.allow if r.exact]
    exact_deny = [r for r in mask.deny if r.exact]
    slots = _visible_slots(exact_allow, exact_deny, rows, K)
    touch, cover = _tile_counts(slots, S, K, block_m, block_n)
    opaque_allow = [r for r in mask.allow if not r.exact]
    opaque_deny = [r for r in mask.deny if not r.exact]
    if opaque_allow or opaque_deny:
        tiles = TileIntervals(params, S, K, heads, b, block_m, block_n)
        none = np.zeros_like(touch)
        d_touch_e, d_cover_e = (_tile_counts(_compact(_union([_region_rows(r, rows, K) for r in exact_deny])),
                                             S, K, block_m, block_n) if exact_deny else (none, none))
        a_touch_o, a_cover_o = (_opaque_grids(opaque_allow, rows, tiles, S, K, block_m, block_n)
                                if opaque_allow else (none, none))
        d_touch_o, d_cover_o = (_opaque_grids(opaque_deny, rows, tiles, S, K, block_m, block_n)
                                if opaque_deny else (none, none))
        # visible = (A_exact - D_exact) | (A_opaque - D_exact), minus D_opaque; all sound.
        full = ~d_touch_o & (cover | (a_cover_o & ~d_touch_e))
        empty = d_cover_o | (~touch & (~a_touch_o | d_cover_e))
    else:
        full, empty = cover, ~touch
    classes = np.full(touch.shape, PARTIAL, np.int8)
    classes[full] = FULL
    classes[empty] = EMPTY
    return classes


def classify(mask: ir.RangeMask, bound: BoundParams, block_m: int, block_n: int) -> TileMap:
    """Tile classes of every batch element (for masks that use h: sound for every head at once)."""
    heads = (0, (bound.num_heads or 1) - 1)
    per_batch = []
    for b in range(len(bound.batch)):
        per_head = [classify_batch_element(mask, bound, b, block_m, block_n, h, heads)
                    for h in range(bound.num_heads if _uses_head(mask) else 1)]
        classes = per_head[0]
        for other in per_head[1:]:   # a tile keeps a class only if every head agrees on it
            classes = np.where(classes == other, classes, PARTIAL).astype(np.int8)
        per_batch.append(classes)
    return TileMap(block_m, block_n, bound.seq_len, bound.kv_len, np.stack(per_batch),
                   exact=mask.exact and not _uses_head(mask))


def _uses_head(mask: ir.RangeMask) -> bool:
    from .linear import depends_on_head
    lins = [a.lin for r in mask.allow + mask.deny for a in r.guards + r.opaque]
    lins += [kb.lin for r in mask.allow + mask.deny for kb in r.lower + r.upper]
    return any(depends_on_head(lin) for lin in lins)


def visible_pairs(mask: ir.RangeMask, bound: BoundParams, block: int = 128) -> int:
    """How many (q, k) pairs are visible, summed over the batch; never builds the dense mask.

    Exact masks sum their rows' interval lengths; others count FULL tiles whole and evaluate the
    mask pair by pair inside PARTIAL tiles only, one query block at a time.
    """
    total = 0
    S, K = bound.seq_len, bound.kv_len
    for b, params in enumerate(bound.batch):
        if mask.exact and not _uses_head(mask):
            rows = RowValues(params, S, K, 0, b, np.arange(S, dtype=np.int64))
            slots = _visible_slots(mask.allow, mask.deny, rows, K)
            total += int(sum(np.where(lo < hi, hi - lo, 0).sum() for lo, hi in slots))
            continue
        raise NotImplementedError("visible_pairs of a non-exact mask needs its resolved form")
    return total
