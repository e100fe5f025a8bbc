"""The element path of PARTIAL tiles (maskc.codegen.elements) is executable: its row, column and pair functions,
compiled as C++ by g++ with the token order's raster map, reproduce the dense mask of the kernel's mask (the
rewritten one in an order: the raster mask's dense mask permuted), at the width the binding chose."""
import ctypes
import dataclasses

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import maskc
from maskc.bound import BoundMask
from maskc.codegen.predicate import pack_mask_data
from maskc.ordered import token_order

from conftest import EXAMPLES, example_params
from mask_strategies import chunk_binding, chunk_mask_text
from host_cxx import build_library, needs_gxx
from test_predicate import SHIM

LOOP = """
// A tile's keys from its first key's raster position (mask_raster_tile, mask_raster_step) against mask_raster key
// by key, for tiles of n keys at multiples of n, as the forward kernel's; *affine: the tiles that took that way.
extern "C" int maskc_check_tiles(const int* mask, int seq_len, int n, int* affine) {
    int bad = 0;
    *affine = 0;
    for (int k0 = 0; k0 < seq_len; k0 += n) {
        const int base = MASK_RASTER_TILES ? mask_raster_tile(mask, k0, n) : -1;
        if (base < 0) continue;
        ++*affine;
        for (int j8 = 0; j8 < n; j8 += 8)
            for (int i = 0; i < 8; ++i)
                bad += base + mask_raster_step(j8) + i != mask_raster(mask, k0 + j8 + i);
    }
    return bad;
}

extern "C" void maskc_fill_elements(const int* mask, int b, int h, int seq_len, int kv_len, unsigned char* out) {
    // as the forward kernel walks a tile: the rows' values first, each key column's once, then the pairs
    for (int q = 0; q < seq_len; ++q) {
        const MaskElementRow row = mask_element_row(mask, b, h, q);
        for (int k = 0; k < kv_len; ++k) {
            const MaskElementCol col = mask_element_col(mask, b, h, k);
            out[(long long)q * kv_len + k] = mask_element_visible(row, col, mask) ? 1 : 0;
        }
    }
}
"""

def compile_elements(source: str):
    lib = build_library(SHIM + "#define __host__\n" + source + LOOP, "the element path")
    lib.maskc_fill_elements.restype = None
    lib.maskc_fill_elements.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int, ctypes.c_int,
                                        ctypes.c_int, ctypes.POINTER(ctypes.c_ubyte)]
    lib.maskc_check_tiles.restype = ctypes.c_int
    lib.maskc_check_tiles.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int, ctypes.c_int,
                                      ctypes.POINTER(ctypes.c_int)]
    return lib


def check_elements(bound, heads=(0,), tiles=(16, 32, 128)) -> int:
    """The element path of ``bound``'s kernel (its spec at the binding's width) against ``bound.dense()``, and its
    tiles' raster positions from their first key's for tiles of ``tiles`` keys; the number of tiles that took that
    way."""
    pred = bound.kernel_spec().predicate
    assert pred.tile_bits and pred.elements
    lib = compile_elements(pred.helpers + pred.elements)
    data, offsets = pack_mask_data(bound.mask.ranges, bound.params)
    affine = 0
    for b in range(bound.batch):
        table = np.ascontiguousarray(data[offsets[b]:], np.int32)
        pointer = table.ctypes.data_as(ctypes.POINTER(ctypes.c_int))
        for n in tiles:
            count = ctypes.c_int(0)
            assert lib.maskc_check_tiles(pointer, bound.seq_len, n, ctypes.byref(count)) == 0, f"tiles of {n} keys"
            affine += count.value
        for h in heads:
            got = np.zeros((bound.seq_len, bound.kv_len), np.uint8)
            lib.maskc_fill_elements(table.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), b, h, bound.seq_len,
                                    bound.kv_len, got.ctypes.data_as(ctypes.POINTER(ctypes.c_ubyte)))
            want = bound.dense(b, h)
            if not np.array_equal(got.astype(bool), want):
                q, k = np.argwhere(got.astype(bool) != want)[0]
                pytest.fail(f"element path differs from dense at b={b} h={h} q={q} k={k}: {got[q, k]}, "
                            f"dense {want[q, k]}")
    return affine


