"""Integer linear forms (:class:`~maskc.ir.Lin`): building them from expressions, and their algebra (what a
form reads, and how it prints: :mod:`maskc.analysis.forms`).

A ``Lin`` is canonical: terms sorted by a fixed key, no zero coefficients, and non-linear terms built
by smart constructors that fold constants. Two expressions that are equal as integer polynomials in
their terms therefore give equal ``Lin`` values, which is what lets normalize spot duplicate and
contradictory atoms.
"""
from __future__ import annotations

import functools
import math

from maskc import ir
from maskc.analysis.forms import inner_lins
from maskc.errors import ComplexityError

ZERO = ir.Lin((), 0)


@functools.lru_cache(maxsize=None)
def _term_key(term) -> str:
    return repr(term)


def const(value: int) -> ir.Lin:
    return ir.Lin((), int(value))


_INTERNED: dict = {}


def intern(term):
    """One object per distinct term, so memo lookups on terms hit by identity, not deep equality."""
    return _INTERNED.setdefault(term, term)


def of_term(term) -> ir.Lin:
    return ir.Lin(((intern(term), 1),), 0)


def is_const(lin: ir.Lin) -> bool:
    return not lin.terms


def add(a: ir.Lin, b: ir.Lin, scale_b: int = 1) -> ir.Lin:
    coefs: dict = dict(a.terms)
    for t, c in b.terms:
        coefs[t] = coefs.get(t, 0) + scale_b * c
    terms = tuple(sorted(((t, c) for t, c in coefs.items() if c), key=lambda tc: _term_key(tc[0])))
    return ir.Lin(terms, a.const + scale_b * b.const)


def scale(a: ir.Lin, factor: int) -> ir.Lin:
    if factor == 0:
        return ZERO
    return ir.Lin(tuple((t, c * factor) for t, c in a.terms), a.const * factor)


def sub(a: ir.Lin, b: ir.Lin) -> ir.Lin:
    return add(a, b, -1)


MAX_TERM_NODES = 2_000
"""The largest non-linear term, in nodes written out as a tree. ``abs(x)`` is ``max(x, -x)``: each
``abs`` around another doubles the term, so 108 bytes of nested ``abs`` made terms of millions of nodes."""


def term_size(term) -> int:
    """Nodes in ``term`` written out as a tree (leaves count 1); cached on compound terms."""
    inner = inner_lins(term)
    if not inner:
        return 1
    return ir.kept_on(term, "_size", lambda: 1 + sum(lin_size(lin) for lin in inner))


def lin_size(lin: ir.Lin) -> int:
    return 1 + sum(term_size(t) for t, _ in lin.terms)


def _compound(term) -> ir.Lin:
    """A non-linear term as a form, refused past MAX_TERM_NODES (the caller adds the rule's span)."""
    if term_size(term) > MAX_TERM_NODES:
        raise ComplexityError(f"a non-linear expression grows past {MAX_TERM_NODES} nodes once written out",
                              hint="abs(x) is max(x, -x), so each abs around another doubles the expression; "
                                   "name parts with 'let', or split the rule")
    return of_term(term)


def mul(a: ir.Lin, b: ir.Lin) -> ir.Lin:
    if is_const(a):
        return scale(b, a.const)
    if is_const(b):
        return scale(a, b.const)
    if a == b:
        return _compound(ir.Square(a))
    if a == scale(b, -1):
        return scale(_compound(ir.Square(b)), -1)
    left, right = sorted((a, b), key=_term_key)
    return _compound(ir.Product(left, right))


def floor_op(op: str, num: ir.Lin, den: ir.Lin) -> ir.Lin:
    if is_const(num) and is_const(den) and den.const > 0:
        q, r = divmod(num.const, den.const)
        return const(q if op == "//" else r)
    quotient = divide(num, den)
    if quotient is not None:                # (c*x) // c == x, (c*x) % c == 0
        return quotient if op == "//" else ZERO
    inner = single_term(num)
    if (op == "//" and isinstance(inner, ir.Floor) and inner.op == "//" and is_const(inner.den) and is_const(den)
            and inner.den.const > 0 and den.const > 0):     # (x // a) // b == x // (a*b): x >> 1 >> 5 is x >> 6
        return floor_op("//", inner.num, const(inner.den.const * den.const))
    if is_const(den) and den.const > 0:
        split = _bounded_split(num, den.const, remainder=op == "%")
        if split is not None:
            return split
    return _compound(ir.Floor(op, num, den))


