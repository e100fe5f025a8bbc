"""Resolve, score modifiers: a mask's ``score = ...`` statements → one :class:`~maskc.ir.ScoreMod`.

Invariant: the result is one float expression (``ir.ScoreExpr``) of the incoming score (``ScoreIn``), float
literals, float parameters (``FloatParam``; ``FloatAt`` for float tables, a ``float per h`` at h) and integer
expressions (``ToFloat``, computed exactly as integers, then rounded), composed with ``+ - * /``,
``softcap(x, cap)`` and ``tanh(x)``. Statements are composed in source order: in the second, ``score`` is the
value of the first. Nothing on the right of ``/`` and no ``cap`` reads the score (the gradient stays a product
of per-node factors); a right side of ``/`` that reads no parameter is not 0 at any q, k up to POSITION_SLACK
(h = b = 0), hidden pairs included (the rest is bind's); a ``cap`` reads neither q nor k and, where it is a number, is positive (one that reads
parameters is checked at bind: :func:`maskc.analysis.score.check_score`); integer parts read positions, lengths, h, b, int parameters and per-head int
parameters, not segments nor other tables. A sub-expression is integer when it has no float literal, no float
parameter, no ``score``, no ``/`` and no float function: ``(q - k) // 2`` floors as in the mask rules.
"""
from __future__ import annotations

import math

from maskc import ir
from maskc.analysis import linear
from maskc.analysis.score import DIVISOR_HINT, integer_parts, zero_of_divisor
from maskc.errors import MaskNameError, MaskTypeError, did_you_mean
from maskc.frontend.scope import Let
from maskc.ir.walk import depends_on_position, nodes

SCORE_NAME = "score"
FUNCTIONS = {"softcap": 2, "tanh": 1}
"""Float functions of score modifiers and their arity: ``softcap(x, cap) = cap * tanh(x / cap)``."""


def _reads_score(expr) -> bool:
    if isinstance(expr, ir.ScoreIn):
        return True
    if isinstance(expr, ir.FArith):
        return _reads_score(expr.left) or _reads_score(expr.right)
    if isinstance(expr, ir.FCall):
        return any(_reads_score(a) for a in expr.args)
    return False


