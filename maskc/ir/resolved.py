"""Stage 2 of the IR, the resolved mask (resolve): typed parameters, rules over resolved conditions, and
the score modifier as a float expression; lets and mask calls inlined (the expressions are in
:mod:`maskc.ir.expr`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from maskc.errors import Span
from maskc.ir.base import span_field as _span
from maskc.ir.expr import Cond, IntExpr

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
# expressions (converted to float after they are computed as integers). See :mod:`maskc.analysis.score`.

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
