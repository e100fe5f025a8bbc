"""``require`` conditions compiled once into flat lists of steps: what bind checks at every bind.

The Evaluator (:mod:`maskc.analysis.evaluate`) walks a condition's tree at every evaluation: every leaf a numpy
value (parameters as int64 scalars, whose operations cost a microsecond each), a segment looked up once per
mention (``targets(q)`` twice in hstu's ``0 <= targets(q) <= users.length(q) - folded``). :class:`CondProgram`
walks it once per condition: each distinct sub-expression (by value) becomes one step, children before parents;
a run computes the steps in order, parameters and constants as Python integers, each segment table searched once
at the positions (:class:`~maskc.analysis.formprog.Env`). Its value is the Evaluator's, array for array: positions'
values are the same numpy operations on the same int64 arrays, and an integer computed from parameters alone is
the Evaluator's wherever it lies in int64 (no wrap-around there); one that does not (:class:`Inexact`) sends the
caller back to the Evaluator.

Conditions of other nodes (division and remainder, which the Evaluator checks, bit operations, tables, ``same``,
k) are not compiled (:func:`program_of` gives None).
"""
from __future__ import annotations

import operator
from typing import Callable

import numpy as np

from maskc import ir
from maskc.analysis.formprog import Env
from maskc.analysis.interpret import COMPARE
from maskc.analysis.rows import segment_attr

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1

# A step: (values so far, env) -> a Python int or bool, or a numpy array over the positions
Step = Callable[[list, Env], object]


class Inexact(Exception):
    """An integer of parameters alone past int64: the Evaluator's numpy scalars would wrap where Python's do not."""


class Unsupported(Exception):
    """A node this module does not compile."""


def _checked(value):
    """A Python integer in int64, else :class:`Inexact` (arrays as they are)."""
    if type(value) is int and not INT64_MIN <= value <= INT64_MAX:
        raise Inexact(value)
    return value


_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul}


class CondProgram:
    """The steps of one condition (see the module docstring); :meth:`run` gives its truth at positions ``env.q``:
    a bool or a bool array (a condition free of the positions gives one value)."""

    def __init__(self, cond: ir.Cond):
        self.steps: list[Step] = []
        self._index: dict = {}
        self.result = self._cond(cond)

    def run(self, env: Env):
        values: list = []
        for step in self.steps:
            values.append(step(values, env))
        return values[self.result]

    def _add(self, node, make: Callable[[], Step]) -> int:
        hit = self._index.get(node)
        if hit is None:
            step = make()                 # children first: their steps come before this one
            hit = self._index[node] = len(self.steps)
            self.steps.append(step)
        return hit

    def _int(self, e: ir.IntExpr) -> int:
        return self._add(e, lambda: self._int_step(e))

    def _int_step(self, e: ir.IntExpr) -> Step:
        if isinstance(e, ir.Const):
            value = _checked(int(e.value))
            return lambda v, env: value
        if isinstance(e, ir.Pos):
            if e.which != "q":
                raise Unsupported(e)
            return lambda v, env: env.q
        if isinstance(e, ir.Builtin):
            name = e.name
            return lambda v, env: env.builtins[name]
        if isinstance(e, ir.ParamRef):
            name = e.name
            return lambda v, env: _checked(env.params.int(name))
        if isinstance(e, (ir.SegAttr, ir.SegValue)):
            if e.pos != "q":
                raise Unsupported(e)
            seg = e.seg
            attr, array = ("value", e.array) if isinstance(e, ir.SegValue) else (e.attr, None)

            def segment(v, env):
                table, at = env.slot(seg)
                return segment_attr(table, at, attr, env.extent, array)
            return segment
        if isinstance(e, ir.Arith) and e.op in _ARITH:
            i, j, op = self._int(e.left), self._int(e.right), _ARITH[e.op]
            return lambda v, env: _checked(op(v[i], v[j]))
        if isinstance(e, ir.Func):
            args = [self._int(a) for a in e.args]
            if e.fn == "abs":
                i = args[0]
                return lambda v, env: _checked(abs(v[i])) if type(v[i]) is int else np.abs(v[i])
            smaller = e.fn == "min"

            def extreme(v, env):
                out = v[args[0]]
                for i in args[1:]:
                    x = v[i]
                    if type(out) is int and type(x) is int:
                        out = min(out, x) if smaller else max(out, x)
                    else:
                        out = np.minimum(out, x) if smaller else np.maximum(out, x)
                return out
            return extreme
        raise Unsupported(e)

    def _cond(self, c: ir.Cond) -> int:
        return self._add(c, lambda: self._cond_step(c))

    def _cond_step(self, c: ir.Cond) -> Step:
        if isinstance(c, ir.Truth):
            value = bool(c.value)
            return lambda v, env: value
        if isinstance(c, ir.Cmp):
            i, j, op = self._int(c.left), self._int(c.right), COMPARE[c.op]
            return lambda v, env: op(v[i], v[j])
        if isinstance(c, ir.Negate):
            i = self._cond(c.item)
            return lambda v, env: not v[i] if type(v[i]) is bool else ~v[i]
        if isinstance(c, (ir.All, ir.Any_)):
            parts = [self._cond(item) for item in c.items]
            both, scalar_op = (operator.and_, all) if isinstance(c, ir.All) else (operator.or_, any)

            def joined(v, env):
                found = [v[i] for i in parts]
                if all(type(x) is bool for x in found):
                    return scalar_op(found)
                out = found[0]
                for x in found[1:]:
                    out = both(out, x)
                return out
            return joined
        raise Unsupported(c)


def program_of(cond: ir.Cond) -> CondProgram | None:
    """The condition's program, made on the first call and kept on it (immutable), None where it has a node
    this module does not compile."""
    def compiled() -> CondProgram | None:
        try:
            return CondProgram(cond)
        except Unsupported:
            return None
    return ir.kept_on(cond, "_cond_program", compiled)
