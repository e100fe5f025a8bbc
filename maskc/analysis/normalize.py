"""Pass 3, normalize: :class:`~maskc.ir.ResolvedMask` → :class:`~maskc.ir.NormalMask`.

Invariant: the result denotes the same set of visible (q, k) pairs, written as a union of allow
regions minus a union of deny regions, each region a conjunction of canonical atoms ``lin <= 0``
such that

* constants are folded, duplicate atoms merged and bounds on one linear direction tightened;
  regions that are contradictory on their face are dropped;
* in a region that requires ``same(S)``, every attribute of S at k is rewritten to the same
  attribute at q (they are equal there), and ``same(S)`` itself becomes the linear
  ``S.index(q) >= 0, S.start(q) <= k < S.end(q)``; ``same(A, B)`` (k's segment of B numbered as q's of A)
  becomes ``A.index(q) >= 0, B.bound(i) <= k < B.bound(i + 1)`` with ``i = A.index(q)`` (:class:`~maskc.ir.SegBound`),
  and B's index, start, end and length at k are rewritten to i, B.bound(i), B.bound(i + 1) and their difference;
* min/max/abs that depend on k are split into cases, so the atoms left depending on k
  non-linearly are only those with products, squares, floor divisions, bit operations or table
  entries of k (the *opaque* ones). A table's index is kept as written (bind proves it in range).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.errors import ComplexityError, Span

_FLIP = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}
_MAX_REGIONS = 512
_MAX_CASES = 8192       # conjunctions and min/max cases one rule may visit on the way to its regions


class _TooComplex(Exception):
    pass


class _Budget:
    """Work left for one rule: every partial conjunction and every min/max case spends one."""

    def __init__(self, cases: int = _MAX_CASES):
        self.left = cases

    def spend(self) -> None:
        self.left -= 1
        if self.left < 0:
            raise _TooComplex


# -- step 1: negation normal form, with same() negated into linear cases ----------------------

def _nnf(cond: ir.Cond, negate: bool = False) -> ir.Cond:
    if isinstance(cond, ir.Truth):
        return ir.Truth(cond.value != negate, cond.span)
    if isinstance(cond, ir.Cmp):
        return ir.Cmp(_FLIP[cond.op], cond.left, cond.right, cond.span) if negate else cond
    if isinstance(cond, ir.Same):
        if not negate:
            return cond
        # not same(S)  <=>  q outside S, or k before or after q's segment (the segment of B numbered as q's,
        # for same(A, B): _Bound below).
        s, span = cond.seg, cond.span
        start: Any
        end: Any
        if cond.key_seg is None:
            start, end = ir.SegAttr(s, "start", "q", span), ir.SegAttr(s, "end", "q", span)
        else:
            start, end = _Bound(cond.key_seg, s, 0), _Bound(cond.key_seg, s, 1)
        return ir.Any_((ir.Cmp("<", ir.SegAttr(s, "index", "q", span), ir.Const(0, span), span),
                        ir.Cmp("<", ir.Pos("k", span), start, span),
                        ir.Cmp(">=", ir.Pos("k", span), end, span)), span)
    if isinstance(cond, ir.Negate):
        return _nnf(cond.item, not negate)
    items = tuple(_nnf(i, negate) for i in cond.items)
    conj = isinstance(cond, ir.All) != negate
    return (ir.All if conj else ir.Any_)(items, cond.span)


@dataclass(frozen=True)
class _Bound:
    """Inside normalize only: ``key_seg.bound(seg.index(q) + plus)`` as an expression of a literal, made a
    :class:`~maskc.ir.SegBound` when the literal becomes atoms."""

    key_seg: str
    seg: str
    plus: int

    def lin(self) -> ir.Lin:
        return _seg_bound(self.key_seg, self.seg, self.plus)


def _seg_bound(key_seg: str, seg: str, plus: int) -> ir.Lin:
    return L.seg_bound(key_seg, L.add(L.of_term(ir.SegAttr(seg, "index", "q")), L.const(plus)))


# -- step 2: disjunctive normal form over literals (Cmp and positive Same) ----------------------

def _dnf(cond: ir.Cond) -> list[tuple]:
    if isinstance(cond, ir.Truth):
        return [()] if cond.value else []
    if isinstance(cond, (ir.Cmp, ir.Same)):
        return [(cond,)]
    assert isinstance(cond, (ir.All, ir.Any_)), "_nnf leaves no Negate"
    parts = [_dnf(i) for i in cond.items]
    if isinstance(cond, ir.Any_):
        return [c for p in parts for c in p]
    out: list[tuple] = [()]
    for p in parts:
        if len(out) * len(p) > _MAX_REGIONS:
            raise _TooComplex
        out = [a + b for a in out for b in p]
    return out


# -- step 3: literals to atoms ---------------------------------------------------------------

def _same_rewrite(segs: frozenset, crossed: dict[str, str]):
    """Attributes at k of the segments that ``same`` pins: of S in same(S), as at q; of B in same(A, B)
    (``crossed[B] = A``), through the segment of B numbered as q's of A (per-segment values of B stay)."""
    def mapping(term):
        if isinstance(term, ir.SegAttr) and term.pos == "k" and term.seg in segs:
            return L.of_term(ir.SegAttr(term.seg, term.attr, "q"))
        if isinstance(term, ir.SegValue) and term.pos == "k" and term.seg in segs:
            return L.of_term(ir.SegValue(term.array, term.seg, "q"))
        if isinstance(term, ir.SegAttr) and term.pos == "k" and term.seg in crossed:
            a = crossed[term.seg]
            if term.attr == "index":
                return L.of_term(ir.SegAttr(a, "index", "q"))
            start, end = _seg_bound(term.seg, a, 0), _seg_bound(term.seg, a, 1)
            return {"start": start, "end": end, "length": L.sub(end, start)}[term.attr]
        return None
    return mapping


