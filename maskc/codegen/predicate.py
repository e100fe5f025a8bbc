"""The mask's predicate as CUDA device code, and the parameter tables it reads.

``emit_predicate(range_mask)`` writes three things the kernel template calls on PARTIAL tiles::

    struct MaskRow { ... };                        // everything about one query row that k leaves alone
    MaskRow mask_row(const int* mask, int b, int h, int q);
    bool mask_visible(const MaskRow& row, const int* mask, int k);

For an exact region, ``mask_row`` computes its key interval [lo, hi] once per row, so
``mask_visible`` costs two compares per region; for a region with opaque atoms it also hoists the
atoms' k-free parts into the row. Every name from the .mask file appears only inside comments,
sanitized; C identifiers are generated (``lo0``, ``p1``, ...).

``pack_mask_data`` lays out, per batch element, the int32 table ``mask`` points at::

    mask[0] = seq_len, mask[1] = kv_len
    mask[2 + i]              int parameter i (declaration order)
    mask[2 + n_ints + s]     offset (within this table) of segments table s
    mask[2 + n_ints + n_segs + t]   offset of table parameter t (declaration order)
    segments table s:  [n, bound_0 .. bound_n, then each per-segment array of s: n entries]
    table parameter t: [n, entry_0 .. entry_n-1]     (a table per h: one entry per head)

A sub-block of a bound mask (``BoundMask.restrict``: query rows from q0, keys from k0) uses the predicate of
``emit_predicate(..., offsets=True)`` and tables packed with ``origin=(q0, k0)``: the kernel passes
positions local to the sub-block, the table starts with ``[q0, k0]`` followed by the table above, and
``mask_row`` adds q0 to the row and returns the key intervals ``[lo, hi]`` shifted by -k0 (local keys), so
the kernels' interval paths work unchanged; per-key atoms see ``k + k0``.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from maskc import ir
from maskc.analysis import linear as L
from maskc.codegen.sanitize import comment_text
from maskc.kernel_ir import BoundParams, Predicate

_WIDTHS = {
    False: "// Every form is computed in maskc_int, 64 bits (bind proves each intermediate fits: maskc.analysis.widths); the\n"
           "// kernels of bindings proved to fit in 32 bits compute in int instead.\ntypedef long long maskc_int;\n",
    True: "// Every form is computed in maskc_int, 32 bits: bind proved each intermediate fits in 32 bits for\n"
          "// positions up to a tile past the ends (maskc.analysis.widths.fits_32_bits); 64-bit forms cost several times more.\n"
          "typedef int maskc_int;\n",
}

_HELPERS = """\
// Key bounds are clamped into [-1, kv_len] before they are narrowed to int.
// Floor division and modulo as in Python (den > 0, checked when the mask was bound), for maskc_int and for
// the 64-bit chunk nests; 32-bit division when both operands fit, as they nearly always do (the test folds
// away for int). Division by a constant power of two is written as a shift or a mask instead.
template <class T>
__device__ __forceinline__ T maskc_floordiv(T num, T den) {
    if (num == (int)num && den == (int)den) {
        const int n = (int)num, d = (int)den, q = n / d;
        return (n % d != 0 && n < 0) ? q - 1 : q;
    }
    const T q = num / den;
    return (num % den != 0 && num < 0) ? q - 1 : q;
}
template <class T>
__device__ __forceinline__ T maskc_ceildiv(T num, T den) {
    return -maskc_floordiv(-num, den);
}
template <class T>
__device__ __forceinline__ T maskc_floormod(T num, T den) {
    return num - den * maskc_floordiv(num, den);
}

// floor(sqrt(n)) (0 for n <= 0): a double-precision root, corrected to the exact integer either way.
__device__ __forceinline__ long long maskc_isqrt(long long n) {
    if (n <= 0) return 0;
    long long r = (long long)sqrt((double)n);
    while (r * r > n) --r;
    while ((r + 1) * (r + 1) <= n) ++r;
    return r;
}

// Bits a..b of a visibility word (clamped to the word); 0 when [a, b] misses it.
template <class Word>
__device__ __forceinline__ Word maskc_span_bits(int a, int b) {
    constexpr int TOP = 8 * (int)sizeof(Word) - 1;
    a = max(a, 0);
    b = min(b, TOP);
    if (a > b) return Word(0);
    return (~Word(0) >> (TOP - b)) & (~Word(0) << a);
}

