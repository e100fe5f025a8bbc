"""Pass 4, range analysis: :class:`~maskc.ir.NormalMask` → :class:`~maskc.ir.RangeMask`.

Invariant: each region becomes guards, lower and upper bounds on k and opaque atoms, with
``region(q, k) == static_guards and guards(q) and max(lower)(q) <= k <= min(upper)(q) and opaque(q, k)``
for every integer q and k (static guards read parameters only). An atom ``a*k + rest <= 0`` with ``a > 0``
is the upper bound ``k <= floor(-rest / a)``, with ``a < 0`` the lower bound ``k >= ceil(rest / -a)``, with ``a == 0``
a guard; one where k appears only as ``b * ((k + r) // d)`` is a bound too (:func:`maskc.analysis.chunks.floor_bound`);
an atom where k appears otherwise is opaque. A region with opaque atoms gets ``chunks``, its keys per row
as one interval per chunk of k (:func:`maskc.analysis.chunks.chunk_keys`), when its atoms read k through ``//``,
``%`` and squares that allow it, else ``inexact``: the atom that defeats the analysis, and why.
"""
from __future__ import annotations

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis.chunks import chunk_keys, floor_bound


def _bounds(region: ir.Region) -> ir.RegionBounds:
    guards: list[ir.Atom] = []
    lower: list[ir.KBound] = []
    upper: list[ir.KBound] = []
    opaque: list[ir.Atom] = []
    static: list[ir.Atom] = []
    for atom in region.atoms:
        split = F.split_k(atom.lin)
        if split is None:
            solved = floor_bound(atom.lin)
            if solved is None:
                opaque.append(atom)
            else:
                (lower if solved[1] else upper).append(solved[0])
            continue
        a, rest = split
        if a == 0:
            varies = F.depends_on_q(atom.lin) or F.depends_on_head(atom.lin) or F.lin_mentions(
                atom.lin, lambda t: isinstance(t, ir.Builtin) and t.name == "b")
            (guards if varies else static).append(atom)
        elif a > 0:
            upper.append(ir.KBound(L.scale(rest, -1), a))
        else:
            lower.append(ir.KBound(rest, -a))
    chunks = inexact = None
    if opaque:
        nest = chunk_keys(tuple(lower), tuple(upper), tuple(opaque))
        chunks, inexact = (None, nest) if isinstance(nest, ir.Inexact) else (nest, None)
    return ir.RegionBounds(tuple(guards), tuple(lower), tuple(upper), tuple(opaque), tuple(static),
                           chunks, inexact, region.span)


def analyze_ranges(mask: ir.NormalMask) -> ir.RangeMask:
    """Per region, the k-interval of each row as max/min of functions of q (see module docstring)."""
    uses_head = any(F.depends_on_head(a.lin) for r in mask.allow + mask.deny for a in r.atoms)
    return ir.RangeMask(mask.name, mask.params, tuple(_bounds(r) for r in mask.allow),
                        tuple(_bounds(r) for r in mask.deny), mask.divisors, uses_head, mask.span)
