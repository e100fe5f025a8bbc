"""Interval bounds of every intermediate a mask's forms and expressions compute, in Python integers.

:class:`Bounds` walks a form (or a resolved expression) over the whole domain of a binding: q in [0, seq_len),
k in [0, kv_len) (optionally a tile's padding past both), every head and the bound parameter values; each
term, product, quotient, bit operation, table read and partial sum gets (lo, hi), and a value past the limit
raises :class:`TooWide` (:class:`BadShift` for a shift amount out of range, :class:`OutOfRange` for a table
index). :mod:`maskc.analysis.widths` runs it at bind for the 64-bit proof and the 32-bit one.
"""
from __future__ import annotations

import math

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis import forms as F
from maskc.analysis.values import INT32
from maskc.bound_params import BatchParams

LIMIT = 2 ** 62
NARROW_LIMIT = INT32               # what the 32-bit proof holds every intermediate to


COMPOUND_EXPRS = (ir.Const, ir.Func, ir.Arith, ir.TableAt)     # what of_expr combines (the rest are leaves)


def operands(e) -> tuple:
    if isinstance(e, ir.Func):
        return e.args
    if isinstance(e, ir.Arith):
        return (e.left, e.right)
    return e.indices + e.strides if isinstance(e, ir.TableAt) else ()


def cond_exprs(c):
    """The expressions a condition compares, left to right."""
    if isinstance(c, ir.Cmp):
        yield c.left
        yield c.right
    elif isinstance(c, ir.Negate):
        yield from cond_exprs(c.item)
    elif isinstance(c, (ir.All, ir.Any_)):
        for item in c.items:
            yield from cond_exprs(item)


