"""The tile path of exact masks with chunked regions: a row's visible keys in a tile as bit words.

A mask whose every region is linear or chunked (:class:`~maskc.ir.ChunkedKeys`: keys through ``//``, ``%`` and
squares, solved exactly) gets, beside ``mask_row`` and ``mask_visible``, ``mask_chunks{i}`` for each chunked
region (its keys within a key range, one interval per chunk) and ``mask_bits`` (every region's intervals in a
tile, as words); kernels call ``mask_bits`` once per row and tile instead of ``mask_visible`` per key.
Invariant: for every row and tile origin, the bits ``mask_bits`` sets are exactly the keys of the tile that
``mask_visible`` accepts (tests/test_predicate.py compiles both with g++ against the dense mask), with or
without root tables.

Root tables: a chunk nest's bounds read a square root per chunk (a disc: ``isqrt(r**2 - 1 - (y(q) - J1)**2)``
per image row J1). Where the root's argument is ``u - w * d**2`` with ``u`` fixed for a work item (parameters,
no position, chunk index or head), its value depends on ``|d|`` alone: a kernel fills a table of
``ROOT_ENTRIES`` values once per work item or CTA (``mask_root_entry``) and passes it to ``mask_bits`` as ``roots``,
so a PARTIAL tile reads each chunk's root instead of computing it (``|d|`` past the table, or no table: it is
computed, so any radius stays exact). A root of ``u`` itself (the disc's rows, in the loop bounds) is entry 0.
"""
from __future__ import annotations

from maskc import ir
from maskc.analysis import forms as F
from maskc.codegen.cwriter import CWriter, TableLayout
from maskc.codegen.sanitize import comment_text

# Entries |d| = 0 .. 31 of a root table (one per lane: a warp fills a table in one step): discs up to radius 32
# never compute a root per chunk. 8 consumer warps keep 1 KB per table, which still fits beside D = 256's tiles.
ROOT_ENTRIES = 32


def _per_item(term) -> bool:
    """Whether a term is the same for every row, key and head of a batch element (no position, no chunk index,
    no head): a table can then serve a forward work item and a backward CTA, whose steps change heads."""
    return not (F.term_depends_on_q(term) or F.term_depends_on_k(term) or F.term_reads_chunks(term)
                or F.term_mentions(term, lambda t: isinstance(t, ir.Builtin) and t.name == "h"))


class RootTables:
    """The root tables of one predicate's chunk nests, in the order the nests first read them: ``(u, w)``
    for a table of ``isqrt(u - w * a**2)``, a = 0 .. ROOT_ENTRIES - 1 (see the module docstring)."""

    def __init__(self) -> None:
        self.tables: list[tuple[ir.Lin, int]] = []

    def match(self, arg: ir.Lin) -> tuple[int, ir.Lin] | None:
        """(table, d) when ``arg`` is ``u - w * d**2`` with ``u`` per item and ``w > 0`` (a new table if no
        table has that ``(u, w)``), or ``arg`` is some table's ``u`` (d = 0: a disc's extent in rows, read by
        the nests' loop bounds); else None."""
        varying = [(t, c) for t, c in arg.terms if not _per_item(t)]
        if not varying:
            return next(((i, ir.Lin((), 0)) for i, (u, _) in enumerate(self.tables) if u == arg), None)
        square, coef = varying[0]
        if len(varying) != 1 or not isinstance(square, ir.Square) or coef >= 0:
            return None
        key = (ir.Lin(tuple((t, c) for t, c in arg.terms if t is not square), arg.const), -coef)
        if key not in self.tables:
            self.tables.append(key)
        return self.tables.index(key), square.base

    def source(self, layout: TableLayout, constants: dict[str, int]) -> str:
        """``MASK_ROOT_TABLES``, ``MASK_ROOT_ENTRIES``, ``mask_root_entry`` (entry a of table t, for the kernel
        to fill) and ``mask_root`` (a chunk nest's read), or nothing without tables."""
        if not self.tables:
            return ""
        w = CWriter(layout, constants)
        lines = ["// Root tables of the chunk nests (maskc.codegen.tile_bits): table t holds isqrt(u - w * a * a) for",
                 "// a = 0 .. MASK_ROOT_ENTRIES - 1, u the same for a whole batch element. A kernel fills them once per",
                 "// work item or CTA (mask_root_entry) and passes them to mask_bits as `roots`; mask_root reads entry |d|",
                 "// of the root of u - w * d * d, or computes it (no table, or |d| past it).",
                 f"constexpr int MASK_ROOT_TABLES = {len(self.tables)}, MASK_ROOT_ENTRIES = {ROOT_ENTRIES};",
                 "__device__ __forceinline__ int mask_root_entry(const int* __restrict__ mask, int b, int t, int a) {",
                 "    (void)mask; (void)b; (void)a;",
                 "    switch (t) {"]
        for t, (u, scale) in enumerate(self.tables):
            lines.append(f"    case {t}: return (int)maskc_isqrt((long long){w.lin(u)} - {scale}LL * a * a);"
                         f"   // isqrt({comment_text(F.render(u))} - {'' if scale == 1 else f'{scale} * '}a**2)")
        lines += ["    default: return 0;", "    }", "}",
                  "template <int T>",
                  "__device__ __forceinline__ maskc_int mask_root(const int* __restrict__ roots, maskc_int d, "
                  "maskc_int arg) {",
                  "    const maskc_int a = d < 0 ? -d : d;",
                  "    if (roots != nullptr && a < MASK_ROOT_ENTRIES) return roots[T * MASK_ROOT_ENTRIES + (int)a];",
                  "    return maskc_isqrt(arg);",
                  "}", ""]
        return "\n".join(lines)


