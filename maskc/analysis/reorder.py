"""Pass: a mask rewritten in a token order's coordinates (:class:`~maskc.analysis.order.TokenOrder`): its rules
(:func:`reorder`, what ``dense()``, bind and Flex read) and its normal form (:func:`reorder_regions`, what the
range analysis, classification and the kernels' predicate read).

Invariant of both: for every ``seq_len`` that holds a whole band of the order (``order.applies``) and
``kv_len == seq_len``, the result's visible(i, j) equals ``mask``'s visible(raster(i), raster(j)), with
``raster = order.raster`` at that length and the const parameters at ``constants`` (every other parameter, h and b
as given). :func:`reorder` keeps ``mask``'s parameters, its ``require`` checks and two that state those
conditions (``seq_len >= origin + band``, ``kv_len == seq_len``), so that bind refuses a length the rewrite is
not for, and its score modifier (:func:`~maskc.analysis.order.image_grid` admits only modifiers that read no
position).

How: a position is *kept* (before the image, or from the end of the last whole band on: raster(p) = p) or in the
*bands* (raster(p) = ``order.raster_expr(p)``, floors by constants). :func:`reorder` turns every allow and deny
rule ``C(q, k)`` into the union, over a piece of q and a piece of k, of ``piece(q) and piece(k) and
C(raster(q), raster(k))``; :func:`reorder_regions` does the same region by region, cutting a region only in the
pieces of the positions it reads, then drops the regions interval arithmetic shows empty (a key in the bands,
``k >= origin``, is never ``< text`` once written as ``text + width * y + x``, which normalize cannot see:
:func:`prune_regions`) and those another region of the group contains. The const parameters are written as
their values, so that normalize folds ``(raster(k) - text) // width`` back into the key's image row
(:func:`maskc.analysis.linear.floor_op`'s bounded split) and the chunk analysis solves the rewritten atoms
exactly, as it solves the original's.
"""
from __future__ import annotations

import math
from dataclasses import replace

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis.normalize import intersect
from maskc.analysis.order import TokenOrder

INF = math.inf
_ROUNDS = 3            # passes over a region's atoms to narrow the positions' ranges


def reorder(mask: ir.ResolvedMask, order: TokenOrder, constants: dict[str, int]) -> ir.ResolvedMask:
    """``mask`` in the coordinates of ``order``, with its const parameters at ``constants`` (module docstring)."""
    fixed = {name: ir.Const(int(v)) for name, v in constants.items()}
    pieces = {p: _pieces(ir.Pos(p), order) for p in ir.POSITIONS}
    rules = []
    for rule in mask.rules:
        if rule.kind == "require":
            rules.append(rule)
            continue
        cond = _substitute(rule.cond, lambda n: fixed.get(n.name) if isinstance(n, ir.ParamRef) else None)
        alternatives = []
        for q_piece, q_at in pieces["q"]:
            for k_piece, k_at in pieces["k"]:
                at = {"q": q_at, "k": k_at}
                moved = _substitute(cond, lambda n: at[n.which] if isinstance(n, ir.Pos) else None)
                alternatives.append(ir.All((q_piece, k_piece, moved), rule.span))
        rules.append(ir.Rule(rule.kind, ir.Any_(tuple(alternatives), rule.span), rule.span))
    seq_len, kv_len = ir.Builtin("seq_len"), ir.Builtin("kv_len")
    rules.append(ir.Rule("require", ir.Cmp(">=", seq_len, ir.Const(order.origin + order.band))))
    rules.append(ir.Rule("require", ir.Cmp("==", kv_len, seq_len)))
    return replace(mask, rules=tuple(rules))


def _pieces(p: ir.Pos, order: TokenOrder):
    """(condition, raster position) of the kept positions and of the bands."""
    seq_len = ir.Builtin("seq_len")
    start = ir.Const(order.origin)
    band = ir.Const(order.band)
    end = ir.Arith("+", start, ir.Arith("*", band, ir.Arith("//", ir.Arith("-", seq_len, start), band)))
    kept = ir.Any_((ir.Cmp("<", p, start), ir.Cmp(">=", p, end)))
    inside = ir.All((ir.Cmp(">=", p, start), ir.Cmp("<", p, end)))
    return ((kept, p), (inside, order.raster_expr(p)))


def _substitute(node, mapping):
    """``node`` with every sub-node for which ``mapping`` returns a replacement replaced (each shared sub-tree
    of the DAG rewritten once)."""
    done: dict[int, object] = {}

    def walk(n):
        hit = done.get(id(n))
        if hit is not None:
            return hit
        new = mapping(n)
        if new is None:
            if isinstance(n, (ir.Arith, ir.Cmp)):
                new = replace(n, left=walk(n.left), right=walk(n.right))
            elif isinstance(n, ir.Func):
                new = replace(n, args=tuple(walk(a) for a in n.args))
            elif isinstance(n, ir.TableAt):
                new = replace(n, indices=tuple(walk(a) for a in n.indices), strides=tuple(walk(a) for a in n.strides))
            elif isinstance(n, (ir.All, ir.Any_)):
                new = replace(n, items=tuple(walk(a) for a in n.items))
            elif isinstance(n, ir.Negate):
                new = replace(n, item=walk(n.item))
            else:
                assert not isinstance(n, (ir.Same, ir.SegAttr, ir.SegValue)), "image_grid refuses segments"
                new = n
        done[id(n)] = new
        return new
    return walk(node)


# ---- the normal form in the order ---------------------------------------------------------------------------