def _cmp_alternatives(cmp: ir.Cmp, rewrite) -> list[tuple[ir.Lin, ...]]:
    """``left op right`` as a disjunction of conjunctions of ``lin <= 0``."""
    d = L.substitute(L.sub(_form(cmp.left), _form(cmp.right)), rewrite)
    neg = L.scale(d, -1)
    one = L.const(1)
    if cmp.op == "<=":
        return [(d,)]
    if cmp.op == "<":
        return [(L.add(d, one),)]
    if cmp.op == ">=":
        return [(neg,)]
    if cmp.op == ">":
        return [(L.add(neg, one),)]
    if cmp.op == "==":
        return [(d, neg)]
    return [(L.add(d, one),), (L.add(neg, one),)]


def _form(e) -> ir.Lin:
    return e.lin() if isinstance(e, _Bound) else L.from_expr(e)


def _outside_tables(lin: ir.Lin):
    """The terms of ``lin`` at any depth, outermost first, except those inside a table's index: an index is
    not split into cases (bind proves the index as written in range, not each case's)."""
    for t, _ in lin.terms:
        yield t
        if not isinstance(t, ir.Lookup):
            for inner in F.inner_lins(t):
                yield from _outside_tables(inner)


def _split_extremes(lins: tuple[ir.Lin, ...], budget: _Budget) -> list[tuple[ir.Lin, ...]]:
    """Case-split the innermost min/max that depends on k until none is left (outside table indices). Cases
    contradictory on their face are dropped as soon as they appear, so nested abs of one form stays two cases
    per level."""
    target = None
    for lin in lins:
        for t in _outside_tables(lin):
            if isinstance(t, ir.Extreme) and F.term_depends_on_k(t) and not any(
                    isinstance(u, ir.Extreme) and F.term_depends_on_k(u) for a in t.args for u in _outside_tables(a)):
                target = t
                break
        if target is not None:
            break
    if target is None:
        return [lins]
    out = []
    args = target.args
    for i, chosen in enumerate(args):
        # `chosen` is the extreme: it beats earlier args strictly and later ones or ties.
        guards = []
        for j, other in enumerate(args):
            if j == i:
                continue
            diff = L.sub(other, chosen) if target.fn == "max" else L.sub(chosen, other)
            guards.append(L.add(diff, L.const(1)) if j < i else diff)   # diff < 0 or diff <= 0
        replaced = tuple(L.substitute(lin, lambda t: chosen if t == target else
                                      L.of_term(t) if isinstance(t, ir.Lookup) else None) for lin in lins)
        case = tuple(guards) + replaced
        budget.spend()
        if _tighten([ir.Atom(lin) for lin in case]) is not None:
            out.extend(_split_extremes(case, budget))
    return out


