"""Lint's checks of what bind would refuse, made at compile time with no values at hand.

* Segments on the wrong side: segments partition the queries ``[0, seq_len)`` unless declared ``over k``
  (the keys, ``[0, kv_len)``). Segments over q that the mask reads only at k (``S.index(k)``, the second
  argument of ``same(A, S)``), or over k that it reads only at q, are almost surely declared on the wrong
  side: bind would refuse the lengths that the author means whenever seq_len != kv_len.
* Table indices outside a table's declared sizes (``t: table[n]``, ``anc: table[seq_len, seq_len]``): each
  index is bounded by linear forms of the parameters and lengths (:func:`index_bounds`: q in [0, seq_len - 1],
  k in [0, kv_len - 1], through +, -, constant multiples, //, %, min, max, abs and clamp). An index whose
  bound is not provably within ``[0, size - 1]`` (the difference a constant, possibly with a position-free
  ``require``) is reported with the bound it can reach: bind refuses every binding that makes it leave the
  table. An index that no linear form bounds (a table entry, a bit operation) is left to bind.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.ir.text import expr_text
from maskc.ir.walk import nodes

_MAX_BOUNDS = 6          # candidate bounds kept per expression


Warn = Callable[[object, str, str], None]      # (span, message, hint)


def segment_sides(mask: ir.ResolvedMask, warn: Warn) -> None:
    """Segments read only at the side they do not partition (see the module docstring)."""
    reads: dict[str, set[str]] = {p.name: set() for p in mask.params if p.kind == "segments"}
    for rule in mask.rules:
        for n in nodes(rule.cond):
            if isinstance(n, (ir.SegAttr, ir.SegValue)):
                reads[n.seg].add(n.pos)
            elif isinstance(n, ir.Same):
                reads[n.seg].add("q")
                reads[n.k_seg].add("k")
    for p in mask.params:
        if p.kind != "segments" or reads[p.name] != {"k" if p.over == "q" else "q"}:
            continue
        if p.over == "q":
            warn(p.span, f"segments '{p.name}' partition the queries [0, seq_len) but the mask reads them only at k",
                 f"to partition the keys [0, kv_len), declare '{p.name}: segments over k'")
        else:
            warn(p.span, f"segments '{p.name}' partition the keys [0, kv_len) but the mask reads them only at q",
                 f"to partition the queries [0, seq_len), declare '{p.name}: segments' (over q)")


# -- symbolic bounds -------------------------------------------------------------------------------

def _const_diff(a: ir.Lin, b: ir.Lin) -> int | None:
    d = L.sub(a, b)
    return d.const if L.is_const(d) else None


def _le(a: ir.Lin, b: ir.Lin) -> bool:
    d = _const_diff(b, a)
    return d is not None and d >= 0


def _keep(forms) -> tuple[ir.Lin, ...]:
    out: list[ir.Lin] = []
    for f in forms:
        if f not in out:
            out.append(f)
    return tuple(out[:_MAX_BOUNDS])


Bounds = tuple[tuple[ir.Lin, ...], tuple[ir.Lin, ...]]     # (lower bounds, upper bounds), each valid on its own
_LEAVES = {"q": "seq_len", "k": "kv_len"}


def index_bounds(e: ir.IntExpr) -> Bounds:
    """Linear forms of parameters and lengths that bound ``e`` from below and from above over every
    position (each one valid); empty where none is known."""
    if isinstance(e, (ir.Const, ir.ParamRef)) or (isinstance(e, ir.Builtin) and e.name in ("seq_len", "kv_len")):
        f = L.from_expr(e)
        return (f,), (f,)
    if isinstance(e, ir.Pos):
        return (L.const(0),), (L.sub(L.of_term(ir.Builtin(_LEAVES[e.which])), L.const(1)),)
    if isinstance(e, ir.Builtin):        # h, b
        return (L.const(0),), ()
    if isinstance(e, ir.SegAttr):
        return ((L.const(-1),) if e.attr == "index" else (L.const(0),)), ()
    if isinstance(e, ir.Func):
        args = [index_bounds(a) for a in e.args]
        if e.fn == "abs":
            (lo, hi), = args
            neg = (tuple(L.scale(h, -1) for h in hi), tuple(L.scale(x, -1) for x in lo))
            return _extreme("max", [(lo, hi), neg])
        return _extreme(e.fn, args)
    if isinstance(e, ir.Arith):
        (alo, ahi), (blo, bhi) = index_bounds(e.left), index_bounds(e.right)
        right = L.from_expr(e.right) if not nodes_read_positions(e.right) else None
        if e.op in ("+", "-"):
            if e.op == "-":
                blo, bhi = tuple(L.scale(h, -1) for h in bhi), tuple(L.scale(x, -1) for x in blo)
            return (_keep(L.add(a, b) for a in alo for b in blo), _keep(L.add(a, b) for a in ahi for b in bhi))
        if e.op == "*" and right is not None and L.is_const(right):
            c = right.const
            lo, hi = (alo, ahi) if c >= 0 else (ahi, alo)
            return _keep(L.scale(x, c) for x in lo), _keep(L.scale(x, c) for x in hi)
        if e.op == "//" and right is not None:      # floor by a positive divisor is non-decreasing
            return _keep(L.floor_op("//", x, right) for x in alo), _keep(L.floor_op("//", x, right) for x in ahi)
        if e.op == "%" and right is not None:
            return (L.const(0),), (L.sub(right, L.const(1)),)
        if e.op == ">>" and right is not None and L.is_const(right):
            d = L.const(2 ** right.const)
            return _keep(L.floor_op("//", x, d) for x in alo), _keep(L.floor_op("//", x, d) for x in ahi)
    return (), ()


def nodes_read_positions(e) -> bool:
    return any(isinstance(n, (ir.Pos, ir.SegAttr, ir.SegValue, ir.TableAt)) or (
        isinstance(n, ir.Builtin) and n.name in ("h", "b")) for n in nodes(e))


def _extreme(fn: str, args: list[Bounds]) -> Bounds:
    """min (max) of expressions: any upper (lower) bound of one argument bounds it; a lower (upper) bound
    needs a bound of one argument proved below (above) a bound of every other."""
    free = [f for a in args for f in (a[1] if fn == "min" else a[0])]
    tied: list[ir.Lin] = []
    for i, a in enumerate(args):
        for f in (a[0] if fn == "min" else a[1]):
            others = [o for j, o in enumerate(args) if j != i]
            if all(any((_le(f, g) if fn == "min" else _le(g, f)) for g in (o[0] if fn == "min" else o[1]))
                   for o in others):
                tied.append(f)
    return (_keep(tied), _keep(free)) if fn == "min" else (_keep(free), _keep(tied))


def _facts(mask: ir.ResolvedMask) -> list[ir.Lin]:
    """``lin <= 0`` that every binding satisfies: the position-free atoms of ``require`` checks of one region."""
    from maskc.analysis.normalize import normalize
    out: list[ir.Lin] = []
    for r in mask.requires:
        regions = normalize(replace(mask, rules=(ir.Rule("allow", r.cond, r.span),))).allow
        if len(regions) == 1:
            out += [a.lin for a in regions[0].atoms if not F.lin_mentions(
                a.lin, lambda t: isinstance(t, (ir.Pos, ir.SegAttr, ir.SegValue)) or (
                    isinstance(t, ir.Builtin) and t.name in ("h", "b")))]
    return out


def _at_most_zero(lin: ir.Lin, facts: list[ir.Lin]) -> bool:
    """Proved ``lin <= 0``: a constant, or a fact plus a constant <= 0."""
    if L.is_const(lin):
        return lin.const <= 0
    return any((c := _const_diff(lin, f)) is not None and c <= 0 for f in facts)


def table_ranges(mask: ir.ResolvedMask, warn: Warn) -> None:
    """Indices of tables with declared sizes that may leave them (see the module docstring)."""
    shapes = {p.name: p for p in mask.params if p.kind == "table" and p.shape is not None}
    facts = _facts(mask)
    seen: set = set()
    for rule in mask.rules:
        for n in nodes(rule.cond):
            if not isinstance(n, ir.TableAt) or n.table not in shapes:
                continue
            p = shapes[n.table]
            assert p.shape is not None
            indices = n.indices[1:] if p.of == "h" else n.indices        # the head's index is always in range
            for d, (index, size) in enumerate(zip(indices, p.shape)):
                key = (n.table, d, index)
                if key in seen:
                    continue
                seen.add(key)
                lo, hi = index_bounds(index)
                last = L.sub(L.from_expr(size), L.const(1))
                which = "its index" if len(indices) == 1 else ("its first index" if d == 0 else "its second index")
                text, declared = expr_text(index), ", ".join(expr_text(s) for s in p.shape)
                if hi and not any(_at_most_zero(L.sub(h, last), facts) for h in hi):
                    warn(n.span, f"{which}, {text}, can reach {F.render(hi[0])}, past the last entry "
                                 f"{F.render(last)} of '{n.table}' (declared [{declared}]): bind refuses values for "
                                 f"which {F.render(hi[0])} > {F.render(last)}",
                         f"keep it in range with clamp({text}, 0, {F.render(last)}), or state what the values "
                         "meet with 'require'")
                if lo and not any(_at_most_zero(L.scale(x, -1), facts) for x in lo):
                    warn(n.span, f"{which}, {text}, can be as low as {F.render(lo[0])}, below 0 (table "
                                 f"'{n.table}'): bind refuses values for which {F.render(lo[0])} < 0",
                         f"keep it in range with max({text}, 0), or state what the values meet with 'require'")
