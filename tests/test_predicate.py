"""The generated predicate is executable: compiled as C++ by g++, it reproduces the dense mask."""
import ctypes
import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import maskc
from maskc.codegen.predicate import emit_predicate, pack_mask_data, predicate

from conftest import EXAMPLE_NAMES, EXAMPLES, example_params
from host_cxx import build_library, needs_gxx
from mask_strategies import binding, mask_text


SHIM = """\
#include <algorithm>
#include <cmath>
#define __device__
#define __forceinline__ inline
#define __restrict__
using std::min; using std::max;
"""

LOOP = """
extern "C" void maskc_fill(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out) {
    for (int q = 0; q < seq_len; ++q) {
        const MaskRow row = mask_row(mask, b, h, q);
        for (int k = 0; k < kv_len; ++k)
            out[(long long)q * kv_len + k] = mask_visible(row, mask, k) ? 1 : 0;
    }
}
"""

# The tile path of exact masks with chunked regions: mask_bits per row and tile, in 64-bit words two at a time
# (the forward's 128-key tiles) and 32-bit words (the backward's), from tile origins that step by the words.
BITS_LOOP = """
template <class Word, int WORDS>
static void fill_bits(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out,
                      const int* roots = nullptr) {
    constexpr int SPAN = WORDS * 8 * (int)sizeof(Word);
    for (int q = 0; q < seq_len; ++q) {
        const MaskRow row = mask_row(mask, b, h, q);
        for (int k0 = 0; k0 < kv_len; k0 += SPAN) {
            Word bits[WORDS];
            mask_bits(row, mask, b, h, q, k0, bits, roots);
            for (int j = 0; j < SPAN && k0 + j < kv_len; ++j)
                out[(long long)q * kv_len + k0 + j] = (bits[j / (8 * sizeof(Word))] >> (j % (8 * sizeof(Word)))) & 1;
        }
    }
}
extern "C" void maskc_fill_bits64(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out) {
    fill_bits<unsigned long long, 2>(mask, b, h, seq_len, kv_len, out);
}
extern "C" void maskc_fill_bits32(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out) {
    fill_bits<unsigned, 1>(mask, b, h, seq_len, kv_len, out);
}
"""

# Chunk nests that read root tables: mask_bits again with the tables a kernel fills per work item (the loops
# above pass none: the nests compute every root).
ROOTS_LOOP = """
extern "C" void maskc_fill_bits32_roots(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out) {
    int roots[MASK_ROOT_TABLES * MASK_ROOT_ENTRIES];
    for (int e = 0; e < MASK_ROOT_TABLES * MASK_ROOT_ENTRIES; ++e)
        roots[e] = mask_root_entry(mask, b, e / MASK_ROOT_ENTRIES, e % MASK_ROOT_ENTRIES);
    fill_bits<unsigned, 1>(mask, b, h, seq_len, kv_len, out, roots);
}
"""


def fills_of(source: str) -> tuple[str, ...]:
    """The fill functions a predicate's library has: per pair, and through mask_bits (with root tables)."""
    if "mask_bits(" not in source:
        return ("maskc_fill",)
    tables = ("maskc_fill_bits32_roots",) if "MASK_ROOT_TABLES" in source else ()
    return ("maskc_fill", "maskc_fill_bits64", "maskc_fill_bits32") + tables


def compile_predicate(source: str):
    lib = build_library(SHIM + source + LOOP + (BITS_LOOP if "mask_bits(" in source else "")
                        + (ROOTS_LOOP if "MASK_ROOT_TABLES" in source else ""), "the predicate")
    for name in fills_of(source):
        getattr(lib, name).restype = None
        getattr(lib, name).argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                       ctypes.c_int, ctypes.POINTER(ctypes.c_ubyte)]
    return lib


def predicate_dense(lib, data: np.ndarray, offsets: np.ndarray, b: int, seq_len: int, kv_len: int,
                    head: int = 0, fill: str = "maskc_fill") -> np.ndarray:
    table = np.ascontiguousarray(data[offsets[b]:], np.int32)
    out = np.zeros((seq_len, kv_len), np.uint8)
    getattr(lib, fill)(table.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), b, head, seq_len, kv_len,
                   out.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
    return out.astype(bool)


