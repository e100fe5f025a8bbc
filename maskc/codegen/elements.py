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


FRAGMENT_COLUMNS = 8
"""Consecutive key columns a thread of the forward's fragment layout holds two of: column ``8 * nt + 2 * t + e``."""


def raster_functions(order: TokenOrder | None) -> str:
    """The token order's map from places to raster positions, for the element path (module docstring):

    ``MASK_RASTER_ORDER``: whether places differ from raster positions at all (false: the raster order, every
    function below the identity). ``mask_raster(mask, p)``: the raster position of the token at place ``p``
    (:meth:`~maskc.analysis.order.TokenOrder.raster`: identity before the image and from the end of the last whole
    band on, which reads seq_len, ``mask[0]``), in unsigned arithmetic so that divisions by powers of two are
    shifts. A tile's keys need not each pay for it: ``mask_raster_tile(mask, k0, n)`` is ``raster(k0)`` where the
    keys ``k0 .. k0 + n - 1`` lie in the bands, from a patch's first token, within one band (-1 elsewhere), and
    then, for patches whose width is a multiple of :data:`FRAGMENT_COLUMNS` (``MASK_RASTER_TILES``),
    ``raster(k0 + j8 + i) = raster(k0) + mask_raster_step(j8) + i`` for every multiple ``j8`` of 8 and ``i < 8``
    (the columns ``j8 .. j8 + 7`` lie in one row of one patch), a constant per unrolled column group."""
    if order is None:
        return "\n".join([
            "// Places are raster positions (maskc.codegen.elements.raster_functions): the maps are identities.",
            "constexpr bool MASK_RASTER_ORDER = false, MASK_RASTER_TILES = true;",
            "__device__ __forceinline__ int mask_raster(const int* __restrict__ mask, int p) { (void)mask; return p; }",
            "__device__ __forceinline__ int mask_raster_tile(const int* __restrict__ mask, int k0, int n) {",
            "    (void)mask; (void)n;", "    return k0;", "}",
            "__host__ __device__ constexpr int mask_raster_step(int j8) { return j8; }", ""])
    o = order
    tiles = o.cols % FRAGMENT_COLUMNS == 0
    return "\n".join([
        f"// The token order's raster map: patches of {o.rows} x {o.cols} in bands of {o.rows} image rows {o.width} "
        f"wide from position {o.origin}",
        "// (maskc.analysis.order.TokenOrder.raster; maskc.codegen.elements.raster_functions). Bind requires seq_len "
        "to hold a whole band.",
        f"constexpr bool MASK_RASTER_ORDER = true, MASK_RASTER_TILES = {'true' if tiles else 'false'};",
        f"constexpr unsigned MASK_ORDER_ORIGIN = {o.origin}u, MASK_ORDER_WIDTH = {o.width}u, MASK_ORDER_ROWS = "
        f"{o.rows}u, MASK_ORDER_COLS = {o.cols}u;",
        "constexpr unsigned MASK_ORDER_PATCH = MASK_ORDER_ROWS * MASK_ORDER_COLS, MASK_ORDER_BAND = MASK_ORDER_ROWS * "
        "MASK_ORDER_WIDTH;",
        "__device__ __forceinline__ unsigned mask_order_end(const int* __restrict__ mask) {   // the last whole band's end",
        "    return MASK_ORDER_ORIGIN + MASK_ORDER_BAND * (((unsigned)mask[0] - MASK_ORDER_ORIGIN) / MASK_ORDER_BAND);",
        "}",
        "__device__ __forceinline__ int mask_raster(const int* __restrict__ mask, int p) {",
        "    if (p < (int)MASK_ORDER_ORIGIN || (unsigned)p >= mask_order_end(mask)) return p;",
        "    const unsigned u = (unsigned)p - MASK_ORDER_ORIGIN;",
        "    const unsigned y = MASK_ORDER_ROWS * (u / MASK_ORDER_BAND) + (u / MASK_ORDER_COLS) % MASK_ORDER_ROWS;",
        "    const unsigned x = MASK_ORDER_COLS * ((u / MASK_ORDER_PATCH) % (MASK_ORDER_WIDTH / MASK_ORDER_COLS)) "
        "+ u % MASK_ORDER_COLS;",
        "    return (int)(MASK_ORDER_ORIGIN + MASK_ORDER_WIDTH * y + x);",
        "}",
        "__device__ __forceinline__ int mask_raster_tile(const int* __restrict__ mask, int k0, int n) {",
        "    if (!MASK_RASTER_TILES || k0 < (int)MASK_ORDER_ORIGIN || (unsigned)(k0 + n) > mask_order_end(mask)) "
        "return -1;",
        "    const unsigned u0 = (unsigned)k0 - MASK_ORDER_ORIGIN;",
        "    if (u0 % MASK_ORDER_PATCH != 0 || u0 % MASK_ORDER_BAND + (unsigned)n > MASK_ORDER_BAND) return -1;",
        "    return mask_raster(mask, k0);",
        "}",
        "__host__ __device__ constexpr int mask_raster_step(int j8) {",
        "    return (int)(MASK_ORDER_WIDTH * ((j8 % MASK_ORDER_PATCH) / MASK_ORDER_COLS) + MASK_ORDER_COLS * "
        "(j8 / MASK_ORDER_PATCH)",
        "                 + (j8 % MASK_ORDER_PATCH) % MASK_ORDER_COLS);",
        "}", ""])


def element_code(mask: ir.RangeMask, constants: tuple[tuple[str, int], ...] = (),
                 order: TokenOrder | None = None) -> str:
    """The element path's CUDA (module docstring) for the raster mask ``mask`` (its const parameters at
    ``constants``), taking places in ``order`` (None: raster positions). Forms are computed in ``maskc_int``,
    which the predicate's helpers define."""
    layout = TableLayout.of(mask.params)
    w = CWriter(layout, dict(constants), columns=True)
    row_fields, row_body, tests = region_tests(mask, w, "col.k", keys_in_range=True)
    raster = "mask_raster(mask, {})" if order is not None else "{}"      # (the identity's call left out)
    out = [raster_functions(order)]
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
    out += ["// ... and of its key column, computed once per key column and tile (k: the key's raster position;",
            "// mask_element_col_at takes it, mask_element_col the key's place).",
            "struct MaskElementCol {", "    int k;"] + [f"    {ctype} {name};" for name, ctype, _ in w.col_values]
    out += ["};", "",
            "__device__ __forceinline__ MaskElementCol mask_element_col_at(const int* __restrict__ mask, int b, int h, "
            "int k) {",
            "    MaskElementCol col;",
            "    const int extent = max(mask[0], mask[1]);", "    (void)extent; (void)b; (void)h;"]
    out += [f"    const MaskSegment {var} = maskc_segment(mask + mask[{layout.seg_slot(seg)}], k, extent);"
            for seg, var in w.col_segments.items()]
    out += ["    col.k = k;"] + [f"    col.{name} = {expr};" for name, _, expr in w.col_values]
    out += ["    return col;", "}",
            "__device__ __forceinline__ MaskElementCol mask_element_col(const int* __restrict__ mask, int b, int h, "
            "int k_place) {",
            f"    return mask_element_col_at(mask, b, h, {raster.format('k_place')});", "}", "",
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