def _tighten(atoms: list[ir.Atom]) -> list[ir.Atom] | None:
    """Merge atoms along one linear direction; None if the conjunction is contradictory."""
    bounds: dict[tuple, list] = {}          # direction -> [lower, upper, span]
    for atom in atoms:
        lin = L.reduce_atom(atom.lin)
        if not lin.terms:
            if lin.const > 0:
                return None
            continue
        sign = 1 if lin.terms[0][1] > 0 else -1
        direction = tuple((t, c * sign) for t, c in lin.terms)
        entry = bounds.setdefault(direction, [None, None, atom.span])
        if sign > 0:                          # direction + const <= 0  →  direction <= -const
            entry[1] = -lin.const if entry[1] is None else min(entry[1], -lin.const)
        else:                                 # -direction + const <= 0 →  direction >= const
            entry[0] = lin.const if entry[0] is None else max(entry[0], lin.const)
    out = []
    for direction, (lower, upper, span) in bounds.items():
        if lower is not None and upper is not None and lower > upper:
            return None
        if upper is not None:
            out.append(ir.Atom(ir.Lin(direction, -upper), span))
        if lower is not None:
            out.append(ir.Atom(ir.Lin(tuple((t, -c) for t, c in direction), lower), span))
    return out


def _conjunctions(literal_alts, budget: _Budget) -> list[list[ir.Atom]]:
    """One atom list per way of picking an alternative of every literal, tightened as it grows: partial
    picks that contradict themselves are dropped and equal ones merged, so ``k != q and k != q and ...``
    stays two cases instead of doubling at every literal."""
    partial: dict[frozenset, list[ir.Atom]] = {frozenset(): []}
    for alts in literal_alts:
        grown: dict[frozenset, list[ir.Atom]] = {}
        for atoms in partial.values():
            for lins, s in alts:
                budget.spend()
                tight = _tighten(atoms + [ir.Atom(lin, s) for lin in lins])
                if tight is not None:
                    grown.setdefault(frozenset(a.lin for a in tight), tight)
        if len(grown) > _MAX_REGIONS:
            raise _TooComplex
        partial = grown
    return list(partial.values())


def _regions(cond: ir.Cond, span) -> list[ir.Region]:
    regions: list[ir.Region] = []
    seen = set()
    budget = _Budget()
    for conj in _dnf(_nnf(cond)):
        pairs = sorted({(lit.seg, lit.k_seg) for lit in conj if isinstance(lit, ir.Same)})
        segs = frozenset(a for a, b in pairs if a == b)
        crossed: dict[str, str] = {}
        for a, b in pairs:
            if a != b and b not in segs:
                crossed.setdefault(b, a)      # k's segment of B is numbered as q's of A (any one A will do)
        rewrite = _same_rewrite(segs, crossed)
        literal_alts: list[list[tuple[tuple[ir.Lin, ...], Span]]] = []
        for a, b in pairs:
            index = L.of_term(ir.SegAttr(a, "index", "q"))
            if a == b:
                start, end = (L.of_term(ir.SegAttr(a, attr, "q")) for attr in ("start", "end"))
            else:
                start, end = _seg_bound(b, a, 0), _seg_bound(b, a, 1)
            same_lins = (L.scale(index, -1), L.sub(start, L.of_term(F.K)), L.add(L.sub(L.of_term(F.K), end), L.const(1)))
            literal_alts.append([(same_lins, span)])
        for lit in conj:
            if isinstance(lit, ir.Cmp):
                literal_alts.append([(alt, lit.span) for alt in _cmp_alternatives(lit, rewrite)])
        for atoms in _conjunctions(literal_alts, budget):
            for case in _split_extremes(tuple(a.lin for a in atoms), budget):
                # The case's last atoms are the originals (rewritten); guards come first.
                offset = len(case) - len(atoms)
                case_atoms = [ir.Atom(lin, atoms[i - offset].span if i >= offset else span)
                              for i, lin in enumerate(case)]
                tight = _tighten(case_atoms)
                if tight is None:
                    continue
                key = frozenset(a.lin for a in tight)
                if key in seen:
                    continue
                seen.add(key)
                regions.append(ir.Region(tuple(sorted(tight, key=lambda a: L._term_key(a.lin))), span))
                if len(regions) > _MAX_REGIONS:
                    raise _TooComplex
    return regions


