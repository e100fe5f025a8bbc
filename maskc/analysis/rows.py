"""Linear forms evaluated at run time: per query row (exact) and per tile box (interval bounds).

Classification's two instruments. ``RowValues`` evaluates k-free forms at every query position in
O(seq_len) numpy work, memoising each term (regions share most of theirs). ``TileIntervals``
bounds any form over every (q_block, kv_block) box: sound (the true values lie inside), exact for a
single linear term, loose where terms are correlated.
"""
from __future__ import annotations

import functools
import weakref

import numpy as np

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis import forms as F
from maskc.analysis.table_extremes import table_bounds
from maskc.bound_params import BatchParams


def segment_slot(table, positions: np.ndarray) -> np.ndarray:
    """Per position, 0 before the first segment, i + 1 in segment i, count + 1 past the last: what
    :func:`segment_attr` reads its attributes at."""
    return table.bounds.searchsorted(positions, side="right")


_SEGMENT_ATTRS: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def segment_attr(table, at: np.ndarray, attr: str, extent: int, array: str | None = None) -> np.ndarray:
    """One attribute of the segment at each position, from its :func:`segment_slot` ``at``: ``index`` (-1
    outside the range), ``start`` and ``end`` (of the gap before the first segment, [0, bounds[0]), and
    after the last, [bounds[-1], extent), outside), ``length``, ``inside``, ``safe`` (the index clipped into
    [0, count - 1]) or ``value`` (per-segment array ``array``, 0 outside). One gather from a table of
    count + 2 entries per attribute, made once per segment table."""
    cached = _SEGMENT_ATTRS.get(table)
    if cached is None:
        cached = _SEGMENT_ATTRS[table] = {}
    key = (attr, array, extent if attr in ("end", "length") else None)
    hit = cached.get(key)
    if hit is None:
        hit = cached[key] = np.asarray(_segment_attr_table(table, attr, extent, array),
                                       bool if attr == "inside" else np.int64)
    return hit[at]


def _segment_attr_table(table, attr: str, extent: int, array: str | None):
    """The table of count + 2 entries that :func:`segment_attr` gathers ``attr`` from (only that one is built:
    a table is new at every bind, and each numpy call here costs more than the few entries it makes)."""
    n, bounds = table.count, table.bounds
    if attr == "index":
        return np.concatenate([[-1], np.arange(n), [-1]])
    if attr == "start":
        return np.concatenate([[0], bounds])
    if attr in ("end", "length"):
        ends = np.concatenate([bounds, [extent]])
        return ends if attr == "end" else ends - np.concatenate([[0], bounds])
    if attr == "inside":
        return np.concatenate([[False], np.ones(n, bool), [False]])
    if attr == "safe":
        return np.concatenate([[0], np.arange(n), [max(n - 1, 0)]])
    assert attr == "value", attr
    return np.concatenate([[0], table.value(array), [0]])


def seg_bound(table, index):
    """``bounds[clip(index, 0, n)]``: where segment ``index`` starts (:class:`~maskc.ir.SegBound`)."""
    return table.bounds[np.clip(index, 0, table.count)]


class _Scalars:
    def __init__(self, params: BatchParams, seq_len: int, kv_len: int, head, batch_index: int):
        self.params = params
        self.builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": head, "b": batch_index}


def isqrt(values):
    """The floor of the square root of each value, exactly (negative values give 0). Many values below
    :data:`KEPT_ROOTS` (a disc's radius per chunk, radius < 256) take the kept roots; many over a narrow range
    elsewhere take the roots of that range, gathered."""
    v = np.asarray(values)
    if v.size > 64:
        hi = int(v.max())
        if hi < KEPT_ROOTS:
            # "clip" sends every negative value to index 0 (root 0) without take's per-index check: no min, no maximum
            return _kept_roots().take(v, mode="clip")
        lo = int(v.min())
        if hi - lo < v.size // 4:
            return _isqrt(np.arange(lo, hi + 1))[v - lo]
    return _isqrt(values)


KEPT_ROOTS = 1 << 16        # isqrt(0 .. KEPT_ROOTS - 1), 512 KiB, made once: 13 us a call for 257 of them


@functools.lru_cache(maxsize=1)
def _kept_roots() -> np.ndarray:
    roots = _isqrt(np.arange(KEPT_ROOTS, dtype=np.int64))
    roots.flags.writeable = False
    return roots


def _isqrt(values):
    v = np.maximum(values, 0)
    r = np.sqrt(np.asarray(v, np.float64)).astype(np.int64)
    # float64's square root is within 2**-20 of the truth below 2**62: r is off by one at most
    return r - (r * r > v) + ((r + 1) * (r + 1) <= v)