// The segment holding position p: table = [n, bound_0 .. bound_n, ...]. Outside the partitioned
// range, p lies in a gap segment of index -1: [0, bound_0) before it, [bound_n, extent) after it.
struct MaskSegment { int index, start, end; };
__device__ __forceinline__ MaskSegment maskc_segment(const int* __restrict__ table, int p, int extent) {
    const int n = table[0];
    const int* bounds = table + 1;
    if (p < bounds[0]) return MaskSegment{-1, 0, bounds[0]};
    if (p >= bounds[n]) return MaskSegment{-1, bounds[n], extent};
    int lo = 0, hi = n;                       // invariant: bounds[lo] <= p < bounds[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (bounds[mid] <= p) lo = mid; else hi = mid;
    }
    return MaskSegment{lo, bounds[lo], bounds[lo + 1]};
}
"""


@dataclass(frozen=True)
class _Layout:
    ints: tuple[str, ...]
    segments: tuple[str, ...]
    arrays: tuple[tuple[str, str, int], ...]     # (array, its segments, position among that seg's arrays)
    tables: tuple[str, ...] = ()

    @classmethod
    def of(cls, params: tuple[ir.Param, ...]) -> "_Layout":
        ints = tuple(p.name for p in params if p.kind == "int")
        segs = tuple(p.name for p in params if p.kind == "segments")
        arrays: list[tuple[str, str, int]] = []
        count: dict[str, int] = {}
        for p in params:
            if p.kind == "per" and p.of is not None:
                arrays.append((p.name, p.of, count.get(p.of, 0)))
                count[p.of] = count.get(p.of, 0) + 1
        return cls(ints, segs, tuple(arrays), tuple(p.name for p in params if p.kind == "table"))

    def int_slot(self, name: str) -> int:
        return 2 + self.ints.index(name)

    def seg_slot(self, name: str) -> int:
        return 2 + len(self.ints) + self.segments.index(name)

    def array_slot(self, name: str) -> int:
        return next(i for a, _, i in self.arrays if a == name)

    def table_slot(self, name: str) -> int:
        return 2 + len(self.ints) + len(self.segments) + self.tables.index(name)


def pack_mask_data(mask: ir.RangeMask, bound: BoundParams,
                   origin: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mask_data, mask_offsets): every batch element's table, concatenated (see module docstring);
    with ``origin`` = (q0, k0) each table is prefixed by them, for the predicate emitted with offsets."""
    layout = _Layout.of(mask.params)
    chunks, offsets = [], [0]
    for params in bound.batch:
        header = [bound.seq_len, bound.kv_len] + [params.int(n) for n in layout.ints]
        tables = []
        at = len(header) + len(layout.segments) + len(layout.tables)
        for s in layout.segments:
            table = params.segment(s)
            header.append(at)
            body = [table.count] + [int(x) for x in table.bounds]
            for name, seg, _ in layout.arrays:
                if seg == s:
                    body += [int(x) for x in table.value(name)]
            tables += body
            at += len(body)
        for name in layout.tables:
            header.append(at)
            body = [params.table(name).count] + [int(x) for x in params.table(name).values]
            tables += body
            at += len(body)
        chunk = np.asarray(([] if origin is None else list(origin)) + header + tables, np.int64)
        if np.any(np.abs(chunk) > np.iinfo(np.int32).max):
            raise OverflowError("a mask parameter does not fit in int32")
        chunks.append(chunk.astype(np.int32))
        offsets.append(offsets[-1] + len(chunk))
    return np.concatenate(chunks), np.asarray(offsets, np.int32)


class _CWriter:
    """C expressions for linear forms, computed in ``int_type``; k-free sub-forms of per-element code are
    hoisted per row."""

    def __init__(self, layout: _Layout, constants: dict[str, int], int_type: str = "maskc_int"):
        self.layout = layout
        self.constants = constants
        self.int_type = int_type
        self.row_values: list[tuple[str, str, str]] = []     # (field, C type, C expression)
        self._hoisted: dict = {}
        self.row_segments: dict[str, str] = {}               # seg name -> local variable at q

    # -- leaves ----------------------------------------------------------------------------
    def segment_var(self, seg: str, pos: str) -> str:
        i = self.layout.segments.index(seg)
        if pos == "q":
            return self.row_segments.setdefault(seg, f"seg{i}_q")
        return f"seg{i}_k"

    def leaf(self, t, pos_ctx: str) -> str:
        row_scoped = (isinstance(t, ir.Pos) and t.which == "q") or (isinstance(t, ir.Builtin) and t.name in "hb")
        if pos_ctx == "k" and row_scoped:       # mask_visible sees only the row and k
            name = t.which if isinstance(t, ir.Pos) else t.name
            if (name, "int", name) not in self.row_values:
                self.row_values.append((name, "int", name))
            return f"row.{name}"
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
        if per_element and not L.depends_on_k(lin) and not self._is_leafish(lin):
            return self.hoist(lin)
        parts = []
        for t, c in lin.terms:
            hoist = per_element and not L.term_depends_on_k(t) and not isinstance(t, (ir.Pos, ir.Builtin, ir.ParamRef))
            parts.append((c, self.hoist(L.of_term(t)) if hoist else self.term(t, per_element)))
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
            return f"({self.int_type})maskc_isqrt({self.lin(t.arg, per_element)})"
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
        return f"({self.int_type}){self.leaf(t, 'k' if per_element else 'q')}"

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