# (mask, bind values, seq_len, orders): small images, the orders the kernels run in, and one whose patches
# do not divide the tile (8x1 on a prime width)
CASES = [
    ("clear", {"text": 7, "width": 16, "radius": 3}, 7 + 16 * 17 + 5, ("8x4", "4x8", "2x1")),
    ("clear", {"text": 32, "width": 16, "radius": 3}, 32 + 16 * 20 + 9, ("2x8", "4x8", "1x8")),
    ("clear", {"text": 0, "width": 13, "radius": 4}, 13 * 18, ("8x1", "4x1")),
    ("neighborhood", {"width": 13, "window": 5}, 13 * 19 + 3, ("8x1", "4x1")),
    ("neighborhood", {"width": 16, "window": 3}, 16 * 12, ("4x8", "8x4")),
    ("video", {"width": 8, "height": 4, "radius": 1, "past": 1}, 8 * 4 * 5 + 7, ("2x4", "4x2")),
    ("video", {"width": 6, "height": 6, "radius": 2, "past": 2}, 6 * 6 * 4, ("3x2", "2x3")),
]


@needs_gxx
@pytest.mark.parametrize("name,params,seq_len,orders", CASES)
def test_element_path_in_raster_and_in_orders_matches_dense(name, params, seq_len, orders):
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    bound = mask.bind(seq_len, **params)
    assert bound.narrow
    check_elements(bound)
    for shape in orders:
        ordered = token_order(bound, shape)
        want = bound.dense()[np.ix_(ordered.permutation, ordered.permutation)]
        assert np.array_equal(ordered.inner.dense(), want)      # the oracle: the raster mask permuted
        affine = check_elements(ordered.inner)
        # patches 8 columns wide or more, starting where tiles do: tiles mapped from their first key
        assert (affine > 0) == (ordered.order.cols % 8 == 0 and ordered.order.origin % 16 == 0), (shape, affine)


@needs_gxx
def test_element_path_at_the_benchmark_widths():
    """CLEAR's benchmark constants (text 512, width 128) in 8 x 16 and 16 x 8 patches and raster, at a length
    that leaves a short last band, and 64-bit forms (a binding with narrow off)."""
    mask = maskc.load(EXAMPLES / "clear.mask")
    bound = mask.bind(512 + 128 * 17 + 40, radius=5)
    check_elements(bound)
    for shape in ("8x16", "16x8", "4x32"):
        check_elements(token_order(bound, shape).inner)
    check_elements(BoundMask(bound.mask, dataclasses.replace(bound.params, narrow=False)))


@needs_gxx
@pytest.mark.parametrize("name", ["sliding_tile", "clear", "neighborhood", "video"])
def test_element_path_of_the_examples_at_small_lengths(name):
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    rng = np.random.default_rng(sum(map(ord, name)) + 1)
    done = 0
    for _ in range(10):
        s = int(rng.integers(1, 120))
        try:
            bound = mask.bind(s, **example_params(name, s, rng))
        except maskc.errors.BindError:
            continue
        if bound.kernel_spec().predicate.tile_bits:
            check_elements(bound, heads=range(bound.num_heads or 1))
            done += 1
    assert done >= 3


@needs_gxx
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(chunk_mask_text(), chunk_binding())
def test_random_chunk_masks_element_path_matches_dense(text, binding):
    """Hypothesis chunk masks (segments, per-key segment reads, deny regions) in raster order."""
    seq_len, kv_len, params = binding
    try:
        mask = maskc.compile_mask(text)
        bound = mask.bind(seq_len, kv_len, **params)
    except maskc.errors.MaskError:
        return
    if not bound.kernel_spec().predicate.tile_bits:
        return
    check_elements(bound)


# ---- the plan's choice and the kernels ------------------------------------------------------------------------

