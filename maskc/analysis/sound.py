"""Sound tile classes of masks with inexact regions: their opaque atoms bounded over each tile box.

Classification's instrument where a region reads k in a way the range analysis cannot solve (a product of
q and k, a floor of k by a run-time divisor past the chunk budget): the regions' linear parts are counted
row by row (exactly), the opaque atoms are bounded per (q_block, kv_block) box by interval arithmetic
(:class:`~maskc.analysis.rows.TileIntervals`), and the two are combined so that FULL and EMPTY are never wrong.
The work is per tile, so time grows with the tile grid (classify caps it at MAX_TILES); memory grows with
one chunk of q_blocks at a time, and the result is kept as runs, never as the grid.
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.intervals import compact, region_rows, union, visible_slots
from maskc.analysis.rows import RowValues, TileIntervals
from maskc.analysis.tiles import concat_csr, runs_of
from maskc.kernel_ir import EMPTY, FULL, PARTIAL


def sound_runs(mask: ir.RangeMask, params, b: int, head: int, seq_len: int, kv_len: int,
               block_m: int, block_n: int, chunk_rows: int, counted) -> tuple[np.ndarray, np.ndarray]:
    """CSR runs of a mask with inexact regions (or chunked ones past the budget) for one head, a chunk of
    ``chunk_rows`` rows (whole q_blocks) at a time; ``counted(runs)`` sees each chunk's runs as they are made."""
    exact_allow = [r for r in mask.allow if r.linear]
    exact_deny = [r for r in mask.deny if r.linear]
    opaque_allow = [r for r in mask.allow if not r.linear]
    opaque_deny = [r for r in mask.deny if not r.linear]
    chunk = max(block_m, chunk_rows // block_m * block_m)
    parts = []
    for row0 in range(0, seq_len, chunk):
        row1 = min(row0 + chunk, seq_len)
        rows = RowValues(params, seq_len, kv_len, head, b, np.arange(row0, row1, dtype=np.int64))
        boxes = [TileIntervals(params, seq_len, kv_len, (head, head), b, block_m, block_n, q_rows=(row0, row1))]
        sub = (block_m & -block_m, block_n & -block_n)          # the largest powers of two dividing the blocks
        if sub != (block_m, block_n) and any(_reads_bits(r) for r in opaque_allow + opaque_deny):
            boxes.append(TileIntervals(params, seq_len, kv_len, (head, head), b, *sub, q_rows=(row0, row1)))
        parts.append(runs_of(_classes(exact_allow, exact_deny, opaque_allow, opaque_deny, rows, boxes, row1 - row0,
                                      kv_len, block_m, block_n)))
        counted(parts[-1][1])
    return concat_csr(parts, -(-seq_len // block_m))


def _classes(exact_allow, exact_deny, opaque_allow, opaque_deny, rows, boxes, n_rows, K, block_m, block_n):
    """Sound classes int8[q_blocks, KT] of one chunk of q_blocks; ``boxes`` the tiles' TileIntervals, and
    those of sub-tiles aligned to powers of two if some region reads bits."""
    slots = visible_slots(exact_allow, exact_deny, rows, K)
    touch, cover = grid_counts(slots, n_rows, K, block_m, block_n)
    none = np.zeros_like(touch)
    d_touch_e, d_cover_e = (grid_counts(compact(union([region_rows(r, rows, K) for r in exact_deny])),
                                        n_rows, K, block_m, block_n) if exact_deny else (none, none))
    a_touch_o, a_cover_o = (_opaque_grids(opaque_allow, rows, boxes, n_rows, K, block_m, block_n)
                            if opaque_allow else (none, none))
    d_touch_o, d_cover_o = (_opaque_grids(opaque_deny, rows, boxes, n_rows, K, block_m, block_n)
                            if opaque_deny else (none, none))
    # visible = (A_exact - D_exact) | (A_opaque - D_exact), minus D_opaque; all sound.
    full = ~d_touch_o & (cover | (a_cover_o & ~d_touch_e))
    empty = d_cover_o | (~touch & (~a_touch_o | d_cover_e))
    classes = np.full(touch.shape, PARTIAL, np.int8)
    classes[full] = FULL
    classes[empty] = EMPTY
    return classes


def _opaque_grids(regions, rows, boxes, n_rows, kv_len, block_m, block_n):
    """Sound (touch, cover) grids for the union of regions that have opaque atoms."""
    touch = cover = None
    for region in regions:
        t, c = grid_counts([region_rows(region, rows, kv_len)], n_rows, kv_len, block_m, block_n)
        fine = boxes[-1] if len(boxes) > 1 and _reads_bits(region) else None
        surely_false, surely_true = _opaque_state(region, fine or boxes[0], n_rows, kv_len)
        if fine is not None:
            surely_false, surely_true = (_all_in_tiles(x, block_m // fine.blocks[0], block_n // fine.blocks[1])
                                         for x in (surely_false, surely_true))
        t, c = t & ~surely_false, c & surely_true
        touch = t if touch is None else touch | t
        cover = c if cover is None else cover | c
    return touch, cover


def _opaque_state(region, boxes: TileIntervals, n_rows: int, kv_len: int):
    """bool grids (surely false, surely true) of a region's opaque atoms over each box."""
    grid = np.zeros((-(-n_rows // boxes.blocks[0]), -(-kv_len // boxes.blocks[1])), bool)
    states = np.broadcast_arrays(*[boxes.atom_state(a.lin) for a in region.opaque], grid)[:-1]
    return np.logical_or.reduce([s == -1 for s in states]), np.logical_and.reduce([s == 1 for s in states])


def _all_in_tiles(sub: np.ndarray, per_m: int, per_n: int) -> np.ndarray:
    """Whether every sub-box of each tile holds (sub-boxes of a tile ``per_m`` x ``per_n``, fewer at the ends):
    a region is surely false (true) on a tile where it is on each of the tile's sub-tiles."""
    out = np.logical_and.reduceat(sub, np.arange(0, sub.shape[0], per_m), axis=0)
    return np.logical_and.reduceat(out, np.arange(0, sub.shape[1], per_n), axis=1)


def _reads_bits(region) -> bool:
    """Whether a region's opaque atoms read a bit operation, whose bounds are tight over boxes aligned to
    powers of two (the bits their positions share) and loose over others (a Morton order's 80 keys)."""
    return any(isinstance(t, ir.Bits) for a in region.opaque for t in F.terms_of(a.lin))


def grid_counts(slots, n_rows: int, kv_len: int, block_m: int, block_n: int):
    """bool [q_blocks, KT] grids of one chunk of rows (0..n_rows-1, starting at a q_block): which key blocks
    any row of a q_block touches, and which every row covers, from the rows' disjoint slots."""
    starts = np.arange(0, n_rows, block_m)
    rows_per_tile = np.minimum(block_m, n_rows - starts)
    qt_count, kt_count = len(rows_per_tile), -(-kv_len // block_n)
    width = kt_count + 1
    size = qt_count * width
    if not slots:
        empty = np.zeros((qt_count, kt_count), bool)
        return empty, empty.copy()
    tile = np.tile(np.arange(n_rows) // block_m, len(slots))
    lo, hi = np.concatenate([lo for lo, _ in slots]), np.concatenate([hi for _, hi in slots])
    live = lo < hi
    base, lo, hi = tile[live].astype(np.int64) * width, lo[live], hi[live]
    # Difference arrays along each q_block: +1 where a range of key blocks starts, -1 past it.
    touch = np.bincount(base + lo // block_n, minlength=size) - np.bincount(base + -((-hi) // block_n),
                                                                            minlength=size)
    c0 = -((-lo) // block_n)
    c1 = np.where(hi >= kv_len, kt_count, hi // block_n)      # the last, short tile ends at kv_len
    good = c0 < c1
    cover = np.bincount((base + c0)[good], minlength=size) - np.bincount((base + c1)[good], minlength=size)
    touched = np.cumsum(touch.reshape(qt_count, width), axis=1)[:, :kt_count] > 0
    covered = np.cumsum(cover.reshape(qt_count, width), axis=1)[:, :kt_count] == rows_per_tile[:, None]
    return touched, covered
