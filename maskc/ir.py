"""maskc's compile-time IR, in stage order: syntax tree → resolved mask → normal form → region bounds.

Every node is a frozen dataclass; collections are tuples. A node built from source carries a
:class:`~maskc.errors.Span` that takes no part in equality, so passes can compare and deduplicate
nodes structurally while diagnostics still point at the user's text. Each stage has its own top-level
type (``SourceFile``, ``ResolvedMask``, ``NormalMask``, ``RangeMask``): running passes out of order
is a type error, not a silent mistake. The run-time stages are in :mod:`maskc.kernel_ir`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from maskc.errors import NO_SPAN, Span


def _span() -> Span:
    return field(default=NO_SPAN, compare=False, repr=False)


class _HashOnce:
    """For the normal form's nested terms: hash once, then reuse (they key the evaluators' memos).

    A subclass repeats ``__hash__ = _HashOnce.__hash__`` in its body: a frozen dataclass otherwise gets
    a generated __hash__ that rehashes the whole tree on every call. The cached hash is not pickled (string
    hashes differ between processes)."""

    def __hash__(self):
        cached = self.__dict__.get("_hash")
        if cached is None:
            cached = hash((type(self).__name__,) + tuple(getattr(self, f) for f in self.__dataclass_fields__
                                                         if self.__dataclass_fields__[f].compare))
            object.__setattr__(self, "_hash", cached)
        return cached

    def __getstate__(self):
        return {k: v for k, v in self.__dict__.items() if k != "_hash"}


# ---------------------------------------------------------------------------------------------
# Stage 1 — syntax tree (parse): what the user wrote, names unresolved.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Num:
    value: int
    span: Span = _span()


@dataclass(frozen=True)
class FloatNum:
    """A float literal (``30.0``, ``1e-3``): score modifiers and float parameters' defaults only."""

    value: float
    span: Span = _span()


@dataclass(frozen=True)
class Name:
    id: str
    span: Span = _span()


@dataclass(frozen=True)
class BoolLit:
    value: bool
    span: Span = _span()


@dataclass(frozen=True)
class BinOp:
    op: str                     # + - * // % ** & | ^ << >>
    left: "Syntax"
    right: "Syntax"
    span: Span = _span()


@dataclass(frozen=True)
class UnaryMinus:
    operand: "Syntax"
    span: Span = _span()


@dataclass(frozen=True)
class Invert:
    """``~operand``: Python's bitwise not, ``-operand - 1``."""

    operand: "Syntax"
    span: Span = _span()