class RowValues(_Scalars):
    """Values of linear forms at the query positions ``q`` (an int64 array); forms that use k need
    key positions ``k`` too (then q and k broadcast: ``q[:, None]``, ``k[None, :]`` for a grid). Forms of q
    evaluated once per mask and bind take :mod:`maskc.analysis.formprog` instead (compiled once)."""

    def __init__(self, params: BatchParams, seq_len: int, kv_len: int, head: int, batch_index: int,
                 q: np.ndarray, k: np.ndarray | None = None):
        super().__init__(params, seq_len, kv_len, head, batch_index)
        self.q, self.k = q, k
        self.extent = max(seq_len, kv_len)
        self._memo: dict = {}
        self._slots: dict = {}

    def lin(self, lin: ir.Lin):
        hit = self._memo.get(lin)             # regions share many bounds: each is computed once
        if hit is None:
            hit, moving = (None if lin.const == 0 else np.int64(lin.const)), lin.terms
            for t, c in moving:
                v = self.term(t)
                if hit is None:
                    hit = v if c == 1 else -v if c == -1 else c * v
                else:
                    hit = hit + v if c == 1 else hit - v if c == -1 else hit + c * v
            if hit is None:
                hit = np.int64(0)
            self._memo[lin] = hit
        return hit

    def term(self, t):
        hit = self._memo.get(t)
        if hit is None:
            hit = self._memo[t] = self._term(t)
        return hit

    def _slot(self, seg: str, pos: str):
        """(segment table, :func:`segment_slot` of the positions) for segments ``seg`` at q or k, once."""
        hit = self._slots.get((seg, pos))
        if hit is None:
            positions = self.q if pos == "q" else self.k
            assert positions is not None, "a form that reads k needs key positions"
            table = self.params.segment(seg)
            hit = self._slots[seg, pos] = (table, segment_slot(table, positions))
        return hit

    def _term(self, t):
        if isinstance(t, ir.Pos):
            if t.which == "k" and self.k is None:
                raise ValueError("these row values have no key positions")
            return self.q if t.which == "q" else self.k
        if isinstance(t, ir.Builtin):
            return np.int64(self.builtins[t.name])
        if isinstance(t, ir.ParamRef):
            return np.int64(self.params.int(t.name))
        if isinstance(t, (ir.SegAttr, ir.SegValue)):
            table, at = self._slot(t.seg, t.pos)
            if isinstance(t, ir.SegValue):
                return segment_attr(table, at, "value", self.extent, t.array)
            return segment_attr(table, at, t.attr, self.extent)
        if isinstance(t, ir.Square):
            v = self.lin(t.base)
            return v * v
        if isinstance(t, ir.Product):
            return self.lin(t.left) * self.lin(t.right)
        if isinstance(t, ir.Floor):
            num, den = self.lin(t.num), self.lin(t.den)
            return np.floor_divide(num, den) if t.op == "//" else np.mod(num, den)
        if isinstance(t, ir.Extreme):
            vals = [self.lin(a) for a in t.args]
            out = vals[0]
            for v in vals[1:]:
                out = np.minimum(out, v) if t.fn == "min" else np.maximum(out, v)
            return out
        if isinstance(t, ir.Root):
            return isqrt(self.lin(t.arg))
        if isinstance(t, ir.Bits):
            return bitops.apply(t.op, self.lin(t.left), self.lin(t.right))
        if isinstance(t, ir.Lookup):
            return self.params.table(t.table).values[self.lin(t.index)]
        if isinstance(t, ir.SegBound):
            return seg_bound(self.params.segment(t.seg), self.lin(t.index))
        raise TypeError(t)


def split_on_chunks(lin: ir.Lin) -> tuple[ir.Lin, tuple]:
    """``lin`` as (the form of its terms free of chunk indices and its constant, the terms that read them);
    cached on the form (immutable)."""
    def split() -> tuple[ir.Lin, tuple]:
        moving = tuple((t, c) for t, c in lin.terms if F.term_reads_chunks(t))
        fixed = lin if not moving else ir.Lin(tuple((t, c) for t, c in lin.terms if (t, c) not in moving), lin.const)
        return fixed, moving
    return ir.kept_on(lin, "_chunk_split", split)


def lin_value(lin: ir.Lin, params: BatchParams, seq_len: int, kv_len: int, head: int, batch_index: int) -> int:
    """The value of a form free of q and k (a constant's without a RowValues: floors' offsets and divisors
    are constants in most masks, read at every bind)."""
    if not lin.terms:
        return int(lin.const)
    return int(RowValues(params, seq_len, kv_len, head, batch_index, np.zeros(1, np.int64)).lin(lin))


