"""Forms of q compiled once into a flat list of numpy steps: the per-bind evaluation of a mask's bounds.

:class:`~maskc.analysis.rows.RowValues` walks a form's terms on every evaluation (memo lookups, a type
dispatch per term), which costs more than the numpy work on the few hundred rows of a piece table.
:class:`FormProgram` does the walk once per mask: every distinct term and form (by value) becomes one step,
children before parents, and a bind runs the steps in order, each a closure doing its numpy operations.
Values are the ones RowValues computes (the same operations: int64, exact under bind's width proofs).

Forms that read k or chunk indices are not compiled (:class:`Unsupported`): their callers keep RowValues.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from maskc import ir
from maskc.analysis import bitops
from maskc.analysis import forms as F
from maskc.analysis.rows import isqrt, seg_bound, segment_attr, segment_slot

Step = Callable[[list, "Env"], object]


class Unsupported(Exception):
    """A form that reads k or a chunk index: evaluated by RowValues instead."""


class Env:
    """What a run reads besides the steps' values: positions q, one batch element's parameters, the
    builtins, and each segment table's slots at q (looked up once per run)."""

    def __init__(self, params, seq_len: int, kv_len: int, head: int, batch_index: int, q: np.ndarray):
        self.params, self.q = params, q
        self.builtins = {"seq_len": seq_len, "kv_len": kv_len, "h": head, "b": batch_index}
        self.extent = max(seq_len, kv_len)
        self._slots: dict = {}

    def slot(self, seg: str):
        hit = self._slots.get(seg)
        if hit is None:
            table = self.params.segment(seg)
            hit = self._slots[seg] = (table, segment_slot(table, self.q))
        return hit


class FormProgram:
    """The steps that evaluate ``items`` at positions q: each item a form (``ir.Lin``) or a bound
    (``ir.KBound`` with ``lower``: rounded up for a lower bound, down for an upper one), as ``(item, lower)``
    with ``lower`` None for a form. :meth:`run` returns their values in order (arrays, or int64 scalars
    for items free of q)."""

    def __init__(self, items):
        self.steps: list[Step] = []
        self._index: dict = {}
        self.outputs = [self._item(item, lower) for item, lower in items]

    def run(self, env: Env) -> list:
        values: list = []
        for step in self.steps:
            values.append(step(values, env))
        return [values[i] for i in self.outputs]

    def _add(self, key, step: Step) -> int:
        self._index[key] = len(self.steps)
        self.steps.append(step)
        return self._index[key]

    def _item(self, item, lower) -> int:
        if lower is None or item.den == 1:
            return self.lin(item if lower is None else item.lin)
        key = ("bound", item.lin, item.den, lower)
        if key not in self._index:
            i, den = self.lin(item.lin), item.den
            self._add(key, (lambda v, e: -((-v[i]) // den)) if lower else (lambda v, e: v[i] // den))
        return self._index[key]

    def lin(self, lin: ir.Lin) -> int:
        key = ("lin", lin)
        if key in self._index:
            return self._index[key]
        parts = [(self.term(t), c) for t, c in lin.terms]
        const = lin.const

        def step(v, e):         # RowValues.lin's sum: no leading zero, no negation
            out = None if const == 0 else np.int64(const)
            for i, c in parts:
                x = v[i]
                if out is None:
                    out = x if c == 1 else -x if c == -1 else c * x
                else:
                    out = out + x if c == 1 else out - x if c == -1 else out + c * x
            return np.int64(0) if out is None else out
        return self._add(key, step)

    def term(self, t) -> int:
        key = ("term", t)
        if key not in self._index:
            self._add(key, self._term(t))
        return self._index[key]

    def _term(self, t) -> Step:
        if isinstance(t, ir.Pos):
            if t.which != "q":
                raise Unsupported(t)
            return lambda v, e: e.q
        if isinstance(t, ir.Builtin):
            name = t.name
            return lambda v, e: np.int64(e.builtins[name])
        if isinstance(t, ir.ParamRef):
            name = t.name
            return lambda v, e: np.int64(e.params.int(name))
        if isinstance(t, (ir.SegAttr, ir.SegValue)):
            if t.pos != "q":
                raise Unsupported(t)
            seg = t.seg
            if isinstance(t, ir.SegValue):
                array = t.array
                return lambda v, e: segment_attr(e.slot(seg)[0], e.slot(seg)[1], "value", e.extent, array)
            attr = t.attr
            return lambda v, e: segment_attr(e.slot(seg)[0], e.slot(seg)[1], attr, e.extent)
        if isinstance(t, ir.ChunkVar):
            raise Unsupported(t)
        inner = [self.lin(x) for x in F.inner_lins(t)]
        if isinstance(t, ir.Square):
            i = inner[0]
            return lambda v, e: v[i] * v[i]
        if isinstance(t, ir.Product):
            i, j = inner
            return lambda v, e: v[i] * v[j]
        if isinstance(t, ir.Floor):
            i, j = inner
            divide = np.floor_divide if t.op == "//" else np.mod
            return lambda v, e: divide(v[i], v[j])
        if isinstance(t, ir.Extreme):
            pick = np.minimum if t.fn == "min" else np.maximum

            def extreme(v, e):
                out = v[inner[0]]
                for i in inner[1:]:
                    out = pick(out, v[i])
                return out
            return extreme
        if isinstance(t, ir.Root):
            i = inner[0]
            return lambda v, e: isqrt(v[i])
        if isinstance(t, ir.Bits):
            i, j = inner
            op = t.op
            return lambda v, e: bitops.apply(op, v[i], v[j])
        if isinstance(t, ir.Lookup):
            i, name = inner[0], t.table
            return lambda v, e: e.params.table(name).values[v[i]]
        if isinstance(t, ir.SegBound):
            i, seg = inner[0], t.seg
            return lambda v, e: seg_bound(e.params.segment(seg), v[i])
        raise TypeError(t)


def program_of(items) -> FormProgram | None:
    """The program of ``items`` (see :class:`FormProgram`), None where one reads k or a chunk index."""
    try:
        return FormProgram(items)
    except Unsupported:
        return None