def _region_comment(region: ir.RegionBounds, kind: str) -> list[str]:
    lines = []
    if region.span.source_line:
        lines.append(f"// {kind} {comment_text(region.span.label)}: {comment_text(region.span.source_line.strip())}")
    else:
        lines.append(f"// {kind} region")
    return lines


def emit_predicate(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (), offsets: bool = False,
                   narrow: bool = False) -> str:
    """CUDA source defining MaskRow, mask_row and mask_visible (see the module docstring), after the helper
    functions they call: :func:`predicate`'s ``source``."""
    return predicate(mask, constants, offsets, narrow).source


def _bound_c(w: _CWriter, bound: ir.KBound, lower: bool) -> str:
    """A KBound as a C expression: ``ceil(lin / den)`` (lower) or ``floor(lin / den)`` (upper)."""
    value = w.lin(bound.lin)
    if bound.den == 1:
        return w.cast(value)
    fn = "maskc_ceildiv" if lower else "maskc_floordiv"
    return f"{fn}({w.cast(value)}, ({w.int_type}){bound.den})"


def _extreme_c(w: _CWriter, fn: str, first: str, values: list[str]) -> str:
    out = first
    for v in values:
        out = f"{fn}({w.cast(out)}, {v})"
    return out


def _chunk_function(i: int, region: ir.RegionBounds, layout: _Layout, constants: dict[str, int]) -> str:
    """``mask_chunks{i}``: the keys of region ``i`` within [k_first, k_last] of one row, one interval per chunk
    (:class:`~maskc.ir.ChunkedKeys`), ascending, each handed to ``emit(lo, hi)``. The chunks are restricted
    to those the key range falls in first (every level's index is monotone in k), so a tile of keys costs
    one loop trip per chunk it touches. In 64 bits whatever the predicate's width: bind proves the region's
    forms, not the nest's bounds, fit in 32 bits; the nest runs once per row and tile, not per key."""
    nest = region.chunks
    assert nest is not None
    w = _CWriter(layout, constants, int_type="long long")
    wide = w.int_type
    levels = nest.levels
    body: list[str] = []
    guards = [f"{w.lin(g.lin)} <= 0" for g in nest.guards]
    if guards:
        body.append(f"    if (!({' && '.join(guards)})) return;      // the nest's guards on the row")
    # the chunk index range of [k_first, k_last] at every level, from k up
    below_first, below_last = f"({wide})k_first", f"({wide})k_last"
    for n, level in enumerate(levels[:-1], start=1):
        off, size = w.cast(w.lin(level.offset)), w.cast(w.lin(level.size))
        body.append(f"    const {wide} j{n}_first = maskc_floordiv({below_first} + {off}, {size});")
        body.append(f"    const {wide} j{n}_last = maskc_floordiv({below_last} + {off}, {size});")
        below_first, below_last = f"j{n}_first", f"j{n}_last"
    indent = "    "
    for n in range(len(levels) - 1, 0, -1):
        level = levels[n]
        lo = _extreme_c(w, "max", f"j{n}_first", [_bound_c(w, b, True) for b in level.lower])
        hi = _extreme_c(w, "min", f"j{n}_last", [_bound_c(w, b, False) for b in level.upper])
        body.append(f"{indent}for ({wide} j{n} = {lo}, j{n}_end = {hi}; j{n} <= j{n}_end; ++j{n}) {{")
        indent += "    "
    lo = _extreme_c(w, "max", f"({wide})k_first", [_bound_c(w, b, True) for b in levels[0].lower])
    hi = _extreme_c(w, "min", f"({wide})k_last", [_bound_c(w, b, False) for b in levels[0].upper])
    body.append(f"{indent}const {wide} lo = {lo};")
    body.append(f"{indent}const {wide} hi = {hi};")
    body.append(f"{indent}if (lo <= hi) emit((int)lo, (int)hi);")
    for n in range(len(levels) - 1, 0, -1):
        indent = indent[:-4]
        body.append(f"{indent}}}")
    head = [f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], q, extent);"
            for seg, var in w.row_segments.items()]
    if head:
        head.insert(0, "    const int extent = max(mask[0], mask[1]);")
    return "\n".join(["template <class Emit>",
                      f"__device__ __forceinline__ void mask_chunks{i}(const int* __restrict__ mask, int b, int h, "
                      "int q, int k_first, int k_last, Emit emit) {",
                      "    (void)b; (void)h;", "    if (k_first > k_last) return;"] + head + body + ["}", ""])