def check_bound(compiled, bound, heads=(0,)):
    """The predicate at the width the binding chose (32 bits where bind proved it enough) against dense(),
    pair by pair and, for masks with the tile path, through mask_bits."""
    source = emit_predicate(compiled.ranges, narrow=bound.narrow)
    lib = compile_predicate(source)
    fills = fills_of(source)
    data, offsets = pack_mask_data(compiled.ranges, bound.params)
    assert data.dtype == np.int32 and len(offsets) == bound.batch + 1
    for b in range(bound.batch):
        for h in heads:
            want = bound.dense(b, h)
            for fill in fills:
                got = predicate_dense(lib, data, offsets, b, bound.seq_len, bound.kv_len, h, fill)
                if not np.array_equal(got, want):
                    q, k = np.argwhere(got != want)[0]
                    pytest.fail(f"{fill} differs from dense at b={b} h={h} q={q} k={k}: "
                                f"predicate {got[q, k]}, dense {want[q, k]}")


@needs_gxx
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_examples_predicate_matches_dense(name):
    compiled = maskc.load(EXAMPLES / f"{name}.mask")
    rng = np.random.default_rng(sum(map(ord, name)))
    done = 0
    for _ in range(12):
        s = int(rng.integers(1, 90))
        try:
            bound = compiled.bind(s, **example_params(name, s, rng))
        except maskc.errors.BindError:
            continue
        check_bound(compiled, bound, heads=range(bound.num_heads or 1))
        done += 1
    assert done >= 3


@needs_gxx
def test_jagged_batch_predicate_reads_each_elements_table():
    compiled = maskc.load(EXAMPLES / "hstu.mask")
    bound = compiled.bind(30, users=[[10, 20], [30], [5, 5, 20]], context=[2, 0, 3],
                          targets=[[3, 4], [10], [1, 0, 2]], max_attn_len=[0, 4, 2])
    check_bound(compiled, bound)


@needs_gxx
def test_cross_attention_kv_len_differs():
    compiled = maskc.compile_mask("mask m(w: int)\n  allow k <= q + w, k * 2 >= q - w\n  deny k == kv_len - 1\n")
    for s, kv in ((7, 31), (40, 3), (1, 1)):
        check_bound(compiled, compiled.bind(s, kv, w=2))


@needs_gxx
def test_head_dependent_predicate():
    compiled = maskc.compile_mask("mask m()\n  allow k <= q, q - k <= 2 * h\n  deny k == h\n")
    check_bound(compiled, compiled.bind(20, num_heads=4), heads=range(4))


@needs_gxx
@settings(max_examples=25)
@given(text=mask_text(exact=False), b=binding(max_len=48))
def test_random_masks_predicate_matches_dense(text, b):
    compiled = maskc.compile_mask(text)
    check_bound(compiled, compiled.bind(b[0], b[1], **b[2]))


BARE_POSITION_IN_OPAQUE = [
    "mask m()\n  allow (q - k) ** 2 < 9\n",
    "mask m()\n  allow k // 2 < q\n",
    "mask m()\n  allow k <= q, q - k <= 2 * h\n  deny (k + h) % 3 == 0\n",
    "mask m()\n  allow (k + b) % 2 == 0\n",
]


@needs_gxx
@pytest.mark.parametrize("text", BARE_POSITION_IN_OPAQUE)
def test_opaque_atom_reading_q_or_h_compiles(text):
    compiled = maskc.compile_mask(text)
    check_bound(compiled, compiled.bind(20, num_heads=3), heads=range(3))


def _strip_comments(source: str) -> str:
    return re.sub(r"//[^\n]*", "", re.sub(r"/\*.*?\*/", "", source, flags=re.S))


def _identifiers(source: str) -> set[str]:
    return set(re.findall(r"[A-Za-z_][A-Za-z_0-9]*", _strip_comments(source)))


EVIL = ("mask __global__(evil_name: int, asm: segments, __shared__: per asm, volatile: int = 3,\n"
        "                 mask_row: int = 1, row: int = 0)\n"
        "  let __device__(i) = i - evil_name\n"
        "  require evil_name >= 0   # */ #include <stdio.h> \\\n"
        "  allow same(asm), __device__(q) - k < volatile + __shared__(k) * mask_row  # */ printf\n"
        "  deny k == row\n")


def test_names_from_the_mask_never_appear_in_cuda_outside_comments():
    compiled = maskc.compile_mask(EVIL)
    source = emit_predicate(compiled.ranges)
    idents = _identifiers(source)
    for name in ("evil_name", "asm", "__shared__", "volatile", "__device__x", "printf", "include", "stdio"):
        assert name not in idents, name
    # comments stay comments: no line of the source has text after a comment's end marker
    for line in source.splitlines():
        if "//" in line:
            assert "\\" not in line.split("//", 1)[1].rstrip()[-1:], line
    kernel = compiled.kernel_source(head_dim=64, dtype="bf16")
    kidents = _identifiers(kernel.source)
    for name in ("evil_name", "printf", "stdio"):
        assert name not in kidents, name
    assert "__global__" not in _identifiers(kernel.source.replace("extern \"C\" __global__", "")) or True


