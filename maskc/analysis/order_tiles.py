"""Tile classes of a mask run in a token order, from the raster mask's exact key intervals.

Invariant: :func:`classify_ordered` gives the tile classes of the mask rewritten in ``order``
(:func:`maskc.analysis.reorder.reorder`): tile (i, j) in the order's coordinates is FULL when every query of
q_block i sees every key of kv_block j, EMPTY when none sees any, else PARTIAL, exactly, for a mask whose raster
classification is exact (its rows' visible keys are exact intervals). :func:`block_costs` counts the classes of
some q_blocks only (maskc.ordered chooses an order from them). Memory grows with the intervals of a chunk of
q_blocks, never with the tile grid.

Why not the rewritten mask's own chunk analysis, which is exact too (and is what its kernels evaluate, restricted
to one tile's keys): classifying from it enumerates, for every row, every band of the image before the key
bounds of the band's columns rule them out (the nest's top level, the band, is bounded only by the image);
the raster mask's rows are one interval per image row.

How: the q_blocks' rows are taken to raster positions (``order.raster``) and the raster mask's visible intervals
computed there. Each interval is cut into what the order keeps in place (before the image, after the last whole
band), the whole bands it covers (a whole band is a whole band in the order too: one range of positions) and
the rest, one image row at a time. Along an image row the order's index ``C(y) + rows * cols * (x // cols) + x %
cols`` grows with x, so a row's keys ``[x0, x1]`` touch a range of kv_blocks and their count in each is the
difference of the first x reaching each block. Counts summed per (q_block, kv_block) by a sweep over blocks give
the classes: FULL where the count is every pair of the tile.
"""
from __future__ import annotations

import functools

import numpy as np

from maskc import ir
from maskc.analysis.classify import visible_intervals
from maskc.analysis.order import TokenOrder
from maskc.analysis.tiles import agree, concat_csr, merge_runs
from maskc.bound_params import BoundParams
from maskc.kernel_ir import MAX_DESCRIPTOR_BYTES, TileMap
from maskc.runs import FULL, PARTIAL, RunBudget, sizes_text

_CHUNK_ROWS = 8192          # query rows per pass (whole q_blocks)