def _bits_function(mask: ir.RangeMask) -> str:
    """``mask_bits``: a row's visible keys among ``k0 .. k0 + WORDS * bits - 1`` as words, from the regions'
    intervals (linear regions: ``row.lo{i}``/``row.hi{i}``; chunked regions: those clipped to the tile, one
    interval per chunk), allow regions set and deny regions cleared after them."""
    lines = ["// The row's visible keys among k0 .. k0 + WORDS * BITS - 1 as words (bit j of word w: key k0 + w * BITS",
             "// + j): the allow regions' key intervals set, then the deny regions' cleared; keys past kv_len are the",
             "// caller's to hide. Every region is an interval per row or one per chunk (an exact mask), so a tile",
             "// costs a few interval operations per row, never a predicate per key.",
             "template <class Word, int WORDS>",
             "__device__ __forceinline__ void mask_bits(const MaskRow& row, const int* __restrict__ mask, int b, int h, "
             "int q, int k0, Word (&bits)[WORDS]) {",
             "    constexpr int BITS = 8 * (int)sizeof(Word);",
             "    const int k_last = k0 + WORDS * BITS - 1;",
             "    (void)mask; (void)b; (void)h; (void)q; (void)k_last;",
             "    auto set = [&](int lo, int hi) {",
             "        for (int w = 0; w < WORDS; ++w) bits[w] |= maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);",
             "    };",
             "    auto clear = [&](int lo, int hi) {",
             "        for (int w = 0; w < WORDS; ++w) bits[w] &= ~maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);",
             "    };",
             "    (void)clear;",
             "    for (int w = 0; w < WORDS; ++w) bits[w] = Word(0);"]
    for i, (kind, region) in enumerate([("allow", r) for r in mask.allow] + [("deny", r) for r in mask.deny]):
        op = "set" if kind == "allow" else "clear"
        if region.chunks is None:
            lines.append(f"    {op}(row.lo{i}, row.hi{i});")
        else:
            lines.append(f"    mask_chunks{i}(mask, b, h, q, max(k0, row.lo{i}), min(k_last, row.hi{i}), {op});")
    return "\n".join(lines + ["}", ""])


def _tile_bits(mask: ir.RangeMask, offsets: bool) -> bool:
    """Whether kernels mask a tile through :func:`_bits_function`: every region exact (linear, or chunked),
    some chunked (a mask of linear regions alone has the cheaper interval table), and positions global (a
    sub-block's predicate shifts its intervals; it keeps the per-key test)."""
    regions = mask.allow + mask.deny
    return (not offsets and all(r.linear or r.chunks is not None for r in regions)
            and any(r.chunks is not None for r in regions))