def chunk_function(i: int, region: ir.RegionBounds, layout: TableLayout, constants: dict[str, int],
                   roots: RootTables) -> str:
    """``mask_chunks{i}``: the keys of region ``i`` within [k_first, k_last] of one row, one interval per chunk
    (:class:`~maskc.ir.ChunkedKeys`), ascending, each handed to ``emit(lo, hi)``. The chunks are restricted
    to those the key range falls in first (every level's index is monotone in k), so a tile of keys costs
    one loop trip per chunk it touches. In the predicate's width (``maskc_int``): 32 bits where bind proved the
    nest's every intermediate fits too (:func:`maskc.analysis.widths.fits_32_bits`), which keeps the nests of a
    mask in a token order (three levels for CLEAR's 8 x 16 patches) from spilling in the backward kernels.
    Roots of the nest's bounds that ``roots`` matches are read from the caller's tables (``roots``, or
    computed when it is null)."""
    nest = region.chunks
    assert nest is not None
    w = CWriter(layout, constants)
    w.roots = roots
    wide = w.int_type
    levels = nest.levels
    body: list[str] = []
    guards = [f"{w.lin(g.lin)} <= 0" for g in nest.guards]
    if guards:
        body.append(f"    if (!({' && '.join(guards)})) return;      // the nest's guards on the row")
    # the chunk index range of [k_first, k_last] at every level, from k up
    below_first, below_last = f"({wide})k_first", f"({wide})k_last"
    for n, level in enumerate(levels[:-1], start=1):
        assert level.offset is not None and level.size is not None, "every level but the top is cut into chunks"
        off, size = w.cast(w.lin(level.offset)), w.cast(w.lin(level.size))
        body.append(f"    const {wide} j{n}_first = maskc_floordiv({below_first} + {off}, {size});")
        body.append(f"    const {wide} j{n}_last = maskc_floordiv({below_last} + {off}, {size});")
        below_first, below_last = f"j{n}_first", f"j{n}_last"
    indent = "    "
    for n in range(len(levels) - 1, 0, -1):
        level = levels[n]
        lo = w.extreme("max", f"j{n}_first", level.lower, lower=True)
        hi = w.extreme("min", f"j{n}_last", level.upper, lower=False)
        body.append(f"{indent}for ({wide} j{n} = {lo}, j{n}_end = {hi}; j{n} <= j{n}_end; ++j{n}) {{")
        indent += "    "
    lo = w.extreme("max", f"({wide})k_first", levels[0].lower, lower=True)
    hi = w.extreme("min", f"({wide})k_last", levels[0].upper, lower=False)
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
                      "int q, int k_first, int k_last, const int* __restrict__ roots, Emit emit) {",
                      "    (void)b; (void)h; (void)roots;", "    if (k_first > k_last) return;"] + head + body + ["}", ""])


def bits_function(mask: ir.RangeMask) -> str:
    """``mask_bits``: a row's visible keys among ``k0 .. k0 + WORDS * bits - 1`` as words, from the regions'
    intervals (linear regions: ``row.lo{i}``/``row.hi{i}``; chunked regions: those clipped to the tile, one
    interval per chunk), allow regions set and deny regions cleared after them."""
    lines = ["// The row's visible keys among k0 .. k0 + WORDS * bits - 1 as words (bit j of word w: key k0 + w * bits",
             "// + j): the allow regions' key intervals set, then the deny regions' cleared; keys past kv_len are the",
             "// caller's to hide. Every region is an interval per row or one per chunk (an exact mask), so a tile",
             "// costs a few interval operations per row, never a predicate per key. roots: the root tables, filled",
             "// for this work item (mask_root_entry), or null (the chunk nests compute their roots).",
             "template <class Word, int WORDS>",
             "__device__ __forceinline__ void mask_bits(const MaskRow& row, const int* __restrict__ mask, int b, int h,",
             "                                          int q, int k0, Word (&bits)[WORDS],",
             "                                          const int* __restrict__ roots = nullptr) {",
             "    (void)roots;",
             "    const int k_last = k0 + WORDS * 8 * (int)sizeof(Word) - 1;",
             "    for (int w = 0; w < WORDS; ++w) bits[w] = Word(0);"]
    for i, (kind, region) in enumerate([("allow", r) for r in mask.allow] + [("deny", r) for r in mask.deny]):
        op = "maskc_set_keys" if kind == "allow" else "maskc_clear_keys"
        if region.chunks is None:
            lines.append(f"    {op}(bits, k0, row.lo{i}, row.hi{i});")
        else:
            lines.append(f"    mask_chunks{i}(mask, b, h, q, max(k0, row.lo{i}), min(k_last, row.hi{i}), roots,")
            lines.append(f"                 [&](int lo, int hi) {{ {op}(bits, k0, lo, hi); }});")
    return "\n".join(lines + ["}", ""])


def has_tile_bits(mask: ir.RangeMask, offsets: bool) -> bool:
    """Whether kernels mask a tile through :func:`bits_function`: every region exact (linear, or chunked),
    some chunked (a mask of linear regions alone has the cheaper interval table), and positions global (a
    sub-block's predicate shifts its intervals; it keeps the per-key test)."""
    regions = mask.allow + mask.deny
    return (not offsets and all(r.linear or r.chunks is not None for r in regions)
            and any(r.chunks is not None for r in regions))
