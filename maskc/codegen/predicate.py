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
    table parameter t: [n, entry_0 .. entry_n-1]     (a table per h: one entry per head; a table with two
                       indices, or per h with one: its n = rows x columns entries, row-major)
    mask[2 + n_ints + n_segs + n_tables + f]   float parameter f (FLOAT_KINDS, declaration order): a float's
                             bits (read with __int_as_float), or a float table's offset: [n, bits_0 .. bits_n-1]

A sub-block of a bound mask (``BoundMask.restrict``: query rows from q0, keys from k0) uses the predicate of
``emit_predicate(..., offsets=True)`` and tables packed with ``origin=(q0, k0)``: the kernel passes
positions local to the sub-block, the table starts with ``[q0, k0]`` followed by the table above, and
``mask_row`` adds q0 to the row and returns the key intervals ``[lo, hi]`` shifted by -k0 (local keys), so
the kernels' interval paths work unchanged; per-key atoms see ``k + k0``.
"""
from __future__ import annotations

import functools

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.values import INT32
from maskc.codegen.cwriter import CWriter, TableLayout
from maskc.codegen.sanitize import comment_text
from maskc.codegen.tile_bits import RootTables, bits_function, chunk_function, has_tile_bits
from maskc.bound_params import BoundParams
from maskc.kernel_ir import Predicate

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

// floor(sqrt(n)) (0 for n <= 0): a double-precision root, corrected to the exact integer either way; for a
// 32-bit n (the narrow predicate's, inside every chunk loop: a fp64 square root is a dozen double operations)
// a single-precision root, then one step each way without a branch, in unsigned 32 bits: for every
// 0 < n < 2**31, sqrtf of (float)n (both correctly rounded) truncates to the answer or one off it (checked
// for every such n on the host; tests/test_predicate.py checks those next to a square), and r + 1 <= 46341,
// whose square fits in 32 unsigned bits. No 64-bit compares, no loops whose trip counts split a warp.
__device__ __forceinline__ long long maskc_isqrt(long long n) {
    if (n <= 0) return 0;
    long long r = (long long)sqrt((double)n);
    while (r * r > n) --r;
    while ((r + 1) * (r + 1) <= n) ++r;
    return r;
}
__device__ __forceinline__ int maskc_isqrt(int n) {
    unsigned r = (unsigned)sqrtf((float)max(n, 0));
    r -= r * r > (unsigned)max(n, 0) ? 1u : 0u;
    r += (r + 1u) * (r + 1u) <= (unsigned)max(n, 0) ? 1u : 0u;
    return (int)r;
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

// Set, or clear, the keys lo..hi in visibility words of keys from k0 (bit j of word w: key k0 + w * bits + j).
template <class Word, int WORDS>
__device__ __forceinline__ void maskc_set_keys(Word (&bits)[WORDS], int k0, int lo, int hi) {
    constexpr int BITS = 8 * (int)sizeof(Word);
    for (int w = 0; w < WORDS; ++w) bits[w] |= maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);
}
template <class Word, int WORDS>
__device__ __forceinline__ void maskc_clear_keys(Word (&bits)[WORDS], int k0, int lo, int hi) {
    constexpr int BITS = 8 * (int)sizeof(Word);
    for (int w = 0; w < WORDS; ++w) bits[w] &= ~maskc_span_bits<Word>(lo - k0 - w * BITS, hi - k0 - w * BITS);
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


@functools.lru_cache(maxsize=128)
def _layout_of(params: tuple[ir.Param, ...]) -> TableLayout:
    """TableLayout.of the parameters, made once for the next binds (the IR is left as it is): keyed by the
    parameters' value, which is all the layout reads; a hit costs their hash, under 1 us for the examples."""
    return TableLayout.of(params)