def _mask_code(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...], offsets: bool) -> str:
    """MaskRow, mask_row and mask_visible of ``mask`` (without the shared helpers). ``constants`` are values
    of const int parameters, written into the code as literals; ``offsets``: the predicate of a sub-block,
    reading its origin (q0, k0) from the head of the table."""
    layout = _Layout.of(mask.params)
    per_key = any(r.opaque for r in mask.allow + mask.deny)
    key = "k_local" if offsets and per_key else "k"      # what the interval tests compare
    w = _CWriter(layout, dict(constants))
    row_fields: list[str] = []
    row_body: list[str] = []
    visible_terms: dict[str, list[str]] = {"allow": [], "deny": []}
    for kind, regions in (("allow", mask.allow), ("deny", mask.deny)):
        for region in regions:
            i = len(row_fields) // 2
            lo = "0"
            for b in region.lower:
                v = w.lin(b.lin) if b.den == 1 else f"maskc_ceildiv({w.cast(w.lin(b.lin))}, (maskc_int){b.den})"
                lo = f"max({w.cast(lo)}, {w.cast(v)})"
            hi = "mask[1] - 1"
            for b in region.upper:
                v = w.lin(b.lin) if b.den == 1 else f"maskc_floordiv({w.cast(w.lin(b.lin))}, (maskc_int){b.den})"
                hi = f"min({w.cast(hi)}, {w.cast(v)})"
            row_body += ["    " + c for c in _region_comment(region, kind)]
            # clamped into [0, kv_len] and [-1, kv_len - 1] in 64 bits, then narrowed
            row_body.append(f"    row.lo{i} = {lo if lo == '0' else f'(int)min((maskc_int)mask[1], {lo})'};")
            row_body.append(f"    row.hi{i} = {f'(int)max((maskc_int)-1, {hi})' if region.upper else hi};")
            if region.guards or region.static_guards:
                guard = " && ".join(f"{w.lin(g.lin)} <= 0" for g in region.static_guards + region.guards)
                row_body.append(f"    if (!({guard})) {{ row.lo{i} = 1; row.hi{i} = 0; }}   // row guard fails")
            row_fields += [f"lo{i}", f"hi{i}"]
            test = f"({key} >= row.lo{i} && {key} <= row.hi{i}"
            for atom in region.opaque:
                test += f" && {w.lin(atom.lin, per_element=True)} <= 0"
            visible_terms[kind].append(test + ")")
    k_segments = sorted({t.seg for r in mask.allow + mask.deny for a in r.opaque
                         for t in L.terms_of(a.lin) if isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "k"})
    out = ["// What mask_visible needs of one query row, computed once per row and tile.", "struct MaskRow {"]
    out += [f"    int {f};" for f in row_fields]
    out += [f"    {ctype} {name};" for name, ctype, _ in w.row_values]
    if not row_fields and not w.row_values:
        out.append("    int unused;")
    if offsets and per_key:
        out.append("    int k0;")
    out.append("};")
    if offsets:     # positions come local to the sub-block: q0 and k0 head the table
        out += ["", "__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ table, int b, int h, "
                "int q_local) {", "    const int* __restrict__ mask = table + 2;",
                "    const int q = q_local + table[0];"]
    else:
        out += ["", "__device__ __forceinline__ MaskRow mask_row(const int* __restrict__ mask, int b, int h, int q) {"]
    out += ["    MaskRow row;", "    const int extent = max(mask[0], mask[1]);", "    (void)extent; (void)b; (void)h;"]
    for seg, var in w.row_segments.items():
        out.append(f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], q, extent);")
    out += row_body
    out += [f"    row.{name} = {expr};" for name, _, expr in w.row_values]
    if offsets:
        out.append("    // key intervals in the sub-block's key positions")
        out += [f"    row.{f} -= table[1];" for f in row_fields]
        if per_key:
            out.append("    row.k0 = table[1];")
    out += ["    return row;", "}", ""]
    if offsets and per_key:
        out += ["__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ table, "
                "int k_local) {", "    const int* __restrict__ mask = table + 2;",
                "    const int k = k_local + row.k0;", "    (void)mask; (void)k;"]
    else:
        out.append("__device__ __forceinline__ bool mask_visible(const MaskRow& row, const int* __restrict__ mask, "
                   "int k) {")
    if k_segments:
        out.append("    const int extent = max(mask[0], mask[1]);")
        for seg in k_segments:
            var = w.segment_var(seg, "k")
            out.append(f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], k, extent);")
    allowed = " ||\n                   ".join(visible_terms["allow"]) or "false"
    out.append(f"    const bool allowed = {allowed};")
    if visible_terms["deny"]:
        denied = " ||\n                  ".join(visible_terms["deny"])
        out.append(f"    const bool denied = {denied};")
        out.append("    return allowed && !denied;")
    else:
        out.append("    return allowed;")
    out += ["}", ""]
    if _tile_bits(mask, offsets):
        regions = mask.allow + mask.deny
        out += [_chunk_function(i, r, layout, dict(constants)) for i, r in enumerate(regions) if r.chunks]
        out.append(_bits_function(mask))
    return "\n".join(out).rstrip("\n") + "\n"


def predicate(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (), offsets: bool = False,
              narrow: bool = False) -> Predicate:
    """The mask's :class:`~maskc.kernel_ir.Predicate`: its device code (the shared helpers apart), and its
    regions as data. With ``offsets`` the key intervals of a row are local to the sub-block, as the interval
    paths need. ``narrow``: the forms in 32 bits, for bindings that :func:`maskc.analysis.widths.fits_32_bits`
    accepts (else 64)."""
    regions = mask.allow + mask.deny
    return Predicate(_mask_code(mask, constants, offsets), len(mask.allow), len(mask.deny),
                     intervals_only=not any(r.opaque for r in regions), helpers=_WIDTHS[narrow] + _HELPERS + "\n\n",
                     tile_bits=_tile_bits(mask, offsets))