def normalize(mask: ir.ResolvedMask) -> ir.NormalMask:
    """Rewrite a resolved mask into its canonical union of regions (see the module docstring). A rule
    past the budgets (regions, cases, term size) raises a :class:`~maskc.errors.ComplexityError` at it."""
    allow: list[ir.Region] = []
    deny: list[ir.Region] = []
    for rule in mask.allow + mask.deny:
        try:
            regions = _regions(rule.cond, rule.span)
        except _TooComplex:
            raise ComplexityError(f"this rule expands to more than {_MAX_REGIONS} regions (or {_MAX_CASES} cases "
                                  "on the way)", rule.span,
                                  "split it into several rules, or use fewer 'or', '!=', min/max/abs on k") from None
        except ComplexityError as err:       # from the linear algebra, which knows no span
            raise ComplexityError(err.message, err.span or rule.span, err.hint) from None
        (allow if rule.kind == "allow" else deny).extend(regions)
    allow_t, deny_t = _dedupe(allow), _dedupe(deny)
    return ir.NormalMask(mask.name, mask.params, allow_t, deny_t, _divisors(allow_t + deny_t), mask.span)


def _divisors(regions) -> tuple[ir.Lin, ...]:
    found = {t.den for r in regions for a in r.atoms for t in F.terms_of(a.lin) if isinstance(t, ir.Floor)}
    # a divisor nested in another comes first: checking in this order never divides by zero
    return tuple(sorted(found, key=lambda d: (sum(1 for _ in F.terms_of(d)), L._term_key(d))))


def _dedupe(regions: list[ir.Region]) -> tuple[ir.Region, ...]:
    seen, out = set(), []
    for r in regions:
        key = frozenset(a.lin for a in r.atoms)
        if key not in seen:
            seen.add(key)
            out.append(r)
    return tuple(out)


def intersect(a: ir.Region, b: ir.Region) -> ir.Region | None:
    """The conjunction of two regions, or None when it is contradictory on its face (linear
    directions with empty bounds). None proves emptiness; a region back does not prove the opposite."""
    tight = _tighten(list(a.atoms) + list(b.atoms))
    return None if tight is None else ir.Region(tuple(tight), a.span)


def specialize(mask: ir.NormalMask, values: dict[str, int]) -> ir.NormalMask:
    """The same mask with int parameters fixed to ``values``: each atom folded and re-tightened, so
    regions that contradict themselves once the values are known (say ``d <= max_attn_len`` and
    ``d > 0`` at ``max_attn_len = 0``) drop out. Denotes the same pairs for those values."""
    def fix(term):
        if isinstance(term, ir.ParamRef) and term.name in values:
            return L.const(values[term.name])
        return None

    memo: dict = {}         # regions share terms (a let used by several rules): each substituted once

    def regions(group):
        out = []
        for region in group:
            tight = _tighten([ir.Atom(L.substitute(a.lin, fix, memo), a.span) for a in region.atoms])
            if tight is not None:
                out.append(ir.Region(tuple(tight), region.span))
        return _dedupe(out)

    allow, deny = regions(mask.allow), regions(mask.deny)
    return ir.NormalMask(mask.name, mask.params, allow, deny, _divisors(allow + deny), mask.span)
