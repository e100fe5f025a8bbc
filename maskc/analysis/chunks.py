"""Range analysis where k enters through ``//`` and ``%``: a region's keys per row as one interval per chunk.

Invariants (``v`` is k, or a chunk index one level up):

* :func:`floor_bound` turns an atom in which k appears only as ``b * ((s*k + r) // d)`` into one bound on
  k, with the same integer solutions (``(k + r) // d <= M  <=>  k <= d*M + d - 1 - r``);
* :func:`chunk_keys` returns a :class:`~maskc.ir.ChunkedKeys` whose intervals, where its guards hold,
  are exactly the keys that satisfy the region's k-bounds and opaque atoms, or an
  :class:`~maskc.ir.Inexact` naming the first atom it cannot solve and why.

The nest is built one level at a time, from k up:

1. every floor of v is made ``(v + r) // d`` (``(-v + r) // d == -((v + d - 1 - r) // d)``;
   ``(s*v + r) // (s*m) == (v + r // s) // m``);
2. a chunk size ``c`` dividing every ``d`` and every difference of the ``r`` is chosen, and the chunk index
   ``J = (v + r0) // c`` introduced: within a chunk ``(v + r) // d == (J + A) // m`` (``d = c*m``,
   ``r - r0 = c*A``) and ``(v + r) % d == v + r - d * ((J + A) // m)``, so no floor of v is left;
3. each atom that reads v is solved for v: ``a*v + rest <= 0`` is a bound, and ``w * (a*v + b)**2 + rest
   <= 0`` (``w > 0``) is ``|a*v + b| <= isqrt((-rest) // w)``, with ``rest <= 0`` passed up;
4. atoms free of v (and the chunk's range, carried from v's bounds) go up to J's level, and 1-3 repeat.

Nested floors such as ``(k // width) % height`` become floors of J one level up (frames of image rows).
"""
from __future__ import annotations

import math

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L

_MAX_LEVELS = 4


class _Fail(Exception):
    def __init__(self, atom: ir.Atom, reason: str):
        super().__init__(reason)
        self.atom, self.reason = atom, reason


def _name(var) -> str:
    return "k" if var == F.K else F.render_term(var)


# -- 1. canonical floors ------------------------------------------------------------------------

def _canonical_floor(op: str, num: ir.Lin, den: ir.Lin, var) -> ir.Lin | None:
    """``num op den`` with every floor of ``var`` of the form ``(var + r) // d``; None when ``num`` is not
    linear in ``var`` (left as it is) or its coefficient does not divide ``den`` (raises)."""
    split = F.split_on(num, var)
    if split is None or split[0] in (0, 1):
        return None
    s, r = split
    if s < 0:          # (s*v + r) // d == -((|s|*v + d - 1 - r) // d)
        inner = L.add(L.scale(L.of_term(var), -s), L.sub(L.sub(den, L.const(1)), r))
        floor = L.scale(_canonical_floor("//", inner, den, var) or L.floor_op("//", inner, den), -1)
    else:
        m = L.divide(den, L.const(s))
        if m is None:
            raise ValueError(f"the coefficient {s} of {_name(var)} does not divide the divisor {F.render(den)}")
        floor = L.floor_op("//", L.add(L.of_term(var), L.floor_op("//", r, L.const(s))), m)
    return floor if op == "//" else L.sub(num, L.mul(den, floor))


def _canonical(atom: ir.Atom, var) -> ir.Atom:
    def mapping(t):
        if isinstance(t, ir.Floor) and F.reads(t.num, var):
            try:
                return _canonical_floor(t.op, t.num, t.den, var)
            except ValueError as err:
                raise _Fail(atom, f"{F.render_term(t)}: {err}") from None
        return None
    return ir.Atom(L.substitute(atom.lin, mapping), atom.span)


# -- 2. the chunk ---------------------------------------------------------------------------------

def _floors_of(lin: ir.Lin, var):
    """(r, d) of every floor ``(var + r) // d`` (or ``%``) in ``lin``, at any depth."""
    for t in F.terms_of(lin):
        if isinstance(t, ir.Floor):
            split = F.split_on(t.num, var)
            if split is not None and split[0] == 1:
                yield split[1], t.den, t


def _choose_chunk(atoms: list[ir.Atom], var) -> tuple[ir.Lin, ir.Lin] | None:
    """(offset, size) of a chunk within which every floor of ``var`` is constant, or None without floors."""
    found: dict[tuple[ir.Lin, ir.Lin], tuple[ir.Atom, ir.Floor]] = {}
    for atom in atoms:
        for r, d, term in _floors_of(atom.lin, var):
            found.setdefault((r, d), (atom, term))
    if not found:
        return None
    pairs = list(found)
    for r0, c in sorted(pairs, key=lambda p: (not L.is_const(p[1]), p[1].const, L._term_key(p[1]))):
        if c != L.const(1) and all(L.divide(d, c) is not None and L.divide(L.sub(r, r0), c) is not None
                                   for r, d in pairs):
            return r0, c
    r0 = pairs[0][0]
    numbers = [d for _, d in pairs] + [L.sub(r, r0) for r, _ in pairs]
    if all(L.is_const(x) for x in numbers):
        g = 0
        for x in numbers:
            g = math.gcd(g, x.const)
        if g > 1:
            return r0, L.const(g)
    (atom, first), (_, second) = found[pairs[0]], found[pairs[-1]]
    raise _Fail(atom, f"{F.render_term(first)} and {F.render_term(second)} have no common chunk (one divisor "
                      "must divide the others, with offsets that differ by multiples of it)")


