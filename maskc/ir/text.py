"""IR nodes as .mask text: leaves (positions, built-ins, parameters, segment attributes and arrays), and
resolved integer expressions and conditions parenthesized by Python's precedence. Error messages, ``maskc
explain`` and reprs print expressions with these."""
from __future__ import annotations

from maskc import ir

_OPS = {"|": 1, "^": 2, "&": 3, "<<": 4, ">>": 4, "+": 5, "-": 5, "*": 6, "//": 6, "%": 6}    # Python's
_UNARY = 7


def leaf_text(t) -> str | None:
    """A leaf (a position, builtin, parameter, segment attribute or per-segment value) as .mask text, in
    terms and in resolved expressions alike; None for anything else."""
    if isinstance(t, ir.Pos):
        return t.which
    if isinstance(t, (ir.Builtin, ir.ParamRef)):
        return t.name
    if isinstance(t, ir.SegAttr):
        return f"{t.seg}.{t.attr}({t.pos})"
    if isinstance(t, ir.SegValue):
        return f"{t.array}({t.pos})"
    return None


def expr_text(e: ir.IntExpr, outer: int = 0) -> str:
    """An integer expression in .mask syntax, parenthesized only where precedence needs it."""
    if isinstance(e, ir.Const):
        return str(e.value)
    leaf = leaf_text(e)
    if leaf is not None:
        return leaf
    if isinstance(e, ir.TableAt):
        return f"{e.table}[{', '.join(expr_text(i) for i in e.indices)}]"
    if isinstance(e, ir.Func):
        return f"{e.fn}({', '.join(expr_text(a) for a in e.args)})"
    if isinstance(e, ir.Arith):
        if e.op == "-" and isinstance(e.left, ir.Const) and e.left.value == 0:
            return f"-{expr_text(e.right, _UNARY)}"
        prec = _OPS[e.op]
        text = f"{expr_text(e.left, prec)} {e.op} {expr_text(e.right, prec + 1)}"
        return f"({text})" if prec < outer else text
    return repr(e)


def cond_text(c: ir.Cond, outer: str = "") -> str:
    """A condition in .mask syntax (``and``/``or``/``not``, comparisons, ``same``)."""
    if isinstance(c, ir.Truth):
        return "true" if c.value else "false"
    if isinstance(c, ir.Cmp):
        return f"{expr_text(c.left)} {c.op} {expr_text(c.right)}"
    if isinstance(c, ir.Same):
        return f"same({c.seg}{'' if c.key_seg is None else ', ' + c.key_seg})"
    if isinstance(c, ir.Negate):
        return f"not ({cond_text(c.item)})"
    op = "and" if isinstance(c, ir.All) else "or"
    text = f" {op} ".join(cond_text(i, op) for i in c.items)
    return f"({text})" if outer and outer != op else text
