"""The element path of PARTIAL tiles: the raster mask's predicate per (query, key) pair, with everything that
reads only the query hoisted per row and everything that reads only the key hoisted per key column.

The tile path (:mod:`maskc.codegen.tile_bits`) masks a PARTIAL tile row by row through interval arithmetic:
exact, but a chunk nest per region, loops over image rows and root tables (ncu, run 54: a PARTIAL tile of
CLEAR in 8 x 16 patches costs 12.8 K instructions, a FULL one 4.5 K). The element path evaluates the mask's
own test per pair instead, as FlexAttention evaluates a mask_mod, but split so that a pair costs only the
arithmetic that reads both positions::

    struct MaskElementRow { ... };    // per query row: region intervals and the q-only values of the atoms
    MaskElementRow mask_element_row(const int* mask, int b, int h, int q);
    struct MaskElementCol { int k; ... };   // per key column: its raster position and the k-only values
    MaskElementCol mask_element_col(const int* mask, int b, int h, int k);
    bool mask_element_visible(const MaskElementRow& row, const MaskElementCol& col, const int* mask);

For CLEAR the column values are the key's image column and row, ``(k - text) & 127`` and ``(k - text) >> 7``,
and the test is three interval tests and ``(x_q - x_k)**2 + (y_q - y_k)**2 < r**2``. A thread of the forward
kernel holds 2 rows and 32 key columns of a 128 x 128 tile: 2 row values, 32 column values, 64 tests.

In a token order (:mod:`maskc.analysis.order`) the code is that of the *raster* mask (the one the order was
rewritten from), and the functions take places in the order: ``mask_element_row`` and ``mask_element_col`` map
them to raster positions first (``mask_raster``, the order's :meth:`~maskc.analysis.order.TokenOrder.raster`),
so the test is the raster mask's few regions instead of the rewritten mask's (four for CLEAR's disc, each with
the order's map inlined). Everything else of an ordered kernel (tile classes, descriptor, FULL and EMPTY tiles)
stays the rewritten mask's; the table ``mask`` points at is the rewritten mask's, whose layout is the raster
mask's (a rewrite keeps the parameters).

Invariant: for every query place q in [0, seq_len) and key place k in [0, kv_len),
``mask_element_visible(mask_element_row(q), mask_element_col(k))`` equals the raster mask's
``mask_visible(mask_row(raster(q)), raster(k))``, hence the rewritten mask's visibility of (q, k)
(tests/test_elements.py compiles the functions with g++ against ``dense()``). Past kv_len (a ragged last tile)
the value is unspecified: the kernel hides those keys itself, so a region whose interval is every key is tested
by its atoms alone. Which path a kernel takes is the
plan's (:attr:`maskc.options.Options.partial_tiles`).
"""
from __future__ import annotations

from maskc import ir
from maskc.analysis.order import TokenOrder
from maskc.codegen.cwriter import CWriter, TableLayout
from maskc.codegen.predicate import region_tests


def raster_function(order: TokenOrder) -> str:
    """``mask_raster``: the raster position of the token at place ``p`` of ``order`` (identity before the image
    and from the end of the last whole band on, which reads seq_len, ``mask[0]``), in unsigned arithmetic so that
    the divisions by powers of two are shifts."""
    o = order
    return "\n".join([
        f"// The token order's raster map: patches of {o.rows} x {o.cols} in bands of {o.rows} image rows {o.width} "
        f"wide from position {o.origin}",
        "// (maskc.analysis.order.TokenOrder.raster). Bind requires seq_len to hold a whole band.",
        "__device__ __forceinline__ int mask_raster(const int* __restrict__ mask, int p) {",
        f"    constexpr unsigned ORIGIN = {o.origin}u, WIDTH = {o.width}u, ROWS = {o.rows}u, COLS = {o.cols}u, "
        "BAND = ROWS * WIDTH;",
        "    const unsigned end = ORIGIN + BAND * (((unsigned)mask[0] - ORIGIN) / BAND);",
        "    if (p < (int)ORIGIN || (unsigned)p >= end) return p;",
        "    const unsigned u = (unsigned)p - ORIGIN;",
        "    const unsigned y = ROWS * (u / BAND) + (u / COLS) % ROWS;",
        "    const unsigned x = COLS * ((u / (ROWS * COLS)) % (WIDTH / COLS)) + u % COLS;",
        "    return (int)(ORIGIN + WIDTH * y + x);",
        "}", ""])


def element_code(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (),
                 order: TokenOrder | None = None) -> str:
    """The element path's CUDA (module docstring) for the raster mask ``mask`` (its const parameters at
    ``constants``), taking places in ``order`` (None: raster positions). Forms are computed in ``maskc_int``,
    which the predicate's helpers define."""
    layout = TableLayout.of(mask.params)
    w = CWriter(layout, dict(constants), columns=True)
    row_fields, row_body, tests = region_tests(mask, w, "col.k", keys_in_range=True)
    raster = "mask_raster(mask, {})" if order is not None else "{}"
    out = [raster_function(order)] if order is not None else []
    out += ["// The element path (maskc.codegen.elements): what the test of a pair needs of its query row, computed",
            "// once per row and tile.", "struct MaskElementRow {"]
    out += [f"    int {f};" for f in row_fields] + [f"    {ctype} {name};" for name, ctype, _ in w.row_values]
    out += ["};", "",
            "__device__ __forceinline__ MaskElementRow mask_element_row(const int* __restrict__ mask, int b, int h, "
            "int q_place) {",
            "    MaskElementRow row;", f"    const int q = {raster.format('q_place')};",
            "    const int extent = max(mask[0], mask[1]);", "    (void)extent; (void)b; (void)h;"]
    out += [f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], q, extent);"
            for seg, var in w.row_segments.items()]
    out += row_body + [f"    row.{name} = {expr};" for name, _, expr in w.row_values] + ["    return row;", "}", ""]
    out += ["// ... and of its key column, computed once per key column and tile (k: the key's raster position).",
            "struct MaskElementCol {", "    int k;"] + [f"    {ctype} {name};" for name, ctype, _ in w.col_values]
    out += ["};", "",
            "__device__ __forceinline__ MaskElementCol mask_element_col(const int* __restrict__ mask, int b, int h, "
            "int k_place) {",
            "    MaskElementCol col;", f"    const int k = {raster.format('k_place')};",
            "    const int extent = max(mask[0], mask[1]);", "    (void)extent; (void)b; (void)h;"]
    out += [f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], k, extent);"
            for seg, var in w.col_segments.items()]
    out += ["    col.k = k;"] + [f"    col.{name} = {expr};" for name, _, expr in w.col_values]
    out += ["    return col;", "}", "",
            "// Whether the pair (row, col) is visible: the regions' interval tests and atoms, from row and column "
            "values.",
            "__device__ __forceinline__ bool mask_element_visible(const MaskElementRow& row, "
            "const MaskElementCol& col,",
            "                                                     const int* __restrict__ mask) {",
            "    (void)mask;"]
    allowed = " |\n                        ".join(tests["allow"]) or "false"
    out.append(f"    const bool allowed = {allowed};")
    if tests["deny"]:
        denied = " |\n                       ".join(tests["deny"])
        out += [f"    const bool denied = {denied};", "    return allowed && !denied;"]
    else:
        out.append("    return allowed;")
    return "\n".join(out + ["}", ""])