class _ScoreResolver:
    """One statement's right-hand side, with ``score`` standing for ``previous``."""

    def __init__(self, resolver, file, previous: ir.ScoreExpr):
        self.resolver, self.file, self.previous = resolver, file, previous

    def floatish(self, node, scope) -> bool:
        """Whether the syntax ``node`` computes a float (see the module docstring)."""
        if isinstance(node, ir.FloatNum):
            return True
        if isinstance(node, ir.Name):
            if node.id == SCORE_NAME:
                return True
            bound = scope.lookup(node.id)
            if isinstance(bound, ir.Param):
                return bound.kind in ir.FLOAT_KINDS
            if isinstance(bound, Let) and not bound.args:
                return self.floatish(bound.value, bound.scope)
            return False
        if isinstance(node, ir.Subscript):
            bound = scope.lookup(node.table)
            return isinstance(bound, ir.Param) and bound.kind == "float_table"
        if isinstance(node, ir.BinOp) and node.op == "/":
            return True
        if isinstance(node, ir.Call) and node.func in FUNCTIONS and scope.lookup(node.func) is None:
            return True
        children = {ir.BinOp: lambda n: (n.left, n.right), ir.UnaryMinus: lambda n: (n.operand,),
                    ir.Invert: lambda n: (n.operand,), ir.Call: lambda n: tuple(a.value for a in n.args)}
        get = children.get(type(node))
        return get is not None and any(self.floatish(c, scope) for c in get(node))

    def value(self, node, scope) -> ir.ScoreExpr:
        if not self.floatish(node, scope):
            return ir.ToFloat(self.integer(node, scope), node.span)
        if isinstance(node, ir.FloatNum):
            return ir.FloatConst(float32_literal(node.value, node.span), node.span)
        if isinstance(node, ir.Name):
            if node.id == SCORE_NAME:
                return self.previous
            bound = scope.lookup(node.id)
            if isinstance(bound, Let):
                return self.value(bound.value, bound.scope)
            if bound.kind == "float":
                return ir.FloatParam(bound.name, node.span)
            if bound.of == "h":
                return ir.FloatAt(bound.name, ir.Builtin("h", node.span), node.span)
            raise MaskTypeError(f"'{node.id}' is a float table, not a number", node.span,
                                f"read an entry: {node.id}[i]")
        if isinstance(node, ir.Subscript):
            if len(node.indices) != 1:
                raise MaskTypeError(f"float table '{node.table}' takes one index, got {len(node.indices)}", node.span)
            return ir.FloatAt(node.table, self.integer(node.indices[0], scope), node.span)
        if isinstance(node, ir.UnaryMinus):
            return ir.FArith("-", ir.FloatConst(0.0, node.span), self.value(node.operand, scope), node.span)
        if isinstance(node, ir.BinOp):
            if node.op not in ("+", "-", "*", "/"):
                raise MaskTypeError(f"'{node.op}' takes integers; this side computes a float", node.span,
                                    "score modifiers combine floats with + - * / and softcap(), tanh()")
            left, right = self.value(node.left, scope), self.value(node.right, scope)
            if node.op == "/" and _reads_score(right):
                raise MaskTypeError("the right side of '/' cannot read the score", node.right.span,
                                    "divide by a number or a parameter")
            if node.op == "/" and _number(right) == 0:
                # a float division by 0 gives inf or NaN on every pair: an error where it is written
                raise MaskTypeError("division by zero: the right side of '/' is 0", node.right.span)
            zero = zero_of_divisor(right) if node.op == "/" else None
            if zero is not None:
                # 0 at a pair every binding computes (hidden or not): inf or NaN there, in the backward too
                where = ", ".join(f"{name} = {value}" for name, value in zero.items())
                raise MaskTypeError(f"division by zero: the right side of '/' is 0 at {where}", node.right.span,
                                    DIVISOR_HINT if "q" in zero or "k" in zero else None)
            return ir.FArith(node.op, left, right, node.span)
        if isinstance(node, ir.Call) and node.func in FUNCTIONS:
            named = next((a for a in node.args if a.name), None)
            if named is not None:
                raise MaskTypeError(f"{node.func}() takes no keyword arguments", named.span)
            if len(node.args) != FUNCTIONS[node.func]:
                raise MaskTypeError(f"{node.func}() takes {FUNCTIONS[node.func]} argument(s), got {len(node.args)}",
                                    node.span, "softcap(score, cap) is cap * tanh(score / cap)")
            args = tuple(self.value(a.value, scope) for a in node.args)
            if node.func == "softcap":
                _check_cap(args[1], node.args[1].span)
            return ir.FCall(node.func, args, node.span)
        raise MaskTypeError("a score modifier computes a number here, not a condition or a call", node.span,
                            "e.g. 'score = softcap(score, 30.0)' or 'score = score - slope * (q - k)'")

    def integer(self, node, scope) -> ir.IntExpr:
        out = self.resolver.integer(node, scope, self.file)
        for n in nodes(out):
            if isinstance(n, ir.Arith) and n.op in ir.BIT_OPS:
                raise MaskTypeError(f"score modifiers do not compute bit operations ('{n.op}')", n.span)
            if isinstance(n, (ir.SegAttr, ir.SegValue)) or (isinstance(n, ir.TableAt) and not _per_head(n)):
                what = "segments" if isinstance(n, (ir.SegAttr, ir.SegValue)) else "int tables (at other than h)"
                raise MaskTypeError(f"score modifiers do not read {what}", n.span,
                                    "they read q, k, h, b, seq_len, kv_len, int and float parameters and "
                                    "float tables")
        return out


CAP_HINT = "softcap(x, cap) is cap * tanh(x / cap): it bounds x to (-cap, cap), so cap is positive"


