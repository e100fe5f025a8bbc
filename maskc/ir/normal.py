"""Stage 3 of the IR, the normal form (normalize): a union of conjunctions of canonical linear atoms
``lin <= 0``, whose non-linear terms (squares, products, floors, lookups, ...) are kept whole."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from maskc.errors import Span
from maskc.ir.base import HashOnce
from maskc.ir.base import span_field as _span
from maskc.ir.expr import Builtin, ParamRef, Pos, SegAttr, SegValue
from maskc.ir.resolved import Param


@dataclass(frozen=True)
class Lin(HashOnce):
    """``sum(coef * term) + const`` with integer coefficients; terms sorted, no zero coefficients.

    A term is any IntExpr that is not itself a sum or a constant multiple: ``Pos``, ``Builtin``,
    ``ParamRef``, ``SegAttr``, ``SegValue``, or a non-linear ``Square``, ``Product``, ``Floor``, ``Extreme``,
    ``Bits``, ``Lookup``, ``Root``.
    """

    __hash__ = HashOnce.__hash__

    terms: tuple[tuple["Term", int], ...]
    const: int = 0

    def coef(self, term) -> int:
        return next((c for t, c in self.terms if t == term), 0)


@dataclass(frozen=True)
class Square(HashOnce):
    """``base * base`` kept whole, so interval bounds stay tight (never below zero)."""

    __hash__ = HashOnce.__hash__

    base: Lin


@dataclass(frozen=True)
class Product(HashOnce):
    __hash__ = HashOnce.__hash__

    left: Lin
    right: Lin


@dataclass(frozen=True)
class Floor(HashOnce):
    """``num // den`` (op "//") or ``num % den`` (op "%"), floored as in Python; den > 0 at bind."""

    __hash__ = HashOnce.__hash__

    op: str
    num: Lin
    den: Lin


@dataclass(frozen=True)
class Extreme(HashOnce):
    """``min``/``max``/``abs`` of linear forms that stayed whole (they do not depend on k)."""

    __hash__ = HashOnce.__hash__

    fn: str
    args: tuple[Lin, ...]


@dataclass(frozen=True)
class Bits(HashOnce):
    """``left op right`` for a bit operation (:data:`BIT_OPS`) that stayed whole: as in Python (two's
    complement of any width; ``>>`` floors). Shifts by a constant and ``x & (2**n - 1)`` never stay whole
    (they are ``//``, ``*`` and ``%``); shift amounts lie in [0, MAX_SHIFT] at bind."""

    op: str
    left: Lin
    right: Lin


@dataclass(frozen=True)
class Lookup(HashOnce):
    """``table[index]``: the entry of a table parameter at a form; in range at bind. A table of several
    dimensions is read at its row-major index (``t[i, j]`` of a table[n, m] at ``i * m + j``)."""

    table: str
    index: Lin


@dataclass(frozen=True)
class SegBound(HashOnce):
    """``bounds[clip(index, 0, n)]`` of the segments ``seg`` (n segments): where segment ``index`` starts (and
    segment ``index - 1`` ends). Normalize writes it for ``same(A, B)``: k's segment of B is the one numbered
    by q's segment of A, so k lies in [SegBound(B, A.index(q)), SegBound(B, A.index(q) + 1))."""

    __hash__ = HashOnce.__hash__

    seg: str
    index: Lin


@dataclass(frozen=True)
class ChunkVar(HashOnce):
    """``J<level>``: the index of a chunk of keys, ``J1 = (k + offset) // size``, ``J2 = (J1 + offset) // size``,
    ... (see :class:`ChunkedKeys`). Appears only in the bounds of a ChunkedKeys nest."""

    __hash__ = HashOnce.__hash__

    level: int


@dataclass(frozen=True)
class Root(HashOnce):
    """``isqrt(arg)``: the floor of the square root of a form; read only where the form is >= 0 (a bound
    with a Root comes with the atom ``-arg <= 0`` that guarantees it)."""

    __hash__ = HashOnce.__hash__

    arg: Lin


Term = Union[Pos, Builtin, ParamRef, SegAttr, SegValue, Square, Product, Floor, Extreme, Bits, Lookup, SegBound, ChunkVar,
             Root]


@dataclass(frozen=True)
class Atom:
    """The canonical literal ``lin <= 0``. Linear in k iff k appears only as the term ``Pos('k')``."""

    lin: Lin
    span: Span = _span()


@dataclass(frozen=True)
class Region:
    """A conjunction of atoms: a region of the (q, k) plane."""

    atoms: tuple[Atom, ...]
    span: Span = _span()


@dataclass(frozen=True)
class NormalMask:
    """visible(q, k) = any(allow regions) and not any(deny regions)."""

    name: str
    params: tuple[Param, ...]
    allow: tuple[Region, ...]
    deny: tuple[Region, ...]
    divisors: tuple[Lin, ...] = ()      # every divisor, inner ones first: each must be > 0 at bind
    span: Span = _span()
