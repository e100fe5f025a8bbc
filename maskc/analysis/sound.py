"""Sound tile classes of masks with inexact regions: their opaque atoms bounded over each tile box.

Classification's instrument where a region reads k in a way the range analysis cannot solve (a product of
q and k, a floor of k by a run-time divisor past the chunk budget): the regions' linear parts are counted
row by row (exactly), the opaque atoms are bounded per (q_block, kv_block) box by interval arithmetic
(:class:`~maskc.analysis.rows.TileIntervals`), and the two are combined so that FULL and EMPTY are never wrong.
The work is per tile, so time grows with the tile grid (classify caps it at MAX_TILES); memory grows with
one chunk of q_blocks at a time, and the result is kept as runs, never as the grid.
"""
from __future__ import annotations

import functools

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.intervals import compact, region_rows, union, visible_slots
from maskc.analysis.rows import RowValues, TileIntervals
from maskc.analysis.tiles import concat_csr
from maskc.kernel_ir import EMPTY, FULL, PARTIAL
from maskc.runs import runs_of


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
        boxes = _Boxes(params, seq_len, kv_len, head, b, (row0, row1), block_m, block_n)
        parts.append(runs_of(_classes(exact_allow, exact_deny, opaque_allow, opaque_deny, rows, boxes, row1 - row0,
                                      kv_len, block_m, block_n)))
        counted(parts[-1][1])
    return concat_csr(parts, -(-seq_len // block_m))


def _classes(exact_allow, exact_deny, opaque_allow, opaque_deny, rows, boxes, n_rows, K, block_m, block_n):
    """Sound classes int8[q_blocks, KT] of one chunk of q_blocks; ``boxes`` its TileIntervals over the tiles
    or over sub-tiles (:class:`_Boxes`)."""
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
        over, firsts = boxes.for_region(region, rows)
        surely_false, surely_true = _opaque_state(region, over)
        if firsts is not None:                       # sub-tiles: the tile's class where every one of them has it
            surely_false, surely_true = (np.logical_and.reduceat(np.logical_and.reduceat(x, firsts[0], axis=0),
                                                                 firsts[1], axis=1)
                                         for x in (surely_false, surely_true))
        t, c = t & ~surely_false, c & surely_true
        touch = t if touch is None else touch | t
        cover = c if cover is None else cover | c
    return touch, cover


def _opaque_state(region, boxes: TileIntervals):
    """bool grids (surely false, surely true) of a region's opaque atoms over each box."""
    states = np.broadcast_arrays(*[boxes.atom_state(a.lin) for a in region.opaque], np.zeros(boxes.shape, bool))
    return (np.logical_or.reduce([s == -1 for s in states[:-1]]),
            np.logical_and.reduce([s == 1 for s in states[:-1]]))


MAX_SUB_TILES = 8
"""The most sub-tiles per tile, on average, that a tile's side is cut into for its opaque atoms' bounds."""


class _Boxes:
    """The TileIntervals of one chunk of rows (whole q_blocks) over its tiles, or over sub-tiles where a region's
    atoms are tight over those and not over whole tiles (see _cuts); each partition made once."""

    def __init__(self, params, seq_len: int, kv_len: int, head: int, b: int, q_rows: tuple[int, int],
                 block_m: int, block_n: int):
        self.make = functools.partial(TileIntervals, params, seq_len, kv_len, (head, head), b, q_rows=q_rows)
        self.axes = {"q": (q_rows[0], q_rows[1], block_m), "k": (0, kv_len, block_n)}
        self._made: dict = {}

    def for_region(self, region, rows: RowValues):
        """(TileIntervals, None) over the tiles, or (TileIntervals, (q_firsts, k_firsts)) over sub-tiles with the
        index of each tile's first sub-tile along each axis."""
        starts = {}
        for pos, (first, end, block) in self.axes.items():
            tiles = np.arange(first, end, block, dtype=np.int64)
            cuts = [np.arange(first + (phase - first) % period, end, period, dtype=np.int64)
                    for period, phase in _cuts(region, rows, pos, block)]
            finer = np.unique(np.concatenate([tiles, *cuts])) if cuts else tiles
            starts[pos] = (finer if len(finer) <= MAX_SUB_TILES * len(tiles) else tiles), tiles
        (q_starts, q_tiles), (k_starts, k_tiles) = starts["q"], starts["k"]
        if len(q_starts) == len(q_tiles) and len(k_starts) == len(k_tiles):
            return self._boxes(self.axes["q"][2], self.axes["k"][2]), None
        return self._boxes(q_starts, k_starts), (np.searchsorted(q_starts, q_tiles), np.searchsorted(k_starts, k_tiles))

    def _boxes(self, q_blocks, k_blocks) -> TileIntervals:
        key = (np.asarray(q_blocks).tobytes(), np.asarray(k_blocks).tobytes())
        if key not in self._made:
            self._made[key] = self.make(q_blocks, k_blocks)
        return self._made[key]


def _cuts(region, rows: RowValues, pos: str, block: int) -> tuple:
    """Where to cut a ``pos`` axis so that a region's opaque atoms are tight over the boxes: ``(period, phase)``
    pairs. A bit operation is tight over boxes aligned to powers of two (positions sharing their high bits: a
    Morton order's 80 keys are 64 + 16); a table read at ``(pos + c) // d``, with d and c known at bind, over
    boxes within which the floor is one number (``t[k // img]``: each box one image, one entry of t)."""
    cuts = set()
    for atom in region.opaque:
        for t in F.terms_of(atom.lin):
            if isinstance(t, ir.Bits) and block & (block - 1):
                cuts.add((block & -block, 0))
            elif isinstance(t, ir.Lookup):
                cuts.update(step for u in F.terms_of(t.index) if (step := _floor_step(u, rows, pos)) is not None)
    return tuple(sorted(cuts))


def _floor_step(term, rows: RowValues, pos: str):
    """``(d, -c mod d)`` for ``(pos + c) // d`` with d and c known at bind (the floor steps there); else None."""
    if not (isinstance(term, ir.Floor) and term.op == "//") or F.depends_on_q(term.den) or F.depends_on_k(term.den):
        return None
    split = F.split_on(term.num, F.K if pos == "k" else F.Q)
    if split is None or split[0] != 1 or F.depends_on_q(split[1]) or F.depends_on_k(split[1]):
        return None
    d, c = rows.lin(term.den), rows.lin(split[1])
    if np.ndim(d) or np.ndim(c) or d <= 0:
        return None
    return int(d), int(-c % d)


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