class TooWide(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


class BadShift(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value


class OutOfRange(Exception):
    def __init__(self, table: str, value: int, count: int, dim: int | None = None):
        super().__init__(table, value, count)
        self.table, self.value, self.count, self.dim = table, value, count, dim


def fit(*values: int, limit: int = LIMIT) -> None:
    for v in values:
        if abs(v) > limit:
            raise TooWide(v)


class Bounds:
    """Interval bounds (lo, hi), as Python integers, of terms and expressions over the whole domain."""

    def __init__(self, params: BatchParams, seq_len: int, kv_len: int, heads: int, batch_index: int,
                 limit: int = LIMIT, padding: int = 0):
        self.padding = padding
        self.limit = limit
        self.params = params
        self.extent = max(seq_len, kv_len)
        self.leaves = {"q": (0, seq_len - 1 + padding), "k": (0, kv_len - 1 + padding), "h": (0, max(heads, 1) - 1),
                       "b": (batch_index, batch_index), "seq_len": (seq_len, seq_len), "kv_len": (kv_len, kv_len)}
        self.chunks: dict[int, tuple[int, int]] = {}    # ChunkVar level -> its range (the recursive walk's)

    # -- leaves shared by both representations --------------------------------------------------
    def leaf(self, t) -> tuple[int, int]:
        if isinstance(t, ir.Pos):
            return self.leaves[t.which]
        if isinstance(t, ir.Builtin):
            return self.leaves[t.name]
        if isinstance(t, ir.ParamRef):
            v = self.params.int(t.name)
            return v, v
        if isinstance(t, ir.SegAttr):
            return self.segment_index(t) if t.attr == "index" else (0, self.extent)
        if isinstance(t, ir.SegValue):
            extent = self.params.segment(t.seg).value_range(t.array)
            return (min(extent[0], 0), max(extent[1], 0)) if extent is not None else (0, 0)
        raise TypeError(t)

    def segment_index(self, t: ir.SegAttr) -> tuple[int, int]:
        """The index of the segment holding q (or k): -1 only where positions lie outside the partitioned range
        (so a table may be read at ``docs.index(q)`` when the segments cover [0, seq_len))."""
        table = self.params.segment(t.seg)
        first, last = self.leaves[t.pos]
        bounds = table.bounds
        outside = first < bounds[0] or last >= bounds[-1]
        inside = table.count > 0 and first < bounds[-1] and last >= bounds[0]
        return (-1 if outside else 0), (table.count - 1 if inside else -1)

    def product(self, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        corners = (a[0] * b[0], a[0] * b[1], a[1] * b[0], a[1] * b[1])
        fit(*corners, limit=self.limit)
        return min(corners), max(corners)

    def floor(self, op: str, num: tuple[int, int], den: tuple[int, int]) -> tuple[int, int]:
        mag = max(abs(num[0]), abs(num[1]))
        if den[0] < 1:            # bind refuses a divisor that is not positive; stay sound until then
            dmag = max(abs(den[0]), abs(den[1]))
            return (-mag, mag) if op == "//" else (-dmag, dmag)
        if op == "//":
            return min(num[0] // den[0], num[0] // den[1]), max(num[1] // den[0], num[1] // den[1])
        fit(den[1] * (mag // den[0] + 1), limit=self.limit)      # the kernel's modulo subtracts den * quotient
        return 0, den[1] - 1

    def extreme(self, fn: str, args: list[tuple[int, int]]) -> tuple[int, int]:
        pick = min if fn == "min" else max
        return pick(lo for lo, _ in args), pick(hi for _, hi in args)

    def bits(self, op: str, a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
        if op in ("<<", ">>"):
            if self.padding:                     # past the ends the kernel clamps the amount
                b = (min(max(b[0], 0), ir.MAX_SHIFT), min(max(b[1], 0), ir.MAX_SHIFT))
            if b[0] < 0 or b[1] > ir.MAX_SHIFT:
                raise BadShift(b[0] if b[0] < 0 else b[1])
            scale = (2 ** b[0], 2 ** b[1])       # x >> n == x // 2**n, x << n == x * 2**n
            return self.floor("//", a, scale) if op == ">>" else self.product(a, scale)
        lo, hi = bitops.interval(op, a, b)        # operands within LIMIT: the result fits in int64
        lo, hi = int(lo), int(hi)
        fit(lo, hi, limit=self.limit)
        return lo, hi

    def lookup(self, name: str, index: tuple[int, int]) -> tuple[int, int]:
        table = self.params.table(name)
        if self.padding:                         # past the ends the kernel clamps the index into the table
            index = (min(max(index[0], 0), table.count - 1), min(max(index[1], 0), table.count - 1))
        if index[0] < 0 or index[1] >= table.count:
            raise OutOfRange(name, index[0] if index[0] < 0 else index[1], table.count)
        values = table.values[index[0]:index[1] + 1]
        return int(values.min()), int(values.max())

    def lookup_at(self, name: str, indices: list[tuple[int, int]]) -> tuple[int, int]:
        """A table read as written: each index within its dimension (the head's too, for a table per h)."""
        table = self.params.table(name)
        if len(indices) == 1:
            return self.lookup(name, indices[0])
        for d, ((lo, hi), size) in enumerate(zip(indices, table.shape)):
            if lo < 0 or hi >= size:
                raise OutOfRange(name, lo if lo < 0 else hi, size, d)
        rows = table.values.reshape(table.shape)[indices[0][0]:indices[0][1] + 1, indices[1][0]:indices[1][1] + 1]
        return int(rows.min()), int(rows.max())

    def seg_bound(self, seg: str, index: tuple[int, int]) -> tuple[int, int]:
        """Segment bounds are non-decreasing: the bounds at the clipped ends of the index's interval."""
        bounds = self.params.segment(seg).bounds
        n = len(bounds) - 1
        return int(bounds[min(max(index[0], 0), n)]), int(bounds[min(max(index[1], 0), n)])

    # -- analysed forms ---------------------------------------------------------------------------
    # -- combinations of proven children (shared by the recursive walk and the compiled check) ----------
    def of_lin(self, lin: ir.Lin, terms: list[tuple[int, int]]) -> tuple[int, int]:
        fit(lin.const, limit=self.limit)
        lo = hi = lin.const
        partial = abs(lin.const)
        for (_, c), (tlo, thi) in zip(lin.terms, terms):
            a, b = sorted((c * tlo, c * thi))
            fit(a, b, limit=self.limit)
            lo, hi = lo + a, hi + b
            partial += max(abs(a), abs(b))
            fit(partial, limit=self.limit)       # every partial sum, in whatever order it is added
        return lo, hi

    def of_term(self, t, lins: list[tuple[int, int]]) -> tuple[int, int]:
        """A non-leaf term from its inner forms' (forms.inner_lins) bounds."""
        if isinstance(t, ir.Square):
            lo, hi = lins[0]
            top = max(lo * lo, hi * hi)
            fit(top, limit=self.limit)
            return (0 if lo <= 0 <= hi else min(lo * lo, hi * hi)), top
        if isinstance(t, ir.Product):
            return self.product(lins[0], lins[1])
        if isinstance(t, ir.Floor):
            return self.floor(t.op, lins[0], lins[1])
        if isinstance(t, ir.Extreme):
            return self.extreme(t.fn, lins)
        if isinstance(t, ir.Root):                  # monotone; read only where its argument is >= 0
            lo, hi = lins[0]
            return math.isqrt(max(lo, 0)), math.isqrt(max(hi, 0))
        if isinstance(t, ir.Bits):
            return self.bits(t.op, lins[0], lins[1])
        if isinstance(t, ir.Lookup):
            return self.lookup(t.table, lins[0])
        if isinstance(t, ir.SegBound):
            return self.seg_bound(t.seg, lins[0])
        raise TypeError(t)

    def of_expr(self, e, args: list[tuple[int, int]]) -> tuple[int, int]:
        """A resolved expression that is not a leaf from its operands' (:func:`operands`) bounds."""
        if isinstance(e, ir.Const):
            fit(e.value, limit=self.limit)
            return e.value, e.value
        if isinstance(e, ir.Func):
            if e.fn == "abs":
                lo, hi = args[0]
                return (0 if lo <= 0 <= hi else min(abs(lo), abs(hi))), max(abs(lo), abs(hi))
            return self.extreme(e.fn, args)
        if isinstance(e, ir.TableAt):             # the indices' bounds, then the strides' (unused here)
            return self.lookup_at(e.table, args[:len(e.indices)])
        a, b = args
        if e.op == "*":
            return self.product(a, b)
        if e.op in ("//", "%"):
            return self.floor(e.op, a, b)
        if e.op in ir.BIT_OPS:
            return self.bits(e.op, a, b)
        out = (a[0] + b[0], a[1] + b[1]) if e.op == "+" else (a[0] - b[1], a[1] - b[0])
        fit(*out, limit=self.limit)
        return out

    # -- the recursive walk -----------------------------------------------------------------------------
    def lin(self, lin: ir.Lin) -> tuple[int, int]:
        return self.of_lin(lin, [self.term(t) for t, _ in lin.terms])

    def term(self, t) -> tuple[int, int]:
        if isinstance(t, ir.ChunkVar):            # a chunk index of a ChunkedKeys nest: its range, set by the caller
            return self.chunks[t.level]
        if isinstance(t, ir.HashOnce):
            return self.of_term(t, [self.lin(a) for a in F.inner_lins(t)])
        return self.leaf(t)

    def expr(self, e) -> tuple[int, int]:
        if isinstance(e, COMPOUND_EXPRS):
            return self.of_expr(e, [self.expr(a) for a in operands(e)])
        return self.leaf(e)

    def cond(self, c) -> None:
        for e in cond_exprs(c):
            self.expr(e)
