"""maskc's compile-time IR, in stage order: syntax tree → resolved mask → normal form → region bounds.

Every node is a frozen dataclass; collections are tuples. A node built from source carries a
:class:`~maskc.errors.Span` that takes no part in equality, so passes can compare and deduplicate
nodes structurally while diagnostics still point at the user's text. Each stage has its own top-level
type (``SourceFile``, ``ResolvedMask``, ``NormalMask``, ``RangeMask``): running passes out of order
is a type error, not a silent mistake. The run-time stages are in :mod:`maskc.kernel_ir`.

One module per stage, in stage order: :mod:`maskc.ir.syntax` (parse), :mod:`maskc.ir.expr` (resolved
integer expressions and conditions), :mod:`maskc.ir.resolved` (parameters, rules, score modifiers, the
resolved mask), :mod:`maskc.ir.normal` (normalize), :mod:`maskc.ir.bounds` (ranges); :mod:`maskc.ir.base`
holds what they share. This package re-exports every node, so passes read ``ir.Lin``, ``ir.Cmp``, ...
Two modules of functions over resolved expressions are imported by name: :mod:`maskc.ir.walk` (DAG walks:
nodes, mentions, nesting) and :mod:`maskc.ir.text` (expressions and conditions as .mask text).
"""
from __future__ import annotations

from maskc.ir.base import HashOnce, kept_on, span_field
from maskc.ir.bounds import ChunkLevel, ChunkedKeys, Inexact, KBound, RangeMask, RegionBounds
from maskc.ir.expr import (BIT_OPS, BUILTINS, MAX_SHIFT, POSITIONS, SEGMENT_ATTRS, All, Any_, Arith, Builtin, Cmp,
                           Cond, Const, Func, IntExpr, Negate, ParamRef, Pos, Same, SegAttr, SegValue, TableAt, Truth)
from maskc.ir.normal import (Atom, Bits, ChunkVar, Extreme, Floor, Lin, Lookup, NormalMask, Product, Region, Root,
                             SegBound, Square, Term)
from maskc.ir.resolved import (FLOAT_KINDS, FArith, FCall, FloatAt, FloatConst, FloatParam, Param, ResolvedMask,
                               Rule, ScoreExpr, ScoreIn, ScoreMod, ToFloat)
from maskc.ir.syntax import (Arg, BinOp, BoolLit, BoolOp, Call, Compare, FloatNum, ImportDecl, InRange, Invert,
                             LetDecl, MaskDecl, MethodCall, Name, Not, Num, ParamDecl, RuleDecl, ScoreDecl,
                             SourceFile, Subscript, Syntax, UnaryMinus)

__all__ = ["span_field", "HashOnce", "kept_on", "Num", "FloatNum", "Name", "BoolLit", "BinOp", "UnaryMinus", "Invert",
           "Subscript", "Arg", "Call", "MethodCall", "Compare", "InRange", "BoolOp", "Not", "Syntax", "ParamDecl",
           "LetDecl", "RuleDecl", "ScoreDecl", "MaskDecl", "ImportDecl", "SourceFile", "POSITIONS", "BUILTINS",
           "SEGMENT_ATTRS", "Const", "Pos", "Builtin", "ParamRef", "SegAttr", "SegValue", "TableAt", "BIT_OPS",
           "MAX_SHIFT", "Arith", "Func", "IntExpr", "Truth", "Cmp", "Same", "All", "Any_", "Negate", "Cond",
           "FLOAT_KINDS", "Param", "Rule", "ScoreIn", "FloatConst", "FloatParam", "FloatAt", "ToFloat", "FArith",
           "FCall", "ScoreExpr", "ScoreMod", "ResolvedMask", "Lin", "Square", "Product", "Floor", "Extreme", "Bits",
           "Lookup", "SegBound", "ChunkVar", "Root", "Term", "Atom", "Region", "NormalMask", "KBound", "ChunkLevel",
           "ChunkedKeys", "Inexact", "RegionBounds", "RangeMask"]