def term_range(term) -> tuple[int, int] | None:
    """(lowest, highest) value of a term for every value of what it reads, where its form alone bounds it: a
    ``% d`` by a constant ``d > 0`` lies in [0, d - 1], a ``// d`` of a bounded form between the floors of its
    bounds; None for any other term."""
    if not isinstance(term, ir.Floor) or not is_const(term.den) or term.den.const <= 0:
        return None
    d = term.den.const
    if term.op == "%":
        return 0, d - 1
    inner = lin_range(term.num)
    return None if inner is None else (inner[0] // d, inner[1] // d)


def lin_range(lin: ir.Lin) -> tuple[int, int] | None:
    """(lowest, highest) value of a form whose every term :func:`term_range` bounds, else None."""
    lo = hi = lin.const
    for t, c in lin.terms:
        r = term_range(t)
        if r is None:
            return None
        lo, hi = lo + min(c * r[0], c * r[1]), hi + max(c * r[0], c * r[1])
    return lo, hi


def _bounded_split(num: ir.Lin, d: int, remainder: bool = False) -> ir.Lin | None:
    """``num // d`` (or ``num % d``, with ``remainder``) without the part of ``num`` that cannot change it: when
    ``num = c*A + B`` with ``c`` dividing ``d`` and the bounded rest ``B`` (terms :func:`term_range` bounds, at
    least one) within one block ``[m*c, (m+1)*c)``, then ``num // d == (A + m) // (d/c)`` and ``num % d == c *
    ((A + m) % (d/c)) + B - m*c``. The largest such ``c`` is taken; None when there is none. This is what
    turns an image position rebuilt from its row and column (``(W*y + x) // W`` with ``x = u % W``) back into
    the row (maskc.analysis.order)."""
    candidates = sorted({math.gcd(d, abs(c)) for _, c in num.terms} | {d}, reverse=True)
    for c in candidates:
        if c <= 1:
            continue
        rest = [(t, coef) for t, coef in num.terms if coef % c]
        if not rest:
            continue
        low = lin_range(ir.Lin(tuple(rest), num.const % c))
        if low is None or low[0] // c != low[1] // c:
            continue
        m = low[0] // c
        whole = ir.Lin(tuple((t, coef // c) for t, coef in num.terms if coef % c == 0), num.const // c + m)
        if not remainder:
            return whole if c == d else floor_op("//", whole, const(d // c))
        b = ir.Lin(tuple(rest), num.const % c - m * c)
        return b if c == d else add(scale(floor_op("%", whole, const(d // c)), c), b)
    return None


def _low_ones(value: int) -> int | None:
    """``n`` when ``value == 2**n - 1`` (n >= 1), else None."""
    return value.bit_length() if value > 0 and value & (value + 1) == 0 else None


_FOLD = {"&": lambda a, b: a & b, "|": lambda a, b: a | b, "^": lambda a, b: a ^ b,
         "<<": lambda a, b: a << b, ">>": lambda a, b: a >> b}


def bits(op: str, a: ir.Lin, b: ir.Lin) -> ir.Lin:
    """``a op b`` for a bit operation (:data:`~maskc.ir.BIT_OPS`), as a form where it is one: a shift by a
    constant is ``a // 2**n`` or ``a * 2**n`` (so ``>>`` gets the chunk analysis of floors); with ``m = 2**n - 1``
    and ``r = a % 2**n`` (a's low bits), ``a & m == r``, ``a & ~m == a - r``, ``a | m == a - r + m`` and
    ``a ^ m == a - 2*r + m``; constants folded; else a :class:`~maskc.ir.Bits` term (the operands of ``&``,
    ``|`` and ``^`` in canonical order). A constant shift amount outside [0, MAX_SHIFT]
    stays whole, for bind to refuse."""
    if op in ("<<", ">>"):
        if is_const(b) and 0 <= b.const <= ir.MAX_SHIFT:
            if is_const(a):
                return const(_FOLD[op](a.const, b.const))
            return scale(a, 2 ** b.const) if op == "<<" else floor_op("//", a, const(2 ** b.const))
        return _compound(ir.Bits(op, a, b))
    if is_const(a) and is_const(b):
        return const(_FOLD[op](a.const, b.const))
    if is_const(a):
        a, b = b, a                               # the constant, if any, on the right
    if is_const(b):
        m = b.const
        if op == "&" and m == 0 or op == "|" and m == -1:
            return b
        if op in ("|", "^") and m == 0 or op == "&" and m == -1:
            return a
        if op == "^" and m == -1:
            return sub(const(-1), a)
        n = (_low_ones(m) or _low_ones(-m - 1)) if op == "&" else _low_ones(m)
        if n is not None:
            low = floor_op("%", a, const(2 ** n))
            if op == "&":
                return low if m > 0 else sub(a, low)
            return add(add(a, low, -1 if op == "|" else -2), const(m))
    elif a == b:
        return ZERO if op == "^" else a
    else:
        a, b = sorted((a, b), key=_term_key)
    return _compound(ir.Bits(op, a, b))


def lookup(table: str, index: ir.Lin) -> ir.Lin:
    """``table[index]``: an entry of a table parameter."""
    return _compound(ir.Lookup(table, index))


def seg_bound(seg: str, index: ir.Lin) -> ir.Lin:
    """Where segment ``index`` of ``seg`` starts (its bounds at the index clipped into [0, n])."""
    return _compound(ir.SegBound(seg, index))


def root(arg: ir.Lin) -> ir.Lin:
    """``isqrt(arg)``, folded for a constant ``arg >= 0``."""
    if is_const(arg) and arg.const >= 0:
        return const(math.isqrt(arg.const))
    return _compound(ir.Root(arg))


def divide(a: ir.Lin, c: ir.Lin) -> ir.Lin | None:
    """``a / c`` as a form when ``c`` divides ``a`` on its face (integer coefficients, or every term of ``a``
    a multiple of the single term ``c``), else None. ``divide(a, c) * c == a`` for every value."""
    if is_const(c):
        n = c.const
        if n and a.const % n == 0 and all(coef % n == 0 for _, coef in a.terms):
            return ir.Lin(tuple((t, coef // n) for t, coef in a.terms), a.const // n)
        return None
    if a == c:
        return const(1)
    factor = single_term(c)
    if factor is None or a.const:
        return None
    out = ZERO
    for t, coef in a.terms:
        if t == factor:
            out = add(out, const(coef))
        elif isinstance(t, ir.Product) and c in (t.left, t.right):
            out = add(out, scale(t.right if t.left == c else t.left, coef))
        elif isinstance(t, ir.Square) and t.base == c:
            out = add(out, scale(c, coef))
        else:
            return None
    return out


def extreme(fn: str, args) -> ir.Lin:
    """min/max of linear forms (abs is max(x, -x)); flattened, deduplicated, constants folded."""
    if fn == "abs":
        (x,) = args
        return extreme("max", (x, scale(x, -1)))
    flat: list[ir.Lin] = []
    for a in args:
        inner = single_term(a)
        if isinstance(inner, ir.Extreme) and inner.fn == fn:
            flat.extend(inner.args)
        else:
            flat.append(a)
    consts = [a.const for a in flat if is_const(a)]
    rest = sorted({a for a in flat if not is_const(a)}, key=_term_key)
    if consts:
        rest.append(const(max(consts) if fn == "max" else min(consts)))
    if len(rest) == 1:
        return rest[0]
    return _compound(ir.Extreme(fn, tuple(rest)))


def single_term(lin: ir.Lin):
    """The term of ``lin`` when it is exactly one term with coefficient 1, else None."""
    if lin.const == 0 and len(lin.terms) == 1 and lin.terms[0][1] == 1:
        return lin.terms[0][0]
    return None


def from_expr(expr: ir.IntExpr) -> ir.Lin:
    """The canonical linear form of a resolved integer expression."""
    if isinstance(expr, ir.Const):
        return const(expr.value)
    if isinstance(expr, (ir.Pos, ir.Builtin, ir.ParamRef, ir.SegAttr, ir.SegValue)):
        return of_term(_strip(expr))
    if isinstance(expr, ir.TableAt):          # several indices: the row-major one
        flat = ZERO
        for index, stride in zip(expr.indices, expr.strides):
            flat = add(flat, mul(from_expr(index), from_expr(stride)))
        return lookup(expr.table, flat)
    if isinstance(expr, ir.Arith):
        a, b = from_expr(expr.left), from_expr(expr.right)
        if expr.op in ir.BIT_OPS:
            return bits(expr.op, a, b)
        if expr.op == "+":
            return add(a, b)
        if expr.op == "-":
            return sub(a, b)
        if expr.op == "*":
            return mul(a, b)
        return floor_op(expr.op, a, b)
    if isinstance(expr, ir.Func):
        return extreme(expr.fn, tuple(from_expr(a) for a in expr.args))
    raise TypeError(f"not an integer expression: {expr!r}")


def _strip(leaf):
    """Leaves without spans, so that terms hash and print the same wherever they were written."""
    from dataclasses import replace

    from maskc.errors import NO_SPAN
    return replace(leaf, span=NO_SPAN)


def substitute(lin: ir.Lin, mapping, memo: dict | None = None) -> ir.Lin:
    """Replace terms (at any depth) by linear forms: ``mapping(term)`` returns a Lin or None. ``memo`` (a dict
    kept by the caller for one ``mapping``) remembers each term's result, for forms that share terms."""
    out = const(lin.const)
    for t, c in lin.terms:
        out = add(out, scale(_substitute_term(t, mapping, memo), c))
    return out


def _substitute_term(term, mapping, memo: dict | None = None) -> ir.Lin:
    if memo is not None:
        hit = memo.get(term)
        if hit is None:
            hit = memo[term] = _substituted(term, mapping, memo)
        return hit
    return _substituted(term, mapping, None)


def _substituted(term, mapping, memo: dict | None) -> ir.Lin:
    replaced = mapping(term)
    if replaced is not None:
        return replaced
    if isinstance(term, ir.Square):
        base = substitute(term.base, mapping, memo)
        return mul(base, base)
    if isinstance(term, ir.Product):
        return mul(substitute(term.left, mapping, memo), substitute(term.right, mapping, memo))
    if isinstance(term, ir.Floor):
        return floor_op(term.op, substitute(term.num, mapping, memo), substitute(term.den, mapping, memo))
    if isinstance(term, ir.Extreme):
        return extreme(term.fn, tuple(substitute(a, mapping, memo) for a in term.args))
    if isinstance(term, ir.Root):
        return root(substitute(term.arg, mapping, memo))
    if isinstance(term, ir.Bits):
        return bits(term.op, substitute(term.left, mapping, memo), substitute(term.right, mapping, memo))
    if isinstance(term, ir.Lookup):
        return lookup(term.table, substitute(term.index, mapping, memo))
    if isinstance(term, ir.SegBound):
        return seg_bound(term.seg, substitute(term.index, mapping, memo))
    return of_term(term)


def reduce_atom(lin: ir.Lin) -> ir.Lin:
    """``lin <= 0`` divided through by the gcd of its coefficients (valid: terms are integers)."""
    if not lin.terms:
        return lin
    g = 0
    for _, c in lin.terms:
        g = math.gcd(g, abs(c))
    if g <= 1:
        return lin
    return ir.Lin(tuple((t, c // g) for t, c in lin.terms), -((-lin.const) // g))