def _chunk_map(var, nxt, offset: ir.Lin, size: ir.Lin):
    """Floors of ``var`` in terms of the chunk index ``nxt = (var + offset) // size`` (see step 2)."""
    J = L.of_term(nxt)

    def mapping(t):
        if not isinstance(t, ir.Floor):
            return None
        split = F.split_on(t.num, var)
        if split is None or split[0] != 1:
            return None
        m, a = L.divide(t.den, size), L.divide(L.sub(split[1], offset), size)
        assert m is not None and a is not None, "_choose_chunk checked every floor"
        quotient = L.floor_op("//", L.add(J, a), m)
        return quotient if t.op == "//" else L.sub(t.num, L.mul(t.den, quotient))
    return mapping


def _carried(bound: ir.KBound, offset: ir.Lin, size: ir.Lin, lower: bool) -> ir.KBound:
    """A bound on the chunk index implied by a bound on the variable it chunks (floor of floor folded)."""
    den = bound.den
    shift = L.add(L.scale(offset, den), L.const(den - 1 if lower else 0))
    return ir.KBound(L.floor_op("//", L.add(bound.lin, shift), L.scale(size, den)), 1)


# -- 3. solving one atom for its variable ---------------------------------------------------------

def _solve(atom: ir.Atom, var) -> tuple[list[ir.KBound], list[ir.KBound], list[ir.Atom]]:
    """(lower, upper, implied atoms free of ``var``) equivalent to ``atom`` (see step 3)."""
    lin = atom.lin
    split = F.split_on(lin, var)
    if split is not None and split[0] != 0:
        a, rest = split
        if a > 0:
            return [], [ir.KBound(L.scale(rest, -1), a)], []
        return [ir.KBound(rest, -a)], [], []
    reading = [(t, c) for t, c in lin.terms if F.reads(L.of_term(t), var)]
    square, w = reading[0] if len(reading) == 1 else (None, 0)
    if isinstance(square, ir.Square) and w > 0:
        base = F.split_on(square.base, var)
        if base is not None and base[0] != 0:
            a, b = base
            rest = L.sub(lin, L.scale(L.of_term(square), w))
            radius = L.root(L.floor_op("//", L.scale(rest, -1), L.const(w)))
            if a > 0:     # -R <= a*v + b <= R
                lower, upper = ir.KBound(L.sub(L.scale(radius, -1), b), a), ir.KBound(L.sub(radius, b), a)
            else:
                lower, upper = ir.KBound(L.sub(b, radius), -a), ir.KBound(L.add(b, radius), -a)
            return [lower], [upper], [ir.Atom(rest, atom.span)]
    raise _Fail(atom, _why(reading, var))


def _why(reading, var) -> str:
    """Why an atom that reads ``var`` has no solution as bounds on it, in words."""
    name = _name(var)
    terms = [t for t, _ in reading]
    for t in terms:
        if isinstance(t, (ir.SegAttr, ir.SegValue)):
            return (f"{F.render_term(t)} reads the segment that holds k (same({t.seg}) in the rule would make "
                    "it the segment of q)")
    if F.K in terms or any(t == var for t in terms):
        others = [F.render_term(t) for t in terms if t != var]
        return f"{name} appears both on its own and in {', '.join(others)}"
    if len(terms) > 1:
        return f"{name} appears in {len(terms)} non-linear terms ({', '.join(F.render_term(t) for t in terms)})"
    t, c = reading[0]
    if isinstance(t, ir.Square):
        if c < 0:
            return (f"{F.render_term(t)} must be large: the keys outside a disc are two intervals per row, "
                    "not one")
        return f"{F.render_term(t)}: the square of a form that is not linear in {name}"
    if isinstance(t, ir.Product):
        return f"{F.render_term(t)}: a product in which {name} is multiplied by a form that is not constant"
    if isinstance(t, ir.Floor):
        return f"{F.render_term(t)}: a floor division whose numerator is not linear in {name}"
    if isinstance(t, ir.Bits):
        return (f"{F.render_term(t)}: a bit operation on {name} (maskc solves shifts by a constant and & with a "
                "constant 2**n - 1 or -2**n, which are // and %, and no other)")
    if isinstance(t, ir.Lookup):
        return f"{F.render_term(t)}: a table entry at an index that depends on {name}"
    return f"{F.render_term(t)} is not linear in {name}"


# -- the nest -------------------------------------------------------------------------------------