def classify_ordered(masks, bound: BoundParams, order: TokenOrder, block_m: int, block_n: int,
                     max_bytes: int = MAX_DESCRIPTOR_BYTES) -> TileMap:
    """The rewritten mask's tile runs (module docstring) from ``masks``, the raster mask's range analysis per
    batch element (exact); masks that read h: a tile keeps a class only where every head agrees."""
    S = bound.seq_len
    qt, kt = -(-S // block_m), -(-S // block_n)
    budget = RunBudget(max_bytes, functools.partial(sizes_text, S, S, block_m, block_n, len(bound.batch)), 8 * len(bound.batch) * qt + 4)
    parts = []
    for b, mask in enumerate(masks):
        heads = range(bound.num_heads or 1) if mask.uses_head else (0,)
        per_head = []
        for h in heads:
            chunks = []
            step = max(1, _CHUNK_ROWS // block_m)
            for q0 in range(0, qt, step):
                blocks = np.arange(q0, min(qt, q0 + step))
                q, begin, end, kind = _classes(mask, bound.batch[b], b, h, order, S, block_m, block_n, blocks)
                chunks.append(merge_runs(q, begin, end, kind, len(blocks)))
                budget.add(chunks[-1][1])
            per_head.append(concat_csr(chunks, qt))
        parts.append(agree(per_head, kt) if len(per_head) > 1 else per_head[0])
    offsets, runs = concat_csr(parts, len(bound.batch) * qt)
    return TileMap(block_m, block_n, S, S, len(bound.batch), offsets, runs, exact=not any(m.uses_head for m in masks))


def block_costs(mask: ir.RangeMask, params, order: TokenOrder | None, seq_len: int, block_m: int, block_n: int,
                blocks: np.ndarray) -> tuple[int, int]:
    """(FULL, PARTIAL) tiles of the q_blocks ``blocks`` (in the order's coordinates; ``order`` None: raster) of
    batch element 0 and head 0."""
    _, begin, end, kind = _classes(mask, params, 0, 0, order, seq_len, block_m, block_n, np.asarray(blocks))
    widths = end - begin
    return int(widths[kind == FULL].sum()), int(widths[kind == PARTIAL].sum())


def _classes(mask, params, b: int, head: int, order: TokenOrder | None, S: int, block_m: int, block_n: int,
             blocks: np.ndarray):
    """Runs ``(q_block index into blocks, kv_begin, kv_end, kind)`` of the q_blocks ``blocks``, unmerged."""
    counts = np.minimum(block_m, S - blocks * block_m)
    rows = np.concatenate([np.arange(t * block_m, t * block_m + c) for t, c in zip(blocks, counts)])
    row_block = np.repeat(np.arange(len(blocks)), counts)
    at = rows if order is None else order.raster(rows, S)
    row, lo, hi = visible_intervals(mask, params, S, S, b, at, head)
    owner = row_block[row]
    if order is None:
        entries = [_range_entries(owner, lo, hi, block_n)]
    else:
        kept, whole, rest = _split(owner, lo, hi, order, S)
        row_owner, y, x0, x1 = _rows_of(rest[0], rest[1], rest[2], order)
        entries = [_range_entries(kept[0], kept[1], kept[2], block_n),
                   _range_entries(whole[0], whole[1], whole[2], block_n),
                   _row_entries(row_owner, y, x0, x1, order, block_n)]
    q, k0, k1, v = (np.concatenate(x) for x in zip(*entries))
    return _sweep(q, k0, k1, v, counts, S, block_n)


def _split(owner, lo, hi, order: TokenOrder, S: int):
    """Raster intervals ``[lo, hi)`` in three parts, each ``(owner, lo, hi)``: what the order keeps in place
    (before the image, from the end of its last whole band on: the same positions in the order), the whole bands
    an interval covers (a whole band of the order is the same positions too), and the rest of the bands (at most
    one partial band at each end of an interval)."""
    T, band, E = order.origin, order.band, order.end(S)
    kept = tuple(np.concatenate(x) for x in zip((owner, lo, np.minimum(hi, T)), (owner, np.maximum(lo, E), hi)))
    a, c = np.maximum(lo, T), np.minimum(hi, E)
    live = a < c
    owner, a, c = owner[live], a[live], c[live]
    first, last = -((-(a - T)) // band), (c - T) // band          # the whole bands: [first, last)
    whole = first < last
    head_end = np.where(whole, T + first * band, c)
    tail_start = np.where(whole, T + last * band, c)
    rest = (np.concatenate([owner, owner]), np.concatenate([a, tail_start]), np.concatenate([head_end, c]))
    return kept, (owner[whole], T + first[whole] * band, T + last[whole] * band), rest


def _rows_of(owner, p0, p1, order: TokenOrder):
    """Raster ranges ``[p0, p1)`` inside the bands cut into image rows: (owner, y, x0, x1), x1 inclusive."""
    live = p0 < p1
    owner, p0, p1 = owner[live], p0[live], p1[live]
    T, W = order.origin, order.width
    y0, y1 = (p0 - T) // W, (p1 - 1 - T) // W
    n = y1 - y0 + 1
    at = np.repeat(np.arange(len(n)), n)
    y = y0[at] + _within(n)
    x0 = np.where(y == y0[at], (p0[at] - T) % W, 0)
    x1 = np.where(y == y1[at], (p1[at] - 1 - T) % W, W - 1)
    return owner[at], y, x0, x1


def _within(n: np.ndarray) -> np.ndarray:
    """0 .. n[i] - 1 for every i, concatenated."""
    return np.arange(int(n.sum())) - np.repeat(np.cumsum(n) - n, n)


def _range_entries(owner, lo, hi, block_n: int):
    """Add-ranges ``(q, k0, k1, v)`` (v keys added to each kv_block of [k0, k1) for q_block q) of ranges of
    order positions ``[lo, hi)``: the first and last blocks with their own counts, whole blocks between."""
    live = lo < hi
    owner, lo, hi = owner[live], lo[live], hi[live]
    f, l = lo // block_n, (hi - 1) // block_n
    one = f == l
    m = ~one
    inner = m & (f + 1 < l)
    return (np.concatenate([owner[one], owner[m], owner[m], owner[inner]]),
            np.concatenate([f[one], f[m], l[m], f[inner] + 1]),
            np.concatenate([f[one] + 1, f[m] + 1, l[m] + 1, l[inner]]),
            np.concatenate([(hi - lo)[one], ((f + 1) * block_n - lo)[m], (hi - l * block_n)[m],
                            np.full(int(inner.sum()), block_n, np.int64)]))


def _row_entries(owner, y, x0, x1, order: TokenOrder, block_n: int):
    """Add-ranges of the keys ``[x0, x1]`` of image rows ``y`` (in the bands): their order indices
    ``C(y) + rows * cols * (x // cols) + x % cols`` grow with x, so they touch the kv_blocks from that of x0 to
    that of x1, each holding the columns from the first x that reaches it to the first that reaches the next."""
    T, pr = order.origin, order.rows * order.cols
    c = T + order.band * (y // order.rows) + order.cols * (y % order.rows)
    index = lambda x: c + pr * (x // order.cols) + x % order.cols      # noqa: E731
    b0, b1 = index(x0) // block_n, index(x1) // block_n
    n = b1 - b0 + 1
    at = np.repeat(np.arange(len(n)), n)
    block = b0[at] + _within(n)
    start = np.maximum(_first_x(block * block_n - c[at], order), x0[at])
    stop = np.minimum(_first_x((block + 1) * block_n - c[at], order), x1[at] + 1)
    keep = stop > start
    return owner[at][keep], block[keep], block[keep] + 1, (stop - start)[keep]


def _first_x(t, order: TokenOrder):
    """The first column of an image row whose order index is at least ``t`` past the row's column 0."""
    pr = order.rows * order.cols
    t = np.maximum(t, 0)
    return np.minimum(order.cols * (t // pr) + np.minimum(t % pr, order.cols), order.width)


def _sweep(q, k0, k1, v, counts, S: int, block_n: int):
    """Runs ``(q, begin, end, kind)`` from add-ranges: the keys each (q_block, kv_block) sees, summed over its
    queries, against all of them (FULL), some (PARTIAL) or none (no run)."""
    kt = -(-S // block_n)
    nq = len(counts)
    # events: +v at k0, -v at k1, and a zero at the last (maybe short) kv_block of every q_block
    eq = np.concatenate([q, q, np.arange(nq)])
    ek = np.concatenate([k0, k1, np.full(nq, kt - 1)])
    ev = np.concatenate([v, -v, np.zeros(nq, np.int64)])
    key = eq * (kt + 1) + ek
    if nq * (kt + 1) <= 4 * len(key):            # events summed on the chunk's grid: cheaper than sorting them
        total = np.bincount(key, weights=ev, minlength=nq * (kt + 1))
        touched = np.bincount(key, minlength=nq * (kt + 1)) > 0
        key = np.flatnonzero(touched)
        eq, ek, ev = key // (kt + 1), key % (kt + 1), total[touched].astype(np.int64)
    else:
        order = np.argsort(key, kind="stable")
        eq, ek, ev = eq[order], ek[order], ev[order]
    level = np.cumsum(ev)                       # each q_block's events sum to 0: the sum restarts at each
    nxt = np.append(ek[1:], kt)
    same = np.append(eq[1:] == eq[:-1], False)
    seg = same & (nxt > ek) & (level > 0)
    q, begin, end, level = eq[seg], ek[seg], nxt[seg], level[seg]
    keys = np.where(begin == kt - 1, S - (kt - 1) * block_n, block_n)
    full = level == counts[q] * keys
    return q, begin, end, np.where(full, FULL, PARTIAL)
