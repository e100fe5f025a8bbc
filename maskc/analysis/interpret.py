"""One interpreter of the resolved IR: integer expressions, conditions, a mask's visibility and its score
modifier, each node's meaning written once, here, over a backend's primitive operations.

A backend subclasses :class:`Interpreter` and supplies how its values are made and combined:

- numpy int64 arrays for the dense reference (:class:`maskc.analysis.evaluate.Evaluator`, behind ``dense()``),
- numpy float64 dual numbers, a value and its derivative in the incoming score, for the score modifier's
  reference (:class:`maskc.analysis.score.ScoreEvaluator`),
- torch tensors for FlexAttention's ``mask_mod`` and ``score_mod`` (:mod:`maskc.flex`).

A new expression node is added in :meth:`Interpreter.int`, :meth:`~Interpreter.cond` or
:meth:`~Interpreter.score`, with a new primitive in each backend only where the Python operators below do not
already say what it computes. Positions q and k are the backend's values, broadcast against each other
(``q[:, None]`` and ``k[None, :]`` for a dense block); a position may be None where the expression does not read
it (bind evaluates parameter expressions with neither).
"""
from __future__ import annotations

import operator

from maskc import ir

ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv, "%": operator.mod,
         "&": operator.and_, "|": operator.or_, "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift}
"""Integer operations as Python computes them (floored division, two's complement bits), on numbers, numpy
arrays and torch tensors alike."""
COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}
FLOAT_ARITH = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


class Interpreter:
    """The walk over resolved expressions of ``mask``; subclasses supply the primitives (see the module
    docstring). Methods that raise NotImplementedError are what every backend of that part must supply."""

    mask: ir.ResolvedMask

    # -- the walk: one case per node ------------------------------------------------------------
    def int(self, e: ir.IntExpr, q, k):
        """The value of an integer expression at positions q and k."""
        if isinstance(e, ir.Const):
            return self.const(e.value)
        if isinstance(e, ir.Pos):
            return q if e.which == "q" else k
        if isinstance(e, ir.Builtin):
            return self.builtin(e.name)
        if isinstance(e, ir.ParamRef):
            return self.param(e.name)
        if isinstance(e, ir.SegAttr):
            return self.segment(e.seg, e.attr, q if e.pos == "q" else k)
        if isinstance(e, ir.SegValue):
            return self.segment(e.seg, "value:" + e.array, q if e.pos == "q" else k)
        if isinstance(e, ir.TableAt):
            return self.table(e, [self.int(i, q, k) for i in e.indices], q, k)
        if isinstance(e, ir.Func):
            args = [self.int(a, q, k) for a in e.args]
            if e.fn == "abs":
                return self.absolute(args[0])
            out = args[0]
            for a in args[1:]:
                out = self.minimum(out, a) if e.fn == "min" else self.maximum(out, a)
            return out
        if isinstance(e, ir.Arith):
            return self.arith(e, self.int(e.left, q, k), self.int(e.right, q, k))
        raise TypeError(e)

    def cond(self, c: ir.Cond, q, k):
        """The truth of a condition at positions q and k."""
        if isinstance(c, ir.Truth):
            return self.truth(c.value, q, k)
        if isinstance(c, ir.Cmp):
            return self.compare(c.op, self.int(c.left, q, k), self.int(c.right, q, k))
        if isinstance(c, ir.Same):             # outside the segments' range, the index is -1: never the same
            iq, ik = self.segment(c.seg, "index", q), self.segment(c.k_seg, "index", k)
            return (iq >= 0) & (iq == ik)
        if isinstance(c, ir.Negate):
            return ~self.boolean(self.cond(c.item, q, k))
        if isinstance(c, (ir.All, ir.Any_)):
            parts = [self.boolean(self.cond(i, q, k)) for i in c.items]
            out = parts[0]
            for p in parts[1:]:
                out = (out & p) if isinstance(c, ir.All) else (out | p)
            return out
        raise TypeError(c)

    def visible(self, q, k):
        """The mask at positions q and k: any allow rule and no deny rule holds (``require`` checks are bind's)."""
        allow = self.any_of((self.cond(r.cond, q, k) for r in self.mask.rules if r.kind == "allow"), q, k)
        deny = self.any_of((self.cond(r.cond, q, k) for r in self.mask.rules if r.kind == "deny"), q, k)
        return allow if deny is None else allow & ~deny

    def score(self, e: ir.ScoreExpr, x, q, k):
        """The score modifier's expression ``e`` for the incoming scaled score ``x`` at positions q and k."""
        if isinstance(e, ir.ScoreIn):
            return self.score_in(x)
        if isinstance(e, ir.FloatConst):
            return self.float_const(e.value, x)
        if isinstance(e, ir.FloatParam):
            return self.float_param(e.name, x)
        if isinstance(e, ir.FloatAt):
            return self.float_at(e.table, self.int(e.index, q, k), x)
        if isinstance(e, ir.ToFloat):           # computed as an integer, then rounded
            return self.to_float(self.int(e.value, q, k), x)
        if isinstance(e, ir.FArith):
            return self.farith(e.op, self.score(e.left, x, q, k), self.score(e.right, x, q, k))
        if isinstance(e, ir.FCall):
            return self.fcall(e.fn, [self.score(a, x, q, k) for a in e.args])
        raise TypeError(e)

    # -- integer leaves: every backend ----------------------------------------------------------
    def builtin(self, name: str):
        """seq_len, kv_len, h or b."""
        raise NotImplementedError

    def param(self, name: str):
        """An int parameter's value."""
        raise NotImplementedError

    def segment(self, seg: str, attr: str, positions):
        """``attr`` (index, start, end, length, or ``value:<array>``) of the segment of ``seg`` holding each
        position; index -1 and array value 0 outside the segments' range."""
        raise NotImplementedError

    def table(self, e: ir.TableAt, indices: list, q, k):
        """The entry of table ``e.table`` at ``indices`` (one per dimension; ``e.strides`` are row-major)."""
        raise NotImplementedError

    def minimum(self, a, b):
        raise NotImplementedError

    def maximum(self, a, b):
        raise NotImplementedError

    def truth(self, value: bool, q, k):
        """A constant condition."""
        raise NotImplementedError

    # -- integer operations and conditions: Python's operators unless a backend says otherwise --
    def const(self, value):
        return value

    def absolute(self, a):
        return abs(a)

    def arith(self, e: ir.Arith, a, b):
        return ARITH[e.op](a, b)

    def compare(self, op: str, a, b):
        return COMPARE[op](a, b)

    def boolean(self, value):
        """A condition's value as the operand of ``~``, ``&`` and ``|``."""
        return value

    def any_of(self, values, q, k):
        """The union of conditions; None when there are none."""
        out = None
        for v in values:
            out = v if out is None else out | v
        return out

    # -- score modifiers: every backend that evaluates them -------------------------------------
    def score_in(self, x):
        raise NotImplementedError

    def float_const(self, value: float, x):
        raise NotImplementedError

    def float_param(self, name: str, x):
        raise NotImplementedError

    def float_at(self, table: str, index, x):
        """A float table's entry at ``index`` clamped into the table (its nearest entry outside it)."""
        raise NotImplementedError

    def to_float(self, value, x):
        raise NotImplementedError

    def farith(self, op: str, a, b):
        return FLOAT_ARITH[op](a, b)

    def fcall(self, fn: str, args: list):
        """``tanh(x)`` or ``softcap(x, cap) = cap * tanh(x / cap)``."""
        raise NotImplementedError