def test_partial_tiles_option_reaches_the_plan_and_the_kernel_key():
    from maskc.options import Options
    bound = maskc.load(EXAMPLES / "clear.mask").bind(4096)
    default, bits, elements, stored = (bound.mask.kernel_source(o) for o in (
        Options(), Options(partial_tiles="bits"), Options(partial_tiles="elements"), Options(partial_tiles="stored")))
    assert default.plan.partial_tiles == stored.plan.partial_tiles == "stored" and bits.plan.partial_tiles == "bits"
    assert default.source == stored.source and "mask_element_visible" not in bits.source
    assert "mask_stored(s, t, words," in stored.source and "mask_stored(" not in bits.source
    assert elements.plan.partial_tiles == "elements" and elements.plan.root_tables == 0
    assert "mask_bits(row, mask" in bits.source and "mask_bits(row, mask" not in elements.source
    assert "mask_element_visible(rows[half], col, mask)" in elements.source
    assert len({Options(partial_tiles=p).forward_switches for p in ("bits", "elements", "stored")}) == 3
    with pytest.raises(ValueError, match="partial tiles"):
        Options(partial_tiles="pairs")
    # masks without a tile path keep their one path whatever is asked
    for name in ("causal", "document"):
        mask = maskc.load(EXAMPLES / f"{name}.mask")
        src = mask.kernel_source(Options(partial_tiles="elements"))
        assert src.plan.partial_tiles == "" and src.source == mask.kernel_source().source
    mma = maskc.load(EXAMPLES / "clear.mask").kernel_source(Options(partial_tiles="elements", engine="mma"))
    assert mma.plan.partial_tiles == ""
    # the backward takes the same choice on every engine (its visibility words), its root tables only for bits;
    # "auto" is the stored path where the dK/dV kernel can read stored bits (wgmma_tma, two stages of them)
    for engine in ("mma", "wgmma", "wgmma_tma"):
        bwd = {p: bound.mask.backward_source(Options(partial_tiles=p), engine=engine)
               for p in ("auto", "bits", "elements")}
        assert bwd["auto"].spec.partial_tiles == ("stored" if engine == "wgmma_tma" else "bits")
        assert bwd["bits"].spec.partial_tiles == "bits" and bwd["elements"].spec.partial_tiles == "elements"
        assert "__ballot_sync(0xffffffffu, shown)" in bwd["elements"].source
        assert "fill_root_tables(" in bwd["bits"].source and "fill_root_tables(" not in bwd["elements"].source
        assert ("col_words + (long long)slot * BITS_WORDS" in bwd["auto"].source) == (engine == "wgmma_tma")
    d256 = bound.mask.backward_source(Options(), engine="wgmma_tma", head_dim=256)
    assert d256.spec.partial_tiles == "bits"        # one stage of bits there: the consumers make them


@pytest.mark.parametrize("name,order", [("clear", None), ("clear", "8x16"), ("clear", "16x8"), ("neighborhood", None),
                                        ("neighborhood", "8x1"), ("video", None), ("video", "8x16"),
                                        ("sliding_tile", None)])
def test_element_path_kernels_compile_without_spills(name, order):
    """The forward with the element path through NVRTC and ptxas (-v): no spills, at both widths."""
    pytest.importorskip("cupy")
    import re
    from maskc.codegen.emit import compile_with_log
    from maskc.options import Options
    from maskc.ordered import in_order
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    if order is not None:
        mask = in_order(mask, order)
    for narrow in (True, False):
        src = mask.kernel_source(Options(partial_tiles="elements"), narrow=narrow)
        assert src.plan.partial_tiles == "elements"
        _, log = compile_with_log(src, ("--ptxas-options=-v",))
        assert re.search(r"\b0 bytes spill stores", log), log
    # the backward's kernels on the Hopper default engine (warp-specialized): none spills either
    src = mask.backward_source(Options(partial_tiles="elements"), engine="wgmma_tma", narrow=True)
    assert src.spec.partial_tiles == "elements"
    _, log = compile_with_log(src, ("--ptxas-options=-v",))
    assert set(re.findall(r"(\d+) bytes spill stores", log)) == {"0"}, log


def test_the_stored_path_only_where_the_words_serve_every_head():
    """Stored words are built once per tile for every head: a mask that reads h keeps the tile path, and so does a
    kernel that cannot read them (the stored choice asked of the backward's other engines)."""
    import dataclasses
    pred = maskc.load(EXAMPLES / "clear.mask").kernel_spec().predicate
    assert pred.partial_path("auto", stored=True) == pred.partial_path("stored", stored=True) == "stored"
    assert pred.partial_path("stored", stored=False) == "bits"
    assert dataclasses.replace(pred, reads_head=True).partial_path("stored", stored=True) == "bits"
    assert pred.partial_path("elements", stored=True) == "elements"
