"""Stage 4 of the IR, region bounds (ranges): per region, k between max(lower) and min(upper) given q;
chunked keys for regions exact per chunk, and why the others are only sound."""
from __future__ import annotations

from dataclasses import dataclass

from maskc.errors import Span
from maskc.ir.base import span_field as _span
from maskc.ir.normal import Atom, Lin, Term
from maskc.ir.resolved import Param


@dataclass(frozen=True)
class KBound:
    """A bound on k for one row: ``k >= ceil(lin / den)`` (lower) or ``k <= floor(lin / den)``
    (upper), ``lin`` free of k, ``den`` a positive integer."""

    lin: Lin
    den: int


@dataclass(frozen=True)
class ChunkLevel:
    """One variable of a :class:`ChunkedKeys` nest and the rows' bounds on it.

    ``var`` is k at level 0 and ``ChunkVar(i)`` at level i. ``lower``/``upper`` bound it as KBounds bound k
    (``var >= ceil(lin / den)``, ``var <= floor(lin / den)``), each ``lin`` a form of q and of the variables
    of the levels above (never of this level's or those below). Every level but the top is cut into chunks
    by the next variable, ``next = (var + offset) // size`` (``offset`` free of every variable, ``size`` a
    positive form of parameters), and its bounds include the chunk's range ``size * next - offset <= var
    <= size * next - offset + size - 1``.
    """

    var: Term
    lower: tuple[KBound, ...]
    upper: tuple[KBound, ...]
    offset: Lin | None = None           # None at the top level
    size: Lin | None = None


@dataclass(frozen=True)
class ChunkedKeys:
    """A region's visible keys, per row, as one interval per chunk: exact for regions in which k enters
    through ``//`` and ``%`` by divisors known at bind (image rows, frames, chunks) and through squares.

    For a row q where the region's guards and ``guards`` hold, the visible keys are::

        for J_n in [max(levels[n].lower)(q), min(levels[n].upper)(q)]:          # the top level first
          ...
            for J_1 in [max(levels[1].lower)(q, J_2..J_n), min(levels[1].upper)(q, J_2..J_n)]:
              keys [max(levels[0].lower)(q, J_1..J_n), min(levels[0].upper)(q, J_1..J_n)], within [0, kv_len)

    Each level's bounds hold its chunk's range, so a row's intervals are disjoint and ascending in k;
    within one chunk every ``//`` and ``%`` of k is constant or k plus a constant, which is what makes
    the innermost bounds linear in k. A bound may read ``Root`` (isqrt): a disc ``(x(q) - x(k))**2 +
    (y(q) - y(k))**2 < r**2`` gives, per image row J_1, ``|x(q) - x(k)| <= isqrt(r**2 - 1 - (y(q) - J_1)**2)``,
    with ``(y(q) - J_1)**2 <= r**2 - 1`` (again a Root bound) one level up. ``guards`` are atoms on q alone
    that the derivation implied (free of every variable). The region's opaque atoms hold wherever these
    bounds say so: the per-pair predicate and these intervals denote the same keys.
    """

    levels: tuple[ChunkLevel, ...]      # level 0 (k) first
    guards: tuple[Atom, ...] = ()


@dataclass(frozen=True)
class Inexact:
    """Why a region's tile classes are only sound: the first atom the analysis could not solve for k,
    and the reason in words (the atom's span points at the user's text)."""

    atom: Atom
    reason: str


@dataclass(frozen=True)
class RegionBounds:
    """One region as per-row k bounds.

    ``guards``: atoms free of k that must hold for the row (``static_guards``: those free of q, h and
    b too, checked once per batch element). ``lower``/``upper``: the row's visible
    keys are ``max(lower) <= k <= min(upper)`` (clipped to [0, kv_len)). ``opaque``: atoms that
    depend on k non-linearly, checked per element; a region with none is *exact*: its rows' visible
    keys form one interval that the passes compute without approximation (the region is *linear*).
    A region with opaque atoms is still exact when ``chunks`` describes its keys per row as one
    interval per chunk (:class:`ChunkedKeys`); else ``inexact`` says which atom defeats the analysis
    and why, and its tiles are only bounded soundly.
    """

    guards: tuple[Atom, ...]
    lower: tuple[KBound, ...]
    upper: tuple[KBound, ...]
    opaque: tuple[Atom, ...]
    static_guards: tuple[Atom, ...] = ()   # guards on parameters alone: whether the region exists at all
    chunks: ChunkedKeys | None = None      # opaque regions only: exact keys, one interval per chunk
    inexact: Inexact | None = None         # opaque regions without chunks: why
    span: Span = _span()

    @property
    def forms(self) -> tuple[Lin, ...]:
        """Every form the region's bounds, guards and opaque atoms read (what the kernels compute)."""
        return tuple(b.lin for b in self.lower + self.upper) + tuple(
            a.lin for a in self.guards + self.static_guards + self.opaque)

    @property
    def linear(self) -> bool:
        """One interval of keys per row, from ``lower`` and ``upper`` alone."""
        return not self.opaque

    @property
    def exact(self) -> bool:
        """Tile classes are exact: linear, or chunked."""
        return not self.opaque or self.chunks is not None


@dataclass(frozen=True)
class RangeMask:
    name: str
    params: tuple[Param, ...]
    allow: tuple[RegionBounds, ...]
    deny: tuple[RegionBounds, ...]
    divisors: tuple[Lin, ...] = ()
    uses_head: bool = False             # some bound or atom reads h: tiles must hold for every head
    span: Span = _span()

    @property
    def exact(self) -> bool:
        """True when every tile class this mask gets is exact, not merely sound."""
        return all(r.exact for r in self.allow + self.deny)

    @property
    def linear(self) -> bool:
        """True when every region is linear in k: one interval of keys per row and region."""
        return all(r.linear for r in self.allow + self.deny)

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)
