"""The tile path of exact masks with chunked regions: a row's visible keys in a tile as bit words.

A mask whose every region is linear or chunked (:class:`~maskc.ir.ChunkedKeys`: keys through ``//``, ``%`` and
squares, solved exactly) gets, beside ``mask_row`` and ``mask_visible``, ``mask_chunks{i}`` for each chunked
region (its keys within a key range, one interval per chunk) and ``mask_bits`` (every region's intervals in a
tile, as words); kernels call ``mask_bits`` once per row and tile instead of ``mask_visible`` per key.
Invariant: for every row and tile origin, the bits ``mask_bits`` sets are exactly the keys of the tile that
``mask_visible`` accepts (tests/test_predicate.py compiles both with g++ against the dense mask).
"""
from __future__ import annotations

from maskc import ir
from maskc.codegen.cwriter import CWriter, TableLayout


def chunk_function(i: int, region: ir.RegionBounds, layout: TableLayout, constants: dict[str, int]) -> str:
    """``mask_chunks{i}``: the keys of region ``i`` within [k_first, k_last] of one row, one interval per chunk
    (:class:`~maskc.ir.ChunkedKeys`), ascending, each handed to ``emit(lo, hi)``. The chunks are restricted
    to those the key range falls in first (every level's index is monotone in k), so a tile of keys costs
    one loop trip per chunk it touches. In the predicate's width (``maskc_int``): 32 bits where bind proved the
    nest's every intermediate fits too (:func:`maskc.analysis.widths.fits_32_bits`), which keeps the nests of a
    mask in a token order (three levels for CLEAR's 8 x 16 patches) from spilling in the backward kernels."""
    nest = region.chunks
    assert nest is not None
    w = CWriter(layout, constants)
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
                      "int q, int k_first, int k_last, Emit emit) {",
                      "    (void)b; (void)h;", "    if (k_first > k_last) return;"] + head + body + ["}", ""])


def bits_function(mask: ir.RangeMask) -> str:
    """``mask_bits``: a row's visible keys among ``k0 .. k0 + WORDS * bits - 1`` as words, from the regions'
    intervals (linear regions: ``row.lo{i}``/``row.hi{i}``; chunked regions: those clipped to the tile, one
    interval per chunk), allow regions set and deny regions cleared after them."""
    lines = ["// The row's visible keys among k0 .. k0 + WORDS * bits - 1 as words (bit j of word w: key k0 + w * bits",
             "// + j): the allow regions' key intervals set, then the deny regions' cleared; keys past kv_len are the",
             "// caller's to hide. Every region is an interval per row or one per chunk (an exact mask), so a tile",
             "// costs a few interval operations per row, never a predicate per key.",
             "template <class Word, int WORDS>",
             "__device__ __forceinline__ void mask_bits(const MaskRow& row, const int* __restrict__ mask, int b, int h,",
             "                                          int q, int k0, Word (&bits)[WORDS]) {",
             "    const int k_last = k0 + WORDS * 8 * (int)sizeof(Word) - 1;",
             "    for (int w = 0; w < WORDS; ++w) bits[w] = Word(0);"]
    for i, (kind, region) in enumerate([("allow", r) for r in mask.allow] + [("deny", r) for r in mask.deny]):
        op = "maskc_set_keys" if kind == "allow" else "maskc_clear_keys"
        if region.chunks is None:
            lines.append(f"    {op}(bits, k0, row.lo{i}, row.hi{i});")
        else:
            lines.append(f"    mask_chunks{i}(mask, b, h, q, max(k0, row.lo{i}), min(k_last, row.hi{i}),")
            lines.append(f"                 [&](int lo, int hi) {{ {op}(bits, k0, lo, hi); }});")
    return "\n".join(lines + ["}", ""])


def has_tile_bits(mask: ir.RangeMask, offsets: bool) -> bool:
    """Whether kernels mask a tile through :func:`bits_function`: every region exact (linear, or chunked),
    some chunked (a mask of linear regions alone has the cheaper interval table), and positions global (a
    sub-block's predicate shifts its intervals; it keeps the per-key test)."""
    regions = mask.allow + mask.deny
    return (not offsets and all(r.linear or r.chunks is not None for r in regions)
            and any(r.chunks is not None for r in regions))
