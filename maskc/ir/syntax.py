"""Stage 1 of the IR, the syntax tree (parse): what the user wrote, names unresolved; a source file's
imports, masks, parameter declarations, lets, rules and score statements."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Union

from maskc.errors import Span
from maskc.ir.base import span_field as _span


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
