"""C expressions for the predicate's linear forms, and the layout of the table they read.

:class:`TableLayout` places a mask's parameters in the int32 table ``mask`` points at (the layout
:func:`maskc.codegen.predicate.pack_mask_data` fills); :class:`CWriter` writes a form as a C expression over that
table, in one integer type (the predicate's ``maskc_int``, 64 or 32 bits as bind proved), hoisting the k-free
parts of per-key code into the row and, for the element path (``columns``: :mod:`maskc.codegen.elements`), the
q-free parts into the key's column values.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L

if TYPE_CHECKING:
    from maskc.codegen.tile_bits import RootTables


@dataclass(frozen=True)
class TableLayout:
    ints: tuple[str, ...]
    segments: tuple[str, ...]
    arrays: tuple[tuple[str, str, int], ...]     # (array, its segments, position among that seg's arrays)
    tables: tuple[str, ...] = ()
    floats: tuple[tuple[str, bool], ...] = ()     # (float parameter, whether it is a table): the score modifier's

    @classmethod
    def of(cls, params: tuple[ir.Param, ...]) -> "TableLayout":
        ints = tuple(p.name for p in params if p.kind == "int")
        segs = tuple(p.name for p in params if p.kind == "segments")
        arrays: list[tuple[str, str, int]] = []
        count: dict[str, int] = {}
        for p in params:
            if p.kind == "per" and p.of is not None:
                arrays.append((p.name, p.of, count.get(p.of, 0)))
                count[p.of] = count.get(p.of, 0) + 1
        return cls(ints, segs, tuple(arrays), tuple(p.name for p in params if p.kind == "table"),
                   tuple((p.name, p.kind == "float_table") for p in params if p.kind in ir.FLOAT_KINDS))

    def int_slot(self, name: str) -> int:
        return 2 + self.ints.index(name)

    def seg_slot(self, name: str) -> int:
        return 2 + len(self.ints) + self.segments.index(name)

    def array_slot(self, name: str) -> int:
        return next(i for a, _, i in self.arrays if a == name)

    def table_slot(self, name: str) -> int:
        return 2 + len(self.ints) + len(self.segments) + self.tables.index(name)

    def float_slot(self, name: str) -> int:
        return 2 + len(self.ints) + len(self.segments) + len(self.tables) + [n for n, _ in self.floats].index(name)


class CWriter:
    """C expressions for linear forms, computed in ``int_type``; k-free sub-forms of per-element code are
    hoisted per row. With ``columns``, per-element code reads the key as ``col.k`` and its q-free sub-forms
    that read k (a key's image row and column) are hoisted into ``col_values``, computed once per key column
    and tile (:mod:`maskc.codegen.elements`); per-element code then combines row and column values only."""

    def __init__(self, layout: TableLayout, constants: dict[str, int], int_type: str = "maskc_int",
                 columns: bool = False):
        self.layout = layout
        self.constants = constants
        self.int_type = int_type
        self.columns = columns
        self.row_values: list[tuple[str, str, str]] = []     # (field, C type, C expression)
        self.col_values: list[tuple[str, str, str]] = []     # (field, C type, C expression of k), with columns
        self._hoisted: dict = {}
        self._col_hoisted: dict = {}
        self.row_segments: dict[str, str] = {}               # seg name -> local variable at q
        self.col_segments: dict[str, str] = {}               # seg name -> local variable at k (column values)
        # the chunk nests' roots of u - w * d**2 (u fixed per work item) read from a table when given one
        # (maskc.codegen.tile_bits.RootTables); elsewhere every root is computed
        self.roots: RootTables | None = None

    # -- leaves ----------------------------------------------------------------------------
    def segment_var(self, seg: str, pos: str) -> str:
        i = self.layout.segments.index(seg)
        if pos == "q":
            return self.row_segments.setdefault(seg, f"seg{i}_q")
        return self.col_segments.setdefault(seg, f"seg{i}_k")

    def leaf(self, t, pos_ctx: str) -> str:
        row_scoped = (isinstance(t, ir.Pos) and t.which == "q") or (isinstance(t, ir.Builtin) and t.name in "hb")
        if pos_ctx == "k" and row_scoped:       # mask_visible sees only the row and k
            name = t.which if isinstance(t, ir.Pos) else t.name
            if (name, "int", name) not in self.row_values:
                self.row_values.append((name, "int", name))
            return f"row.{name}"
        if pos_ctx == "k" and self.columns and isinstance(t, ir.Pos):     # the element test: row and column
            return "col.k"
        if isinstance(t, ir.Pos):
            return t.which
        if isinstance(t, ir.ChunkVar):
            return f"j{t.level}"
        if isinstance(t, ir.Builtin):
            return {"seq_len": "mask[0]", "kv_len": "mask[1]", "h": "h", "b": "b"}[t.name]
        if isinstance(t, ir.ParamRef):
            if t.name in self.constants:          # compiled in: division by it becomes a multiply-shift
                return f"({self.constants[t.name]})"
            return f"mask[{self.layout.int_slot(t.name)}]"
        if isinstance(t, ir.SegAttr):
            var = self.segment_var(t.seg, t.pos)
            return {"index": f"{var}.index", "start": f"{var}.start", "end": f"{var}.end",
                    "length": f"({var}.end - {var}.start)"}[t.attr]
        if isinstance(t, ir.SegValue):
            var = self.segment_var(t.seg, t.pos)
            table = f"(mask + mask[{self.layout.seg_slot(t.seg)}])"
            slot = self.layout.array_slot(t.array)
            return (f"({var}.index >= 0 ? {table}[2 + {table}[0] + {slot} * {table}[0] + {var}.index] : 0)")
        raise TypeError(t)

    # -- forms -----------------------------------------------------------------------------
    def lin(self, lin: ir.Lin, per_element: bool = False) -> str:
        if per_element and not F.depends_on_k(lin) and not self._is_leafish(lin):
            return self.hoist(lin)
        if per_element and self.columns and not F.depends_on_q(lin) and not self._is_leafish(lin):
            return self.hoist_column(lin)
        parts = []
        for t, c in lin.terms:
            leaf = isinstance(t, (ir.Pos, ir.Builtin, ir.ParamRef))
            hoist = per_element and not F.term_depends_on_k(t) and not leaf
            column = per_element and self.columns and not hoist and not leaf and not F.term_depends_on_q(t)
            text = (self.hoist(L.of_term(t)) if hoist else self.hoist_column(L.of_term(t)) if column
                    else self.term(t, per_element))
            parts.append((c, text))
        out = ""
        for c, text in parts:
            mag = abs(c)
            piece = text if mag == 1 else f"{mag} * {text}"
            out += (" - " if c < 0 else " + ") + piece if out else ("-" if c < 0 else "") + piece
        if lin.const or not out:
            out = f"{out} {'-' if lin.const < 0 else '+'} {abs(lin.const)}" if out else str(lin.const)
        return f"({out})" if len(lin.terms) + bool(lin.const) > 1 else out

    @staticmethod
    def _is_leafish(lin: ir.Lin) -> bool:
        """A constant or a single leaf: cheaper to write out than to read from the row (and a constant
        divisor stays a literal, which the compiler turns into a multiply and shift)."""
        return L.is_const(lin) or (len(lin.terms) <= 1 and isinstance(L.single_term(lin), (ir.Pos, ir.Builtin,
                                                                                             ir.ParamRef)))

    def hoist(self, lin: ir.Lin) -> str:
        """A per-row value: computed once in mask_row, read by mask_visible."""
        name = self._hoisted.get(lin)
        if name is None:
            name = self._hoisted[lin] = f"v{len(self._hoisted)}"
            self.row_values.append((name, self.int_type, self.lin(lin)))
        return f"row.{name}"

    def element_test(self, lin: ir.Lin) -> str:
        """``lin <= 0`` for the element path (a writer with ``columns``), its terms that read no k and its constant
        moved to the right as one row value, and its terms that read no q summed into one column value: a pair
        pays only for the terms that read both, ``mixed + col <= row`` (CLEAR's disc: two squares, an add and a
        compare). Each side fits where the form does: bind's width proof bounds the sum of every term's magnitude
        (:meth:`maskc.analysis.bounds.Bounds.of_lin`: every partial sum, in any order)."""
        by_k = [(t, c) for t, c in lin.terms if F.term_depends_on_k(t)]
        if not by_k:
            return f"{self.lin(lin, per_element=True)} <= 0"
        right = ir.Lin(tuple((t, -c) for t, c in lin.terms if not F.term_depends_on_k(t)), -lin.const)
        mixed = ir.Lin(tuple((t, c) for t, c in by_k if F.term_depends_on_q(t)), 0)
        column = ir.Lin(tuple((t, c) for t, c in by_k if not F.term_depends_on_q(t)), 0)
        left = " + ".join(self.lin(part, per_element=True) for part in (mixed, column) if part.terms)
        return f"{left} <= {self.lin(right, per_element=True)}"

    def hoist_column(self, lin: ir.Lin) -> str:
        """A per-key value (q-free, reads k): computed once per key column and tile in mask_element_col, read by
        the element test as ``col.c{n}``."""
        name = self._col_hoisted.get(lin)
        if name is None:
            name = self._col_hoisted[lin] = f"c{len(self._col_hoisted)}"
            self.col_values.append((name, self.int_type, self.lin(lin)))
        return f"col.{name}"

    def term(self, t, per_element: bool) -> str:
        if isinstance(t, ir.Square):
            base = self.lin(t.base, per_element)
            return f"({base} * {base})"
        if isinstance(t, ir.Product):
            return f"({self.lin(t.left, per_element)} * {self.lin(t.right, per_element)})"
        if isinstance(t, ir.Floor):
            num, den = self.lin(t.num, per_element), self.lin(t.den, per_element)
            shift = _log2_of(self.const_value(t.den))
            if shift is not None:      # floor semantics of an arithmetic shift and a mask on two's complement
                return f"({self.cast(num)} >> {shift})" if t.op == "//" else f"({self.cast(num)} & {(1 << shift) - 1})"
            fn = "maskc_floordiv" if t.op == "//" else "maskc_floormod"
            return f"{fn}({self.cast(num)}, {self.cast(den)})"
        if isinstance(t, ir.Root):
            arg = self.lin(t.arg, per_element)
            read = self.roots.match(t.arg) if self.roots is not None else None
            if read is not None:
                root_table, d = read
                return f"mask_root<{root_table}>(roots, {self.cast(self.lin(d, per_element))}, {self.cast(arg)})"
            return f"({self.int_type})maskc_isqrt({arg})"
        if isinstance(t, ir.Extreme):
            fn = "min" if t.fn == "min" else "max"
            args = [self.lin(a, per_element) for a in t.args]
            out = args[0]
            for a in args[1:]:
                out = f"{fn}({self.cast(out)}, {self.cast(a)})"
            return out
        if isinstance(t, ir.Bits):
            a, b = self.lin(t.left, per_element), self.lin(t.right, per_element)
            if t.op in ("<<", ">>"):
                if not b.isdigit():     # in range at every real position (bind); clamped past the ends
                    b = f"min(max({self.cast(b)}, ({self.int_type})0), ({self.int_type}){ir.MAX_SHIFT})"
                # in 64 bits (a shift of an int by 32 or more is undefined), << through unsigned (a left shift
                # of a negative value is undefined in C++17); >> of a signed value floors
                cast = "unsigned long long" if t.op == "<<" else "long long"
                return f"({self.int_type})(({cast})({a}) {t.op} {b})"
            return f"({self.cast(a)} {t.op} {self.cast(b)})"
        if isinstance(t, ir.Lookup):            # in range at every real position (bind); clamped past the ends
            table = f"(mask + mask[{self.layout.table_slot(t.table)}])"
            index = (f"min(max({self.cast(self.lin(t.index, per_element))}, ({self.int_type})0), "
                     f"({self.int_type}){table}[0] - 1)")
            return f"({self.int_type}){table}[1 + {index}]"
        if isinstance(t, ir.SegBound):          # bounds[clip(index, 0, n)] of a segments table [n, bounds ...]
            table = f"(mask + mask[{self.layout.seg_slot(t.seg)}])"
            index = (f"min(max({self.cast(self.lin(t.index, per_element))}, ({self.int_type})0), "
                     f"({self.int_type}){table}[0])")
            return f"({self.int_type}){table}[1 + {index}]"
        return f"({self.int_type}){self.leaf(t, 'k' if per_element else 'q')}"

    def k_bound(self, bound: ir.KBound, lower: bool) -> str:
        """A KBound as a C expression: ``ceil(lin / den)`` (lower) or ``floor(lin / den)`` (upper)."""
        value = self.cast(self.lin(bound.lin))
        if bound.den == 1:
            return value
        fn = "maskc_ceildiv" if lower else "maskc_floordiv"
        return f"{fn}({value}, ({self.int_type}){bound.den})"

    def extreme(self, fn: str, first: str, bounds: tuple[ir.KBound, ...], lower: bool) -> str:
        """``fn`` (max or min) of ``first`` and every bound, as nested C calls in ``int_type``."""
        out = first
        for b in bounds:
            out = f"{fn}({self.cast(out)}, {self.k_bound(b, lower)})"
        return out

    def cast(self, expr: str) -> str:
        """``expr`` as an ``int_type`` operand of min/max or of a helper template (CUDA has no mixed-width
        overloads), cast once."""
        prefix = f"({self.int_type})"
        if expr.startswith(prefix) and _PRIMARY.fullmatch(expr[len(prefix):]):
            return expr
        if expr.startswith(("max(", "min(", "maskc_floordiv(", "maskc_ceildiv(", "maskc_floormod(")):
            return expr             # this writer's min/max and helpers take and return int_type
        return f"{prefix}{expr}"

    def const_value(self, lin: ir.Lin) -> int | None:
        """The value of a form that is a literal or a const parameter compiled in, else None."""
        if L.is_const(lin):
            return lin.const
        term = L.single_term(lin) if len(lin.terms) == 1 and not lin.const else None
        if isinstance(term, ir.ParamRef) and term.name in self.constants and lin.terms[0][1] == 1:
            return self.constants[term.name]
        return None


_PRIMARY = re.compile(r"\(-?\d+\)|-?\d+|[A-Za-z_][\w.]*(\[\d+\])?")   # what a cast applies to whole


def _log2_of(value: int | None) -> int | None:
    """n where ``value == 2**n`` (n >= 1), else None."""
    return value.bit_length() - 1 if value is not None and value > 1 and value & (value - 1) == 0 else None
