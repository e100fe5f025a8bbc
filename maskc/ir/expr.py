"""Stage 2 of the IR, the resolved expressions (resolve): integer expressions (``IntExpr``) and conditions
(``Cond``) as separate types, names resolved to positions, built-ins, parameters, segment attributes and table
entries; the vocabulary they draw on (positions, built-ins, segment attributes, bit operations)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from maskc.errors import Span
from maskc.ir.base import span_field as _span

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