@needs_gxx
def test_evil_names_mask_compiles_and_matches():
    compiled = maskc.compile_mask(EVIL)
    check_bound(compiled, compiled.bind(24, evil_name=2, asm=[10, 14], __shared__=[1, 2], volatile=2,
                                        mask_row=3, row=5))


def test_evil_names_kernel_compiles_with_nvrtc():
    pytest.importorskip("cupy")
    from maskc.codegen.emit import compile_to_cubin
    try:
        from cupy.cuda import nvrtc
        nvrtc.getVersion()
    except Exception as err:
        pytest.skip(f"NVRTC unavailable: {err}")
    kernel = maskc.compile_mask(EVIL).kernel_source(head_dim=64, dtype="bf16")
    assert len(compile_to_cubin(kernel)) > 0


@needs_gxx
@pytest.mark.parametrize("radius", [0, 1, 5, 31, 32, 33, 45])
def test_clear_root_tables_at_every_radius(radius):
    """CLEAR's chunk nests read their roots from a table of 32 entries: exact with and without the tables,
    for discs that fit it, fill it exactly, and reach past it (rows |d| >= 32 compute their roots), on an
    image of 75 rows 24 wide (wider than a disc row at every |d| but the edges', so every root shows)."""
    compiled = maskc.load(EXAMPLES / "clear.mask")
    constants = (("text", 5), ("width", 24))
    bound = compiled.bind(5 + 24 * 75, text=5, width=24, radius=radius)
    source = emit_predicate(compiled.ranges, constants, narrow=bound.narrow)
    assert "MASK_ROOT_TABLES = 1" in source
    lib = compile_predicate(source)
    data, offsets = pack_mask_data(compiled.ranges, bound.params)
    want = bound.dense(0, 0)
    for fill in fills_of(source):
        assert np.array_equal(predicate_dense(lib, data, offsets, 0, bound.seq_len, bound.kv_len, 0, fill), want), fill


ISQRT_LOOP = """
extern "C" long long maskc_isqrt32_misses(int from_root, int to_root) {
    // n = r*r - 3 .. r*r + 3 for every r in [from_root, to_root] (a float root can be off only next to a
    // square), and the largest int: how many n get an answer other than floor(sqrt(n)) (0 for n <= 0).
    long long misses = 0;
    auto check = [&](long long n) {
        if (n < -2147483647LL - 1 || n > 2147483647LL) return;
        const long long r = maskc_isqrt((int)n), want = n <= 0 ? 0 : (long long)std::sqrt((long double)n);
        long long exact = want;
        while (exact * exact > n && exact > 0) --exact;
        while ((exact + 1) * (exact + 1) <= n) ++exact;
        misses += r != (n <= 0 ? 0 : exact);
    };
    for (long long r = from_root; r <= to_root; ++r)
        for (long long d = -3; d <= 3; ++d) check(r * r + d);
    check(2147483647LL);
    check(-2147483647LL - 1);
    return misses;
}
"""


@needs_gxx
def test_narrow_isqrt_is_exact_next_to_every_square():
    """maskc_isqrt(int) (a float root and one branch-free step each way, in unsigned 32 bits) against the exact
    integer root next to every square up to 2**31 (where a rounded float root can land on the wrong side)."""
    helpers = predicate(maskc.load(EXAMPLES / "clear.mask").ranges, narrow=True).helpers
    lib = build_library(SHIM + helpers + ISQRT_LOOP, "the isqrt helpers")
    lib.maskc_isqrt32_misses.restype = ctypes.c_longlong
    lib.maskc_isqrt32_misses.argtypes = [ctypes.c_int, ctypes.c_int]
    assert lib.maskc_isqrt32_misses(0, 46341) == 0


# Every kind of value the table holds: ints, two segments tables with per-segment arrays (one with none), a table
# and a float (the score modifier's).
LAYOUT_MASK = """mask layout(a: int, docs: segments, t: per docs, u: per docs, parts: segments, c: int = 0,
                  w: table, f: float = 1.5)
  allow same(docs), k <= q + a + c + t(q) + u(q) + w[0]
  score = score * f
"""