@dataclass(frozen=True)
class Subscript:
    """``table[i]`` or ``table[i, j]``: an entry of a table parameter."""

    table: str
    indices: tuple["Syntax", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Arg:
    name: str | None            # None for a positional argument
    value: "Syntax"
    span: Span = _span()


@dataclass(frozen=True)
class Call:
    func: str
    args: tuple[Arg, ...]
    span: Span = _span()


@dataclass(frozen=True)
class MethodCall:
    obj: str                    # a segments parameter
    method: str                 # start, end, length, index
    args: tuple[Arg, ...]
    span: Span = _span()


@dataclass(frozen=True)
class Compare:
    """A chain ``a < b <= c`` means ``a < b and b <= c``."""

    operands: tuple["Syntax", ...]
    ops: tuple[str, ...]
    span: Span = _span()


@dataclass(frozen=True)
class InRange:
    value: "Syntax"
    low: "Syntax"
    high: "Syntax"
    low_closed: bool
    high_closed: bool
    negated: bool
    span: Span = _span()


@dataclass(frozen=True)
class BoolOp:
    op: str                     # and, or
    operands: tuple["Syntax", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Not:
    operand: "Syntax"
    span: Span = _span()


Syntax = Union[Num, FloatNum, Name, BoolLit, BinOp, UnaryMinus, Invert, Subscript, Call, MethodCall, Compare, InRange, BoolOp,
               Not]


@dataclass(frozen=True)
class ParamDecl:
    name: str
    kind: str                   # "int", "const" (an int fixed when the kernel is built), "segments", "per", "table",
                                # "float" (one float), "float_table" (a list of floats; of="h": one per head)
    default: Syntax | None      # int and float parameters and per-arrays only
    origin: Syntax | None       # segments: where the partitioned range starts (default 0)
    of: str | None              # per: the segments parameter it is indexed by, or "h" (one value per head)
    over: str = "q"             # segments: the positions they partition, "q" ([0, seq_len)) or "k" ([0, kv_len))
    sizes: tuple[Syntax, ...] | None = None     # table: its declared sizes (table[n] or table[n, m]); per h table too
    span: Span = _span()


@dataclass(frozen=True)
class LetDecl:
    name: str
    args: tuple[str, ...]       # empty for a plain value
    value: Syntax
    span: Span = _span()


@dataclass(frozen=True)
class RuleDecl:
    kind: str                   # "allow", "deny" or "require"
    conditions: tuple[Syntax, ...]
    span: Span = _span()


@dataclass(frozen=True)
class ScoreDecl:
    """``score = value``: one statement of the mask's score modifier."""

    value: Syntax
    span: Span = _span()


@dataclass(frozen=True)
class MaskDecl:
    name: str
    params: tuple[ParamDecl, ...]
    lets: tuple[LetDecl, ...]
    rules: tuple[RuleDecl, ...]     # allow and deny rules, and require checks, in source order
    span: Span = _span()
    scores: tuple[ScoreDecl, ...] = ()  # the score modifier's statements, in source order


@dataclass(frozen=True)
class ImportDecl:
    path: str
    span: Span = _span()


@dataclass(frozen=True)
class SourceFile:
    path: str
    imports: tuple[ImportDecl, ...]
    masks: tuple[MaskDecl, ...]


# ---------------------------------------------------------------------------------------------
# Stage 2 — resolved mask (resolve): typed expressions; lets and mask calls inlined.
# Integer expressions (IntExpr) and conditions (Cond) are separate types.
# ---------------------------------------------------------------------------------------------

POSITIONS = ("q", "k")
BUILTINS = ("seq_len", "kv_len", "h", "b")
SEGMENT_ATTRS = ("start", "end", "length", "index")


@dataclass(frozen=True)
class Const:
    value: int
    span: Span = _span()


@dataclass(frozen=True)
class Pos:
    """The query position ``q`` or the key position ``k``."""

    which: str
    span: Span = _span()


@dataclass(frozen=True)
class Builtin:
    name: str                   # seq_len, kv_len, h, b
    span: Span = _span()


@dataclass(frozen=True)
class ParamRef:
    name: str                   # an int parameter
    span: Span = _span()


@dataclass(frozen=True)
class SegAttr:
    """``seg.attr(pos)``: an attribute of the segment holding position q or k.

    Positions outside the partitioned range have index -1 and belong to a virtual gap segment
    (before the range: [0, origin); after it: [end, infinity)), so ``same`` never holds for them.
    """

    seg: str
    attr: str                   # start, end, length, index
    pos: str                    # q or k
    span: Span = _span()


@dataclass(frozen=True)
class SegValue:
    """``array(pos)``: the entry of a per-segment array for the segment holding q or k (0 outside)."""

    array: str
    seg: str
    pos: str
    span: Span = _span()


@dataclass(frozen=True)
class TableAt:
    """``table[i]`` or ``table[i, j]``: an entry of a table parameter, one index per dimension (a per-head
    parameter ``w: per h`` reads as ``w[h]``, a per-head table ``t: per h table[n]`` read ``t[i]`` as
    ``t[h, i]``); bind proves every index in range for every position and head."""

    table: str
    indices: tuple["IntExpr", ...]
    strides: tuple["IntExpr", ...]      # row-major, one per index: the entry is values[sum(index * stride)]
    span: Span = _span()


BIT_OPS = ("&", "|", "^", "<<", ">>")
MAX_SHIFT = 62
"""Shift amounts run from 0 to MAX_SHIFT: every value maskc computes fits in 63 bits (:mod:`maskc.analysis.widths`)."""


@dataclass(frozen=True)
class Arith:
    op: str                     # + - * // % and the BIT_OPS
    left: "IntExpr"
    right: "IntExpr"
    span: Span = _span()


@dataclass(frozen=True)
class Func:
    fn: str                     # min, max, abs
    args: tuple["IntExpr", ...]
    span: Span = _span()


IntExpr = Union[Const, Pos, Builtin, ParamRef, SegAttr, SegValue, TableAt, Arith, Func]


@dataclass(frozen=True)
class Truth:
    value: bool
    span: Span = _span()


@dataclass(frozen=True)
class Cmp:
    op: str                     # < <= == != >= >
    left: IntExpr
    right: IntExpr
    span: Span = _span()


@dataclass(frozen=True)
class Same:
    """``same(seg)``: q and k lie in one segment of ``seg`` (both inside its range). ``same(seg, key_seg)``:
    q's segment of ``seg`` and k's segment of ``key_seg`` have the same index (q inside ``seg``'s range):
    text segments of the queries matched to image segments of the keys, say."""

    seg: str
    key_seg: str | None = None  # None: seg
    span: Span = _span()

    @property
    def k_seg(self) -> str:
        """The segments k is looked up in."""
        return self.key_seg or self.seg


@dataclass(frozen=True)
class All:
    items: tuple["Cond", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Any_:
    items: tuple["Cond", ...]
    span: Span = _span()


@dataclass(frozen=True)
class Negate:
    item: "Cond"
    span: Span = _span()


Cond = Union[Truth, Cmp, Same, All, Any_, Negate]


FLOAT_KINDS = ("float", "float_table")
"""Parameter kinds that only a score modifier reads (they never enter the mask's analyses)."""


@dataclass(frozen=True)
class Param:
    """A typed run-time parameter of a mask."""

    name: str
    kind: str                   # "int", "segments", "per" (one value per segment), "table" (a list of values),
                                # "float", "float_table" (FLOAT_KINDS: read by the score modifier only)
    default: int | float | None = None  # int, float: the default; per, tables per h: the value of every entry
    const: bool = False         # int: its value is compiled into the kernel (one kernel per value)
    origin: IntExpr | None = None   # segments: start of the partitioned range (k- and q-free)
    of: str | None = None       # per: the segments parameter; table: "h" for one value (or row) per head, else None
    over: str = "q"             # segments: "q" partitions [origin, seq_len), "k" partitions [origin, kv_len)
    shape: tuple[IntExpr, ...] | None = None   # table: declared sizes, one per index (None: one index, any length)
    span: Span = _span()

    @property
    def dims(self) -> int:
        """A table's indices as written: ``w: per h`` 0, ``t: table`` 1, ``t: table[n, m]`` 2."""
        if self.shape is not None:
            return len(self.shape)
        return 0 if self.of == "h" else 1


@dataclass(frozen=True)
class Rule:
    kind: str                   # allow, deny, or require (a bind-time check, free of k)
    cond: Cond
    span: Span = _span()


# Score modifiers (resolve): a float expression of the incoming score, float parameters and integer
# expressions (converted to float after they are computed as integers). See :mod:`maskc.score`.

@dataclass(frozen=True)
class ScoreIn:
    """The score the modifier receives: ``scale * (q_vec . k_vec)`` of one visible pair (or the value of
    the statements before, for the second statement on)."""

    span: Span = _span()


@dataclass(frozen=True)
class FloatConst:
    value: float
    span: Span = _span()


@dataclass(frozen=True)
class FloatParam:
    """A ``float`` parameter's value."""

    name: str
    span: Span = _span()


@dataclass(frozen=True)
class FloatAt:
    """An entry of a ``float table`` (a ``float per h`` reads as ``FloatAt(name, h)``); in range at bind."""

    table: str
    index: IntExpr
    span: Span = _span()


@dataclass(frozen=True)
class ToFloat:
    """An integer expression, computed exactly as an integer, then rounded to float."""

    value: IntExpr
    span: Span = _span()


@dataclass(frozen=True)
class FArith:
    op: str                     # + - * /
    left: "ScoreExpr"
    right: "ScoreExpr"
    span: Span = _span()


@dataclass(frozen=True)
class FCall:
    fn: str                     # softcap(x, cap) = cap * tanh(x / cap); tanh(x)
    args: tuple["ScoreExpr", ...]
    span: Span = _span()


ScoreExpr = Union[ScoreIn, FloatConst, FloatParam, FloatAt, ToFloat, FArith, FCall]


@dataclass(frozen=True)
class ScoreMod:
    """A mask's score modifier: ``expr`` is what a visible pair's scaled score becomes before the softmax
    (its statements composed into one expression; ``ScoreIn`` is the incoming score)."""

    expr: ScoreExpr
    span: Span = _span()


@dataclass(frozen=True)
class ResolvedMask:
    """A mask with every name resolved: visible(q, k) = any(allow) and not any(deny); ``score``: how a
    visible pair's scaled score is modified before the softmax (None: unchanged)."""

    name: str
    params: tuple[Param, ...]
    rules: tuple[Rule, ...]
    span: Span = _span()
    score: ScoreMod | None = None

    @property
    def allow(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == "allow")

    @property
    def deny(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == "deny")

    @property
    def requires(self) -> tuple[Rule, ...]:
        return tuple(r for r in self.rules if r.kind == "require")

    def param(self, name: str) -> Param:
        return next(p for p in self.params if p.name == name)


# ---------------------------------------------------------------------------------------------
# Stage 3 — normal form (normalize): a union of conjunctions of canonical linear atoms.
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Lin(_HashOnce):
    """``sum(coef * term) + const`` with integer coefficients; terms sorted, no zero coefficients.

    A term is any IntExpr that is not itself a sum or a constant multiple: ``Pos``, ``Builtin``,
    ``ParamRef``, ``SegAttr``, ``SegValue``, or a non-linear ``Square``, ``Product``, ``Floor``, ``Extreme``,
    ``Bits``, ``Lookup``, ``Root``.
    """

    __hash__ = _HashOnce.__hash__

    terms: tuple[tuple["Term", int], ...]
    const: int = 0

    def coef(self, term) -> int:
        return next((c for t, c in self.terms if t == term), 0)


@dataclass(frozen=True)
class Square(_HashOnce):
    """``base * base`` kept whole, so interval bounds stay tight (never below zero)."""

    __hash__ = _HashOnce.__hash__

    base: Lin


@dataclass(frozen=True)
class Product(_HashOnce):
    __hash__ = _HashOnce.__hash__

    left: Lin
    right: Lin


@dataclass(frozen=True)
class Floor(_HashOnce):
    """``num // den`` (op "//") or ``num % den`` (op "%"), floored as in Python; den > 0 at bind."""

    __hash__ = _HashOnce.__hash__

    op: str
    num: Lin
    den: Lin


@dataclass(frozen=True)
class Extreme(_HashOnce):
    """``min``/``max``/``abs`` of linear forms that stayed whole (they do not depend on k)."""

    __hash__ = _HashOnce.__hash__

    fn: str
    args: tuple[Lin, ...]


@dataclass(frozen=True)
class Bits(_HashOnce):
    """``left op right`` for a bit operation (:data:`BIT_OPS`) that stayed whole: as in Python (two's
    complement of any width; ``>>`` floors). Shifts by a constant and ``x & (2**n - 1)`` never stay whole
    (they are ``//``, ``*`` and ``%``); shift amounts lie in [0, MAX_SHIFT] at bind."""

    op: str
    left: Lin
    right: Lin


@dataclass(frozen=True)
class Lookup(_HashOnce):
    """``table[index]``: the entry of a table parameter at a form; in range at bind. A table of several
    dimensions is read at its row-major index (``t[i, j]`` of a table[n, m] at ``i * m + j``)."""

    table: str
    index: Lin


@dataclass(frozen=True)
class SegBound(_HashOnce):
    """``bounds[clip(index, 0, n)]`` of the segments ``seg`` (n segments): where segment ``index`` starts (and
    segment ``index - 1`` ends). Normalize writes it for ``same(A, B)``: k's segment of B is the one numbered
    by q's segment of A, so k lies in [SegBound(B, A.index(q)), SegBound(B, A.index(q) + 1))."""

    __hash__ = _HashOnce.__hash__

    seg: str
    index: Lin


@dataclass(frozen=True)
class ChunkVar(_HashOnce):
    """``J<level>``: the index of a chunk of keys, ``J1 = (k + offset) // size``, ``J2 = (J1 + offset) // size``,
    ... (see :class:`ChunkedKeys`). Appears only in the bounds of a ChunkedKeys nest."""

    __hash__ = _HashOnce.__hash__

    level: int


@dataclass(frozen=True)
class Root(_HashOnce):
    """``isqrt(arg)``: the floor of the square root of a form; read only where the form is >= 0 (a bound
    with a Root comes with the atom ``-arg <= 0`` that guarantees it)."""

    __hash__ = _HashOnce.__hash__

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


# ---------------------------------------------------------------------------------------------
# Stage 4 — region bounds (ranges): per region, k between max(lower) and min(upper) given q.
# ---------------------------------------------------------------------------------------------

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