def _check_cap(cap: ir.ScoreExpr, span) -> None:
    """softcap's cap: free of the score, q and k (one value per head at most: the kernels divide by it once), and
    positive where it is a number. One that reads parameters is checked when they are known (at bind)."""
    if _reads_score(cap):
        raise MaskTypeError("softcap's cap cannot read the score", span)
    if any(depends_on_position(part) for part in integer_parts(cap)):
        raise MaskTypeError("softcap's cap cannot depend on q or k", span,
                            "cap with a number or a parameter (a 'float per h' for one cap per head)")
    value = _number(cap)
    if value is not None and not value > 0:
        raise MaskTypeError(f"softcap's cap is {value}; a cap must be positive", span, CAP_HINT)


def _number(e: ir.ScoreExpr) -> float | None:
    """The value of a float expression of numbers alone (None where it reads anything else, or divides by 0)."""
    if isinstance(e, ir.FloatConst):
        return e.value
    if isinstance(e, ir.ToFloat):
        lin = linear.from_expr(e.value)
        return float(lin.const) if linear.is_const(lin) else None
    if isinstance(e, ir.FArith):
        a, b = _number(e.left), _number(e.right)
        if a is None or b is None or (e.op == "/" and b == 0):
            return None
        return {"+": a + b, "-": a - b, "*": a * b}[e.op] if e.op != "/" else a / b
    if isinstance(e, ir.FCall):
        values = [_number(a) for a in e.args]
        args = [v for v in values if v is not None]
        if len(args) < len(values) or (e.fn == "softcap" and not args[1] > 0):
            return None
        return math.tanh(args[0]) if e.fn == "tanh" else args[1] * math.tanh(args[0] / args[1])
    return None


def _per_head(read: ir.TableAt) -> bool:
    """A per-head int parameter's read (``w`` for ``w: per h``): its only index is h."""
    return len(read.indices) == 1 and isinstance(read.indices[0], ir.Builtin) and read.indices[0].name == "h"


def resolve_score(resolver, decl: ir.MaskDecl, scope, file) -> ir.ScoreMod | None:
    """The mask's score modifier (see the module docstring), or None when it has no ``score`` statement."""
    if not decl.scores:
        return None
    taken = scope.lookup(SCORE_NAME)
    if taken is not None:
        raise MaskNameError(f"'{SCORE_NAME}' names the score in a score modifier; this mask also declares it",
                            getattr(taken, "span", None) or decl.scores[0].span, "rename the parameter or let")
    expr: ir.ScoreExpr = ir.ScoreIn(decl.scores[0].span)
    for stmt in decl.scores:
        expr = _ScoreResolver(resolver, file, expr).value(stmt.value, scope)
    return ir.ScoreMod(expr, decl.scores[0].span)


def float_param(resolver, p: ir.ParamDecl, scope) -> ir.Param:
    """A float parameter's declaration: ``x: float [= 1.5]``, ``s: float per h [= 0.5]``, ``t: float table``."""
    if p.kind == "float_table" and p.of not in (None, "h"):
        raise MaskNameError(f"'float per {p.of}': float parameters are one value, one per head ('float per h') "
                            "or a table ('float table')", p.span, did_you_mean(p.of or "", ["h"]))
    default = None
    if p.default is not None:
        if p.kind == "float_table" and p.of is None:
            raise MaskTypeError("a float table takes no default (its length is its value's)", p.default.span)
        default = float_constant(p.default)
    return ir.Param(p.name, p.kind, default, of=p.of, span=p.span)


FLOAT32_MAX = 3.4028234663852886e38


def float32_literal(value: float, span) -> float:
    """A float literal of the score section, which the kernels compute in float32: one past its range would be
    inf there (and NaN after the softmax), so it is refused where it is written, as bind refuses such a value."""
    if not math.isfinite(value) or abs(value) > FLOAT32_MAX:
        raise MaskTypeError(f"{value!r} is outside float32's range, in which the kernels compute scores", span,
                            f"keep constants within +-{FLOAT32_MAX:.4g}")
    return value


def float_constant(node) -> float:
    """A float default: a literal, optionally negated (within float32's range)."""
    sign = 1.0
    while isinstance(node, ir.UnaryMinus):
        sign, node = -sign, node.operand
    if isinstance(node, (ir.FloatNum, ir.Num)):
        return sign * float32_literal(float(node.value), node.span)
    raise MaskTypeError("a float default must be a number", node.span, "e.g. 'cap: float = 30.0'")
