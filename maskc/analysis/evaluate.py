"""The reference semantics: a resolved mask evaluated densely, by brute force, in numpy.

This is the oracle every pass is tested against. It reads the *resolved* mask (before normalize),
so normalize, range analysis and classification are all checked against something they did not
produce, and it looks segments up in the plainest way (a table of every position).
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis.interpret import Interpreter
from maskc.analysis.rows import segment_attr, segment_slot
from maskc.errors import BindError
from maskc.bound_params import BatchParams


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


class Evaluator(Interpreter):
    """Evaluates expressions of one mask for one batch element in numpy int64 (the walk is
    :class:`~maskc.analysis.interpret.Interpreter`'s); q and k are numpy arrays that broadcast against each
    other (``q[:, None]`` and ``k[None, :]`` for the dense mask). A divisor that is not positive, a shift
    amount outside [0, MAX_SHIFT] or a table index outside its table is a BindError."""

    def __init__(self, mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int,
                 head: int = 0, batch_index: int = 0):
        self.mask, self.params = mask, params
        self.builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": head, "b": batch_index}
        self.extent = max(seq_len, kv_len)

    def segment(self, seg: str, attr: str, positions):
        """Looked up in the bounds: memory grows with the positions asked, not with seq_len; only the attribute
        asked for is gathered (a per-segment value is 0 outside the segments). Searched afresh at every call: the
        positions array may have been written since the last (keeping its slots saved under 0.5 ms of a bind
        with 16K segments, nothing measurable with few)."""
        table = self.params.segment(seg)
        at = segment_slot(table, np.asarray(positions, np.int64))
        if attr.startswith("value:"):
            return segment_attr(table, at, "value", self.extent, attr[len("value:"):])
        return segment_attr(table, at, attr, self.extent)

    def const(self, value: int):
        return np.int64(value)

    def builtin(self, name: str):
        return np.int64(self.builtins[name])

    def param(self, name: str):
        return np.int64(self.params.int(name))

    def table(self, e: ir.TableAt, indices: list, q, k):
        """One index per dimension, each checked against its size."""
        table = self.params.table(e.table)
        values = table.values.reshape(table.shape)
        indices = [np.asarray(i) for i in indices]
        for index, size in zip(indices, table.shape):
            if np.any((index < 0) | (index >= size)):
                raise BindError(f"an index of table '{e.table}' in mask '{self.mask.name}' is outside [0, "
                                f"{size})", e.span)
        return values[tuple(np.broadcast_arrays(*indices))]

    def minimum(self, a, b):
        return np.minimum(a, b)

    def maximum(self, a, b):
        return np.maximum(a, b)

    def absolute(self, a):
        return np.abs(a)

    def arith(self, e: ir.Arith, a, b):
        if e.op in ("+", "-", "*"):
            return super().arith(e, a, b)
        if e.op in ir.BIT_OPS:
            if e.op in ("<<", ">>") and np.any((np.asarray(b) < 0) | (np.asarray(b) > ir.MAX_SHIFT)):
                raise BindError(f"a shift amount in mask '{self.mask.name}' is outside [0, {ir.MAX_SHIFT}]", e.span)
            return bitops.apply(e.op, a, b)
        if np.any(np.asarray(b) <= 0):
            raise BindError(f"a divisor in mask '{self.mask.name}' is not positive", e.span)
        return np.floor_divide(a, b) if e.op == "//" else np.mod(a, b)

    def truth(self, value: bool, q, k):
        return np.bool_(value)

    def boolean(self, value):
        return np.asarray(value, bool)

    def any_of(self, values, q, k):
        """In place, into an array of the positions' broadcast shape (all False when there are none)."""
        out = np.zeros(np.broadcast_shapes(np.shape(q), np.shape(k)), bool)
        for v in values:
            out |= v
        return out


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