def reorder_regions(mask: ir.NormalMask, order: TokenOrder) -> ir.NormalMask:
    """``mask`` (a normal form with the const parameters fixed: ``specialize``) in the coordinates of ``order``,
    region by region: each position a region reads is taken through its three pieces (before the image, after the
    last whole band: itself; in the bands: ``order.raster_expr``), the pieces' atoms added; then regions interval
    arithmetic shows empty (:func:`prune`) and regions another of their group contains (its atoms a subset of
    theirs) dropped. Denotes what :func:`reorder` of the resolved mask denotes, for the same lengths; a region
    that reads only q is cut in q's pieces alone, so the order adds no region to CLEAR's text rules."""
    seq_len = L.of_term(ir.Builtin("seq_len"))
    start, band = L.const(order.origin), L.const(order.band)
    end = L.add(start, L.scale(L.floor_op("//", L.sub(seq_len, start), band), order.band))

    def pieces(p):
        pos = L.of_term(p)
        raster = L.from_expr(order.raster_expr(ir.Pos(p.which)))
        return ((pos, (L.sub(pos, L.sub(start, L.const(1))),)),                    # p <= origin - 1
                (pos, (L.sub(end, pos),)),                                         # p >= end
                (raster, (L.sub(start, pos), L.add(L.sub(pos, end), L.const(1)))))   # origin <= p < end

    def moved(group):
        out = []
        for region in group:
            reads = [p for p in (F.Q, F.K) if any(F.lin_mentions(a.lin, lambda t, p=p: t == p) for a in region.atoms)]
            choices = [[]]
            for p in reads:
                choices = [c + [(p, piece)] for c in choices for piece in pieces(p)]
            for choice in choices:
                at = {p: value for p, (value, _) in choice}
                atoms = [ir.Atom(L.substitute(a.lin, lambda t: at.get(t)), a.span) for a in region.atoms]
                guards = [ir.Atom(g, region.span) for _, (_, gs) in choice for g in gs]
                found = intersect(ir.Region(tuple(guards), region.span), ir.Region(tuple(atoms), region.span))
                if found is not None:
                    out.append(found)
        return _subsumed(prune_regions(out, order.origin + order.band))

    return replace(mask, allow=moved(mask.allow), deny=moved(mask.deny))


def _subsumed(regions: list[ir.Region]) -> tuple[ir.Region, ...]:
    """The regions no other of the list contains (one whose atoms are a subset of another's contains it; of two
    with the same atoms the first is kept)."""
    sets = [frozenset(a.lin for a in r.atoms) for r in regions]
    keep = []
    for i, mine in enumerate(sets):
        if not any(j != i and other <= mine and (other != mine or j < i) for j, other in enumerate(sets)):
            keep.append(regions[i])
    return tuple(keep)


# ---- prune ------------------------------------------------------------------------------------------------------

def prune_regions(regions, min_len: int) -> list[ir.Region]:
    """``regions`` without those interval arithmetic shows empty for ``seq_len, kv_len >= min_len``: a key in the
    bands ``k >= origin`` is never ``< text`` once written as ``text + width * y + x``, which normalize cannot see.
    The rest is unchanged, so the union denotes the same pairs for those lengths."""
    return [r for r in regions if not _empty(r, min_len)]


def _empty(region: ir.Region, min_len: int) -> bool:
    """Whether no (q, k) satisfies the region: positions in [0, inf) narrowed by the atoms that bound them
    linearly, then some atom whose smallest value is above 0, or a position left with no value."""
    env: dict = {F.Q: (0, INF), F.K: (0, INF), ir.Builtin("seq_len"): (min_len, INF),
                 ir.Builtin("kv_len"): (min_len, INF)}
    for _ in range(_ROUNDS):
        for atom in region.atoms:
            for p in (F.Q, F.K):
                split = F.split_on(atom.lin, p)
                if split is None or split[0] == 0:
                    continue
                a, rest = split
                low = _lin_range(rest, env)[0]
                if math.isinf(low):
                    continue
                lo, hi = env[p]
                if a > 0:                       # a*p <= -rest <= -low
                    hi = min(hi, (-low) // a)
                else:                           # |a|*p >= rest >= low
                    lo = max(lo, -((-low) // -a))
                if lo > hi:
                    return True
                env[p] = (lo, hi)
    return any(_lin_range(atom.lin, env)[0] > 0 for atom in region.atoms)


def _lin_range(lin: ir.Lin, env) -> tuple[float, float]:
    lo: float = lin.const
    hi: float = lin.const
    for t, c in lin.terms:
        a, b = _term_range(t, env)
        lo, hi = (lo + c * a, hi + c * b) if c > 0 else (lo + c * b, hi + c * a)
    return lo, hi


def _floordiv(x, d: int):
    return x if math.isinf(x) else x // d


def _term_range(t, env) -> tuple[float, float]:
    """(lowest, highest) of a term given the ranges ``env`` of the leaves it reads ((-inf, inf) when unknown)."""
    if t in env:
        return env[t]
    if isinstance(t, ir.Floor) and L.is_const(t.den) and t.den.const > 0:
        d = t.den.const
        if t.op == "%":
            return 0, d - 1
        lo, hi = _lin_range(t.num, env)
        return _floordiv(lo, d), _floordiv(hi, d)
    if isinstance(t, ir.Square):
        lo, hi = _lin_range(t.base, env)
        if lo >= 0:
            return lo * lo, hi * hi
        if hi <= 0:
            return hi * hi, lo * lo
        return 0, max(lo * lo, hi * hi)
    if isinstance(t, ir.Extreme) and t.fn in ("min", "max"):
        ranges = [_lin_range(a, env) for a in t.args]
        pick = max if t.fn == "max" else min
        return pick(r[0] for r in ranges), pick(r[1] for r in ranges)
    return -INF, INF
