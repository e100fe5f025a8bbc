"""The reference semantics: a resolved mask evaluated densely, by brute force, in numpy.

This is the oracle every pass is tested against. It reads the *resolved* mask (before normalize),
so normalize, range analysis and classification are all checked against something they did not
produce, and it looks segments up in the plainest way (a table of every position).
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis.rows import segment_lookup
from maskc.errors import BindError
from maskc.kernel_ir import BatchParams

_CMP = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
        "==": np.equal, "!=": np.not_equal}


def segment_tables(table, extent: int) -> dict[str, np.ndarray]:
    """Per position 0..extent-1: its segment's index, start, end and length, and each per-segment
    array's value (key ``"value:<name>"``), written out position by position."""
    b = [int(x) for x in table.bounds]
    index = np.full(extent, -1, np.int64)
    start = np.zeros(extent, np.int64)
    end = np.full(extent, b[0], np.int64)
    start[b[-1]:] = b[-1]                              # the gap after the range
    end[b[-1]:] = extent
    values = {name: np.zeros(extent, np.int64) for name, _ in table.values}
    for i in range(table.count):
        lo, hi = b[i], b[i + 1]
        index[lo:hi], start[lo:hi], end[lo:hi] = i, lo, hi
        for name, arr in table.values:
            values[name][lo:hi] = arr[i]
    return {"index": index, "start": start, "end": end, "length": end - start,
            **{"value:" + k: v for k, v in values.items()}}


class Evaluator:
    """Evaluates expressions of one mask for one batch element; q and k are numpy arrays that
    broadcast against each other (``q[:, None]`` and ``k[None, :]`` for the dense mask)."""

    def __init__(self, mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int,
                 head: int = 0, batch_index: int = 0):
        self.mask, self.params = mask, params
        self.builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": head, "b": batch_index}
        self.extent = max(seq_len, kv_len)

    def _segment(self, seg: str, attr: str, positions):
        """Attribute ``attr`` (index, start, end, length, or "value:<array>") of the segment at each position,
        looked up in the bounds (memory grows with the positions asked, not with seq_len)."""
        table = self.params.segment(seg)
        index, start, end, inside, safe = segment_lookup(table, np.asarray(positions, np.int64), self.extent)
        if attr.startswith("value:"):
            values = table.value(attr[len("value:"):])
            return np.where(inside, values[safe], 0) if table.count else np.zeros_like(index)
        return {"index": index, "start": start, "end": end}[attr] if attr != "length" else end - start

    def int(self, e: ir.IntExpr, q, k):
        if isinstance(e, ir.Const):
            return np.int64(e.value)
        if isinstance(e, ir.Pos):
            return q if e.which == "q" else k
        if isinstance(e, ir.Builtin):
            return np.int64(self.builtins[e.name])
        if isinstance(e, ir.ParamRef):
            return np.int64(self.params.int(e.name))
        if isinstance(e, ir.SegAttr):
            return self._segment(e.seg, e.attr, q if e.pos == "q" else k)
        if isinstance(e, ir.SegValue):
            return self._segment(e.seg, "value:" + e.array, q if e.pos == "q" else k)
        if isinstance(e, ir.TableAt):           # one index per dimension, each checked against its size
            table = self.params.table(e.table)
            values = table.values.reshape(table.shape)
            indices = [np.asarray(self.int(i, q, k)) for i in e.indices]
            for index, size in zip(indices, table.shape):
                if np.any((index < 0) | (index >= size)):
                    raise BindError(f"an index of table '{e.table}' in mask '{self.mask.name}' is outside [0, "
                                    f"{size})", e.span)
            return values[tuple(np.broadcast_arrays(*indices))]
        if isinstance(e, ir.Func):
            args = [self.int(a, q, k) for a in e.args]
            if e.fn == "abs":
                return np.abs(args[0])
            out = args[0]
            for a in args[1:]:
                out = np.minimum(out, a) if e.fn == "min" else np.maximum(out, a)
            return out
        a, b = self.int(e.left, q, k), self.int(e.right, q, k)
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            return a * b
        if e.op in ir.BIT_OPS:
            if e.op in ("<<", ">>") and np.any((np.asarray(b) < 0) | (np.asarray(b) > ir.MAX_SHIFT)):
                raise BindError(f"a shift amount in mask '{self.mask.name}' is outside [0, {ir.MAX_SHIFT}]", e.span)
            return bitops.apply(e.op, a, b)
        if np.any(np.asarray(b) <= 0):
            raise BindError(f"a divisor in mask '{self.mask.name}' is not positive", e.span)
        return np.floor_divide(a, b) if e.op == "//" else np.mod(a, b)

    def cond(self, c: ir.Cond, q, k):
        if isinstance(c, ir.Truth):
            return np.bool_(c.value)
        if isinstance(c, ir.Cmp):
            return _CMP[c.op](self.int(c.left, q, k), self.int(c.right, q, k))
        if isinstance(c, ir.Same):
            iq, ik = self._segment(c.seg, "index", q), self._segment(c.k_seg, "index", k)
            return (iq >= 0) & (iq == ik)
        if isinstance(c, ir.Negate):
            return ~np.asarray(self.cond(c.item, q, k), bool)
        parts = [np.asarray(self.cond(i, q, k), bool) for i in c.items]
        out = parts[0]
        for p in parts[1:]:
            out = (out & p) if isinstance(c, ir.All) else (out | p)
        return out

    def visible(self, q, k):
        allow = np.zeros(np.broadcast_shapes(np.shape(q), np.shape(k)), bool)
        deny = np.zeros_like(allow)
        for r in self.mask.rules:
            if r.kind == "allow":
                allow |= self.cond(r.cond, q, k)
            elif r.kind == "deny":
                deny |= self.cond(r.cond, q, k)
        return allow & ~deny


def _positions(p) -> np.ndarray:
    if isinstance(p, range):
        return np.arange(p.start, p.stop, p.step, dtype=np.int64)
    return np.asarray(p, dtype=np.int64).reshape(-1)


MAX_DENSE_CELLS = 1 << 30      # a dense mask's pairs: 1 GiB of bool
_CHUNK_CELLS = 1 << 22         # pairs evaluated at once


def dense_mask(mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int,
               head: int = 0, batch_index: int = 0, rows=None, cols=None) -> np.ndarray:
    """bool[seq_len, kv_len]: the mask itself, pair by pair; or only the query positions ``rows`` and key
    positions ``cols`` (e.g. ranges: a sub-block), bool[len(rows), len(cols)]."""
    ev = Evaluator(mask, params, seq_len, kv_len, head, batch_index)
    rows = range(seq_len) if rows is None else rows
    cols = range(kv_len) if cols is None else cols
    cells = len(rows) * len(cols)
    if cells > MAX_DENSE_CELLS:
        raise BindError(f"a dense mask of {len(rows)} x {len(cols)} = {cells} pairs is larger than {MAX_DENSE_CELLS} "
                        "(2**30), the most maskc builds", mask.span,
                        "use tile_map() or descriptor(), or the dense mask of a sub-block: restrict(...).dense()")
    q = _positions(rows)[:, None]
    k = _positions(cols)[None, :]
    out = np.empty((q.shape[0], k.shape[1]), bool)
    step = max(1, _CHUNK_CELLS // max(1, k.shape[1]))     # the evaluator's int64 temporaries stay small
    for r in range(0, q.shape[0], step):
        out[r:r + step] = ev.visible(q[r:r + step], k)
    return out