def pack_mask_data(mask: ir.RangeMask, bound: BoundParams,
                   origin: tuple[int, int] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(mask_data, mask_offsets): every batch element's table, concatenated (see module docstring);
    with ``origin`` = (q0, k0) each table is prefixed by them, for the predicate emitted with offsets."""
    layout = _layout_of(mask.params)
    chunks, offsets = [], [0]
    for params in bound.batch:
        header = [bound.seq_len, bound.kv_len] + [params.int(n) for n in layout.ints]
        tables = []
        at = len(header) + len(layout.segments) + len(layout.tables) + len(layout.floats)
        for s in layout.segments:
            table = params.segment(s)
            header.append(at)
            body = [table.count] + table.bounds.tolist()
            for name, seg, _ in layout.arrays:
                if seg == s:
                    body += table.value(name).tolist()
            tables += body
            at += len(body)
        for name in layout.tables:
            header.append(at)
            body = [params.table(name).count] + params.table(name).values.tolist()
            tables += body
            at += len(body)
        for name, is_table in layout.floats:
            bits = [int(x) for x in np.asarray(params.float(name), np.float32).reshape(-1).view(np.int32)]
            header += [at] if is_table else bits
            if is_table:
                tables += [len(bits)] + bits
                at += 1 + len(bits)
        chunk = np.asarray(([] if origin is None else list(origin)) + header + tables, np.int64)
        if len(chunk) and (chunk.min() < -INT32 or chunk.max() > INT32):    # |x| <= 2**31 - 1
            raise OverflowError("a mask parameter does not fit in int32")
        chunks.append(chunk.astype(np.int32))
        offsets.append(offsets[-1] + len(chunk))
    return np.concatenate(chunks), np.asarray(offsets, np.int32)


def _region_comment(region: ir.RegionBounds, kind: str) -> list[str]:
    lines = []
    if region.span.source_line:
        lines.append(f"// {kind} {comment_text(region.span.label)}: {comment_text(region.span.source_line.strip())}")
    else:
        lines.append(f"// {kind} region")
    return lines


def region_tests(mask: ir.RangeMask, w: CWriter, key: str, keys_in_range: bool = False
                 ) -> tuple[list[str], list[str], dict[str, list[str]]]:
    """Every region's row interval and per-element test, written by ``w``: (the row's fields ``lo{i}``/``hi{i}``,
    the statements of a row function that set them, the tests of ``key`` per kind: "allow" and "deny"). The
    per-element atoms' row (and, for a writer with columns, column) values are left in ``w``.

    With ``keys_in_range`` (the element path: the caller tests only keys in [0, kv_len), and a writer with
    columns) the tests are branch-free (``|`` and ``&``: every operand is cheap and safe to evaluate) and a
    region's interval test is as cheap as what it reads: none for a region without bounds or guards (every key),
    a row's ``lo <= hi`` for one with guards alone, a column value ``in{i}`` for bounds that read no query
    position (CLEAR's ``k < text``), with a row value ``g{i}`` for its guards."""
    row_fields: list[str] = []
    row_body: list[str] = []
    tests: dict[str, list[str]] = {"allow": [], "deny": []}
    for kind, regions in (("allow", mask.allow), ("deny", mask.deny)):
        for region in regions:
            i = len(row_fields) // 2
            lo = w.extreme("max", "0", region.lower, lower=True)
            hi = w.extreme("min", "mask[1] - 1", region.upper, lower=False)
            row_body += ["    " + c for c in _region_comment(region, kind)]
            # clamped into [0, kv_len] and [-1, kv_len - 1] in 64 bits, then narrowed
            row_body.append(f"    row.lo{i} = {lo if lo == '0' else f'(int)min((maskc_int)mask[1], {lo})'};")
            row_body.append(f"    row.hi{i} = {f'(int)max((maskc_int)-1, {hi})' if region.upper else hi};")
            if region.guards or region.static_guards:
                guard = " && ".join(f"{w.lin(g.lin)} <= 0" for g in region.static_guards + region.guards)
                row_body.append(f"    if (!({guard})) {{ row.lo{i} = 1; row.hi{i} = 0; }}   // row guard fails")
            row_fields += [f"lo{i}", f"hi{i}"]
            parts = _interval_test(region, i, key, w, lo, hi) if keys_in_range else [f"{key} >= row.lo{i}",
                                                                                      f"{key} <= row.hi{i}"]
            parts += [f"({w.element_test(atom.lin)})" if keys_in_range else f"{w.lin(atom.lin, per_element=True)} <= 0"
                      for atom in region.opaque]
            tests[kind].append(f"({(' & ' if keys_in_range else ' && ').join(parts) or 'true'})")
    return row_fields, row_body, tests


def _interval_test(region: ir.RegionBounds, i: int, key: str, w: CWriter, lo: str, hi: str) -> list[str]:
    """The element path's test of region i's key interval (:func:`region_tests`, ``keys_in_range``); ``lo`` and
    ``hi`` its bounds as C, unclamped."""
    bounds = region.lower + region.upper
    guards = region.static_guards + region.guards
    if not bounds:
        return [f"(row.lo{i} <= row.hi{i})"] if guards else []
    if any(F.depends_on_q(b.lin) for b in bounds):
        return [f"({key} >= row.lo{i})", f"({key} <= row.hi{i})"]
    tests = ([] if lo == "0" else [f"(k >= {lo})"]) + ([f"(k <= {hi})"] if region.upper else [])   # keys >= 0
    w.col_values.append((f"in{i}", "bool", " & ".join(tests)))     # per key column: reads no q
    if not guards:
        return [f"col.in{i}"]
    w.row_values.append((f"g{i}", "bool", " & ".join(f"({w.lin(g.lin)} <= 0)" for g in guards)))   # per row
    return [f"row.g{i}", f"col.in{i}"]


def emit_predicate(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (), offsets: bool = False,
                   narrow: bool = False) -> str:
    """CUDA source defining MaskRow, mask_row and mask_visible (see the module docstring), after the helper
    functions they call: :func:`predicate`'s ``source``."""
    return predicate(mask, constants, offsets, narrow).source


def _mask_code(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...], offsets: bool) -> tuple[str, int]:
    """MaskRow, mask_row and mask_visible of ``mask`` (without the shared helpers), and the number of root
    tables its tile path reads (maskc.codegen.tile_bits). ``constants`` are values of const int parameters,
    written into the code as literals; ``offsets``: the predicate of a sub-block, reading its origin (q0, k0)
    from the head of the table."""
    layout = TableLayout.of(mask.params)
    per_key = any(r.opaque for r in mask.allow + mask.deny)
    key = "k_local" if offsets and per_key else "k"      # what the interval tests compare
    w = CWriter(layout, dict(constants))
    row_fields, row_body, visible_terms = region_tests(mask, w, key)
    k_segments = sorted({t.seg for r in mask.allow + mask.deny for a in r.opaque
                         for t in F.terms_of(a.lin) if isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "k"})
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
    roots = RootTables()
    if has_tile_bits(mask, offsets):
        regions = mask.allow + mask.deny
        # twice: the first pass finds the root tables, so that the second also reads those roots of a table's u
        # that come before the table's first use (the loop bounds, rendered before the chunk's interval)
        for _ in range(2):
            nests = [chunk_function(i, r, layout, dict(constants), roots) for i, r in enumerate(regions) if r.chunks]
        out += ([roots.source(layout, dict(constants))] if roots.tables else []) + nests + [bits_function(mask)]
    return "\n".join(out).rstrip("\n") + "\n", len(roots.tables)


def predicate(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (), offsets: bool = False,
              narrow: bool = False, elements: str = "") -> Predicate:
    """The mask's :class:`~maskc.kernel_ir.Predicate`: its device code (the shared helpers apart), and its
    regions as data. With ``offsets`` the key intervals of a row are local to the sub-block, as the interval
    paths need. ``narrow``: the forms in 32 bits, for bindings that :func:`maskc.analysis.widths.fits_32_bits`
    accepts (else 64). ``elements``: the element path's code (:func:`maskc.codegen.elements.element_code`), kept
    for a mask with the tile path."""
    regions = mask.allow + mask.deny
    code, root_tables = _mask_code(mask, constants, offsets)
    tile_bits = has_tile_bits(mask, offsets)
    return Predicate(code, len(mask.allow), len(mask.deny),
                     intervals_only=not any(r.opaque for r in regions), helpers=_WIDTHS[narrow] + _HELPERS + "\n\n",
                     tile_bits=tile_bits, root_tables=root_tables, elements=elements if tile_bits else "",
                     reads_head=mask.uses_head)