def floor_bound(lin: ir.Lin) -> tuple[ir.KBound, bool] | None:
    """``(bound, is_lower)``: the bound on k equivalent to ``lin <= 0`` when k appears in it only as
    ``b * ((s*k + r) // d)`` (``b != 0``, ``s`` dividing ``d``); else None."""
    try:
        canon = _canonical(ir.Atom(lin), F.K).lin
    except _Fail:
        return None
    reading = [(t, c) for t, c in canon.terms if F.depends_on_k(L.of_term(t))]
    floor, b = reading[0] if len(reading) == 1 else (None, 0)
    if not isinstance(floor, ir.Floor) or floor.op != "//":
        return None
    split = F.split_on(floor.num, F.K)
    if split is None or split[0] != 1:
        return None
    r, d = split[1], floor.den
    rest = L.sub(canon, L.scale(L.of_term(floor), b))
    if b > 0:     # floor <= (-rest) // b = M  <=>  k <= d*M + d - 1 - r
        m = L.floor_op("//", L.scale(rest, -1), L.const(b))
        return ir.KBound(L.sub(L.add(L.mul(d, m), L.sub(d, L.const(1))), r), 1), False
    m = L.scale(L.floor_op("//", L.scale(rest, -1), L.const(-b)), -1)       # floor >= ceil(rest / -b) = M
    return ir.KBound(L.sub(L.mul(d, m), r), 1), True


def chunk_keys(lower: tuple[ir.KBound, ...], upper: tuple[ir.KBound, ...],
               opaque: tuple[ir.Atom, ...]) -> ir.ChunkedKeys | ir.Inexact:
    """The region ``max(lower) <= k <= min(upper), opaque`` as one interval per chunk (module docstring)."""
    levels: list[ir.ChunkLevel] = []
    try:
        return _nest(list(lower), list(upper), list(opaque), levels)
    except _Fail as fail:
        defined = [f"{F.render_term(ir.ChunkVar(i + 1))} = {chunk_definition(level)}" for i, level in enumerate(levels)]
        return ir.Inexact(fail.atom, fail.reason + (f" (where {', '.join(defined)})" if defined else ""))


def chunk_definition(level: ir.ChunkLevel) -> str:
    """``(k - text) // width``: how a level's variable is cut into the next level's chunks."""
    assert level.offset is not None and level.size is not None
    size = F.render(level.size)
    return f"({F.render(L.add(L.of_term(level.var), level.offset))}) // " + (
        size if L.is_const(level.size) or L.single_term(level.size) is not None else f"({size})")


def _nest(lower: list[ir.KBound], upper: list[ir.KBound], pending: list[ir.Atom],
          levels: list[ir.ChunkLevel]) -> ir.ChunkedKeys:
    var: ir.Term = F.K
    for level in range(_MAX_LEVELS + 1):
        # canonical floors may cancel var ((-q - 2*k) % 2 == q % 2, free of k): those atoms go up too
        canonical = [_canonical(a, var) if F.reads(a.lin, var) else a for a in pending]
        here = [a for a in canonical if F.reads(a.lin, var)]
        up = [a for a in canonical if not F.reads(a.lin, var)]
        chunk = _choose_chunk(here, var)
        nxt = ir.ChunkVar(level + 1)
        if chunk is not None:
            if level == _MAX_LEVELS:
                raise _Fail(here[0], f"floors nested more than {_MAX_LEVELS} deep")
            here = [ir.Atom(L.substitute(a.lin, _chunk_map(var, nxt, *chunk)), a.span) for a in here]
            up += [a for a in here if not F.reads(a.lin, var)]
            here = [a for a in here if F.reads(a.lin, var)]
        for atom in here:
            lo, hi, implied = _solve(atom, var)
            lower, upper, up = lower + lo, upper + hi, up + implied
        if chunk is None:
            levels.append(ir.ChunkLevel(var, tuple(lower), tuple(upper)))
            guards = tuple(a for a in up if not (L.is_const(a.lin) and a.lin.const <= 0))
            return ir.ChunkedKeys(tuple(levels), guards)
        offset, size = chunk
        J = L.mul(size, L.of_term(nxt))
        first = L.sub(J, offset)                      # the chunk's range of var
        lower.append(ir.KBound(first, 1))
        upper.append(ir.KBound(L.add(first, L.sub(size, L.const(1))), 1))
        levels.append(ir.ChunkLevel(var, tuple(lower), tuple(upper), offset, size))
        known_lo = [b for b in lower if not F.reads(b.lin, nxt)]
        known_hi = [b for b in upper if not F.reads(b.lin, nxt)]
        if var == F.K:                                 # keys lie in [0, kv_len)
            known_lo.append(ir.KBound(L.ZERO, 1))
            known_hi.append(ir.KBound(L.sub(L.of_term(ir.Builtin("kv_len")), L.const(1)), 1))
        lower = [_carried(b, offset, size, True) for b in known_lo]
        upper = [_carried(b, offset, size, False) for b in known_hi]
        pending, var = up, nxt
    raise AssertionError("unreachable: the loop returns or fails at _MAX_LEVELS")