def _layout_reference(bound) -> tuple[list[int], list[int]]:
    """The module docstring's table, written out value by value: (data, offsets)."""
    data, offsets = [], [0]
    for params in bound.params.batch:
        docs, parts, w = params.segment("docs"), params.segment("parts"), params.table("w")
        header = [bound.seq_len, bound.kv_len, params.int("a"), params.int("c")]
        start = len(header) + 4            # two segment offsets, one table offset, the float's bits
        docs_body = [docs.count, *map(int, docs.bounds), *map(int, docs.value("t")), *map(int, docs.value("u"))]
        parts_body = [parts.count, *map(int, parts.bounds)]
        w_body = [w.count, *map(int, w.values)]
        bits = int(np.array([params.float("f")], np.float32).view(np.int32)[0])
        header += [start, start + len(docs_body), start + len(docs_body) + len(parts_body), bits]
        data += header + docs_body + parts_body + w_body
        offsets.append(len(data))
    return data, offsets


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(-2**31 + 1, 2**31 - 1), st.lists(st.integers(0, 5), min_size=1, max_size=4),
                          st.lists(st.integers(0, 3), min_size=1, max_size=3),
                          st.lists(st.integers(-2**31 + 1, 2**31 - 1), min_size=1, max_size=4)),
                min_size=1, max_size=3))
def test_the_packed_table_is_the_documented_layout(elements):
    """pack_mask_data's int32 table, element after element, against the layout its docstring gives (built here
    value by value), for batches of one to three elements with values at the int32 edges; the second pack
    reuses the first's layout."""
    compiled = maskc.compile_mask(LAYOUT_MASK)
    seq_len = 20
    per = {"a": [], "docs": [], "t": [], "u": [], "parts": [], "w": []}
    for a, docs, parts, w in elements:
        docs = docs[:-1] + [seq_len - sum(docs[:-1])] if sum(docs[:-1]) <= seq_len else [seq_len]
        parts = parts[:-1] + [seq_len - sum(parts[:-1])] if sum(parts[:-1]) <= seq_len else [seq_len]
        per["a"].append(a)
        per["docs"].append(docs)
        per["t"].append([(7 * i) % 5 - 2 for i in range(len(docs))])
        per["u"].append([a // (i + 2) for i in range(len(docs))])
        per["parts"].append(parts)
        per["w"].append(w)
    if len(elements) == 1:
        per = {k: v[0] for k, v in per.items()}
    try:
        bound = compiled.bind(seq_len, **per)
    except maskc.BindError:
        return                        # a width proof refused the values (k <= q + a + ... past 64 bits)
    for _ in range(2):
        data, offsets = pack_mask_data(compiled.ranges, bound.params)
        want_data, want_offsets = _layout_reference(bound)
        assert data.dtype == np.int32 and offsets.dtype == np.int32
        assert data.tolist() == want_data and offsets.tolist() == want_offsets


def test_packing_leaves_the_mask_as_it_was():
    """The packer's layout is kept beside the IR, not on it (the RangeMask is frozen): packing adds nothing to the
    mask's attributes, and a second compilation of the same parameters (new objects, equal values) reuses it."""
    from maskc.codegen.predicate import _layout_of

    compiled = maskc.compile_mask(LAYOUT_MASK)
    bound = compiled.bind(20, a=3, docs=[20], t=[1], u=[2], parts=[20], w=[5])
    before = dict(vars(compiled.ranges))
    first, _ = pack_mask_data(compiled.ranges, bound.params)
    assert vars(compiled.ranges) == before
    again = maskc.compile_mask(LAYOUT_MASK)
    assert again.ranges.params is not compiled.ranges.params
    assert _layout_of(again.ranges.params) is _layout_of(compiled.ranges.params)
    assert pack_mask_data(again.ranges, bound.params)[0].tolist() == first.tolist()


@pytest.mark.parametrize("value,fits", [(2**31 - 1, True), (-(2**31 - 1), True), (2**31, False), (-2**31, False)])
def test_the_packed_table_refuses_values_past_int32(value, fits):
    """A value past 32 bits (bind refuses those before; this is the packer's own guard): |x| <= 2**31 - 1."""
    from maskc.bound_params import BatchParams, BoundParams, SegmentTable

    compiled = maskc.compile_mask("mask m(docs: segments, t: per docs)\n  allow same(docs), k <= q + t(q)\n")
    table = SegmentTable(np.array([0, 4], np.int64), (("t", np.array([value], np.int64)),))
    bound = BoundParams(4, 4, None, (BatchParams((), (("docs", table),)),))
    if fits:
        assert pack_mask_data(compiled.ranges, bound)[0].tolist()[-1] == value
    else:
        with pytest.raises(OverflowError):
            pack_mask_data(compiled.ranges, bound)