class TileIntervals(_Scalars):
    """Interval bounds ``(lo, hi)`` of linear forms over every tile box, shaped (QT, 1) x (1, KT).

    ``heads`` is the (lo, hi) range of h over which the bounds must hold. The boxes are the tiles, or any
    partition of each axis (``block_m``, ``block_n``: a size, or the boxes' first positions).
    """

    def __init__(self, params: BatchParams, seq_len: int, kv_len: int, heads: tuple[int, int],
                 batch_index: int, block_m, block_n, q_rows: tuple[int, int] | None = None):
        super().__init__(params, seq_len, kv_len, None, batch_index)
        self.heads = heads
        self.extent = max(seq_len, kv_len)
        row0, row1 = q_rows or (0, seq_len)          # the q_blocks covered: rows row0..row1-1
        self.axes = {"q": self._axis(row0, row1, block_m, (slice(None), None)),
                     "k": self._axis(0, kv_len, block_n, (None, slice(None)))}
        self.shape = (len(self.axes["q"][0]), len(self.axes["k"][0]))
        self._memo: dict = {}

    @staticmethod
    def _axis(first: int, end: int, block, shape):
        """A block size, or the boxes' first positions (ascending, from ``first``: boxes of several sizes)."""
        starts = np.asarray(block, np.int64) if np.ndim(block) else np.arange(first, end, block, dtype=np.int64)
        positions = np.arange(first, end, dtype=np.int64)
        return starts, positions, shape, np.append(starts[1:], end) - 1

    def _per_block(self, pos: str, values: np.ndarray):
        """(min, max) of per-position values over each block of the axis, shaped for broadcasting."""
        starts, positions, shape, _ = self.axes[pos]
        values = np.broadcast_to(values, positions.shape)
        at = starts - positions[0]
        return np.minimum.reduceat(values, at)[shape], np.maximum.reduceat(values, at)[shape]

    def lin(self, lin: ir.Lin):
        lo = hi = np.int64(lin.const)
        for t, c in lin.terms:
            tlo, thi = self.term(t)
            if c > 0:
                lo, hi = lo + c * tlo, hi + c * thi
            else:
                lo, hi = lo + c * thi, hi + c * tlo
        return lo, hi

    def term(self, t):
        hit = self._memo.get(t)
        if hit is None:
            hit = self._memo[t] = self._term(t)
        return hit

    def _term(self, t):
        if isinstance(t, ir.Pos):
            starts, _, shape, last = self.axes[t.which]
            return starts[shape], last[shape]
        if isinstance(t, ir.Builtin):
            if t.name == "h":
                return np.int64(self.heads[0]), np.int64(self.heads[1])
            v = np.int64(self.builtins[t.name])
            return v, v
        if isinstance(t, ir.ParamRef):
            v = np.int64(self.params.int(t.name))
            return v, v
        if isinstance(t, (ir.SegAttr, ir.SegValue)):
            positions = self.axes[t.pos][1]
            row = RowValues(self.params, self.builtins["seq_len"], self.builtins["kv_len"], 0,
                            self.builtins["b"], positions, positions)
            return self._per_block(t.pos, row.term(t))
        if isinstance(t, ir.Square):
            lo, hi = self.lin(t.base)
            sq_lo = np.where((lo <= 0) & (hi >= 0), 0, np.minimum(lo * lo, hi * hi))
            return sq_lo, np.maximum(lo * lo, hi * hi)
        if isinstance(t, ir.Product):
            (a, b), (c, d) = self.lin(t.left), self.lin(t.right)
            corners = (a * c, a * d, b * c, b * d)
            return np.minimum.reduce(np.broadcast_arrays(*corners)), np.maximum.reduce(np.broadcast_arrays(*corners))
        if isinstance(t, ir.Floor):
            (a, b), (d0, d1) = self.lin(t.num), self.lin(t.den)   # bind checked d0 > 0
            if t.op == "//":
                return np.minimum(a // d0, a // d1), np.maximum(b // d0, b // d1)
            same_period = (d0 == d1) & (a // d0 == b // d0)
            return np.where(same_period, a % d0, 0), np.where(same_period, b % d0, d1 - 1)
        if isinstance(t, ir.Extreme):
            bounds = [self.lin(a) for a in t.args]
            fn = np.minimum if t.fn == "min" else np.maximum
            lo, hi = bounds[0]
            for blo, bhi in bounds[1:]:
                lo, hi = fn(lo, blo), fn(hi, bhi)
            return lo, hi
        if isinstance(t, ir.Root):                  # monotone
            lo, hi = self.lin(t.arg)
            return isqrt(lo), isqrt(hi)
        if isinstance(t, ir.Bits):
            return bitops.interval(t.op, self.lin(t.left), self.lin(t.right))
        if isinstance(t, ir.Lookup):
            return self._lookup(t)
        if isinstance(t, ir.SegBound):              # non-decreasing in the index
            table = self.params.segment(t.seg)
            lo, hi = self.lin(t.index)
            return seg_bound(table, lo), seg_bound(table, hi)
        raise TypeError(t)

    def _lookup(self, t: ir.Lookup):
        """The entries of a table over each box. Where the index is a part that reads q alone plus the rest (a
        2-D table's row of q and column of k: ``t[q // 64, k // 64]``, an ancestor matrix ``anc[q, k - p]``),
        the entries are bounded for each value the q part takes in a q_block, each over the rest's interval:
        for every value where the boxes are few (_LOOKUP_WORK values x boxes), else for up to _ROW_VALUES of
        them, the blocks that take more bounded over the index's interval (a whole run of rows)."""
        table = self.params.table(t.table)
        whole = table_bounds(table, *self.lin(t.index))
        q_only = tuple((u, c) for u, c in t.index.terms if F.term_depends_on_q(u) and not F.term_depends_on_k(u))
        q_part = ir.Lin(q_only, 0)
        if not q_only or len(q_only) == len(t.index.terms) or (
                self.heads[0] != self.heads[1] and F.depends_on_head(q_part)):
            return whole
        starts, positions, shape, _ = self.axes["q"]
        values = RowValues(self.params, self.builtins["seq_len"], self.builtins["kv_len"], self.heads[0],
                           self.builtins["b"], positions).lin(q_part)
        boxes = len(starts) * len(self.axes["k"][0])
        distinct = _block_values(np.broadcast_to(values, positions.shape), starts - positions[0],
                                 max(_ROW_VALUES, _LOOKUP_WORK // max(boxes, 1)))
        if distinct is None:
            return whole
        few, slots = distinct
        rest_lo, rest_hi = self.lin(ir.Lin(tuple(x for x in t.index.terms if x not in q_only), t.index.const))
        per_value = [table_bounds(table, a[shape] + rest_lo, a[shape] + rest_hi) for a in slots]
        least = np.minimum.reduce(np.broadcast_arrays(*[lo for lo, _ in per_value]))
        greatest = np.maximum.reduce(np.broadcast_arrays(*[hi for _, hi in per_value]))
        return np.where(few[shape], least, whole[0]), np.where(few[shape], greatest, whole[1])

    def atom_state(self, lin: ir.Lin):
        """Per tile: 1 where ``lin <= 0`` surely holds, -1 where it surely fails, 0 where unknown."""
        lo, hi = self.lin(lin)
        return np.where(hi <= 0, 1, np.where(lo > 0, -1, 0)).astype(np.int8)


_ROW_VALUES = 8
"""The values of a lookup's q part in one q_block that TileIntervals bounds one by one, at least."""
_LOOKUP_WORK = 1 << 20
"""... and at most, times the boxes of a chunk of rows: a small grid is bounded row by row of its table."""


def _block_values(values: np.ndarray, at: np.ndarray, cap: int):
    """(few bool[blocks], slots): for blocks starting at ``at``, whether a block holds at most ``cap`` distinct
    values, and up to ``cap`` arrays of them (slot i: the i-th least, or the least where there are fewer);
    None where no block has so few."""
    ends = np.append(at[1:], len(values))
    width = int((ends - at).max())
    grid = np.sort(values[np.minimum(at[:, None] + np.arange(width), ends[:, None] - 1)], axis=1)
    new = np.ones(grid.shape, bool)
    new[:, 1:] = grid[:, 1:] != grid[:, :-1]
    count = new.sum(axis=1)
    few = count <= cap
    if not few.any():
        return None
    rank = np.cumsum(new, axis=1) - 1
    rows = np.arange(len(grid))
    slots = [np.where(count > i, grid[rows, np.argmax(new & (rank == i), axis=1)], grid[:, 0])
             for i in range(min(cap, int(count[few].max())))]
    return few, slots


def k_bound_rows(bound: ir.KBound, rows: RowValues, lower: bool):
    """The per-row value of a k bound: ceil(lin / den) for a lower bound, floor for an upper one."""
    v = rows.lin(bound.lin)
    if bound.den == 1:
        return v
    return -((-v) // bound.den) if lower else v // bound.den


__all__ = ["RowValues", "TileIntervals", "lin_value", "k_bound_rows", "isqrt"]
