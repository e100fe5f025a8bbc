"""Sub-blocks of bound masks (BoundMask.restrict): the dense mask, tile classes, the offset predicate (g++ and
NVRTC) and attention on the CPU, each against the parent's dense mask."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import maskc
from maskc.codegen.predicate import emit_predicate, pack_mask_data

from conftest import EXAMPLE_NAMES, EXAMPLES, example_params, tile_truth
from host_cxx import needs_gxx
from test_predicate import compile_predicate, predicate_dense

MASKS = {name: maskc.load(EXAMPLES / f"{name}.mask") for name in EXAMPLE_NAMES}


def random_bound(name, rng, lo=1, hi=120, heads=2):
    for _ in range(50):
        S = int(rng.integers(lo, hi))
        try:
            return MASKS[name].bind(S, **example_params(name, S, rng, heads))
        except maskc.MaskError:
            continue
    raise AssertionError("no binding")


def random_window(rng, S, K):
    q0 = int(rng.integers(0, S))
    k0 = int(rng.integers(0, K))
    return (q0, int(rng.integers(q0 + 1, S + 1))), (k0, int(rng.integers(k0 + 1, K + 1)))


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_dense_and_tiles_match_the_parents_block(name):
    rng = np.random.default_rng(sum(map(ord, name)))
    for _ in range(15):
        bound = random_bound(name, rng)
        qr, kr = random_window(rng, bound.seq_len, bound.kv_len)
        sub = bound.restrict(qr, kr)
        assert (sub.seq_len, sub.kv_len) == (qr[1] - qr[0], kr[1] - kr[0])
        for h in range(bound.num_heads or 1):
            dense = sub.dense(0, h)
            np.testing.assert_array_equal(dense, bound.dense(0, h)[qr[0]:qr[1], kr[0]:kr[1]])
            for bm, bn in ((16, 16), (8, 32), (32, 8), (128, 64)):
                got, want = sub.tiles(bm, bn), tile_truth(dense, bm, bn)
                assert np.all((got == maskc.PARTIAL) | (got == want)), "unsound class"
                if MASKS[name].exact and not bound.num_heads:      # a mask that reads h: sound for every head
                    np.testing.assert_array_equal(got, want)


@given(st.data())
def test_aligned_windows_reuse_the_parents_tiles(data):
    """q0, k0 and the ends multiples of the tiles: the parent's tiles, sliced, and no finer map is built."""
    name = data.draw(st.sampled_from(EXAMPLE_NAMES))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**31)))
    bound = random_bound(name, rng, 40, 200)
    qt, kt = -(-bound.seq_len // 16), -(-bound.kv_len // 8)
    i0 = data.draw(st.integers(0, qt - 1))
    i1 = data.draw(st.integers(i0 + 1, qt))
    j0 = data.draw(st.integers(0, kt - 1))
    j1 = data.draw(st.integers(j0 + 1, kt))
    sub = bound.restrict((i0 * 16, min(i1 * 16, bound.seq_len)), (j0 * 8, min(j1 * 8, bound.kv_len)))
    np.testing.assert_array_equal(sub.tiles(16, 8), bound.tiles(16, 8)[i0:i1, j0:j1])
    assert set(bound.__dict__["_tile_maps"]) == {(16, 8)}


def test_nested_restriction_and_batches():
    bound = MASKS["hstu"].bind(30, users=[[10, 20], [30], [5, 5, 20]], context=[2, 0, 3],
                               targets=[[3, 4], [10], [1, 0, 2]], max_attn_len=[0, 4, 2])
    sub = bound.restrict((5, 29), range(3, 30)).restrict((2, 20), (1, 25))
    assert (sub.q_start, sub.q_stop, sub.kv_start, sub.kv_stop) == (7, 25, 4, 28)
    for b in range(3):
        np.testing.assert_array_equal(sub.dense(b), bound.dense(b)[7:25, 4:28])
        np.testing.assert_array_equal(sub.tile_map(4, 4).classes[b], tile_truth(sub.dense(b), 4, 4))


@pytest.mark.parametrize("bad", [((0, 0), (0, 5)), ((3, 2), (0, 5)), ((0, 11), (0, 5)), ((-1, 3), (0, 5)),
                                 (range(0, 6, 2), (0, 5)), ((0, 5), None)])
def test_bad_ranges(bad):
    bound = MASKS["causal"].bind(10)
    with pytest.raises(ValueError):
        bound.restrict(*bad)


def test_descriptor_tables_carry_the_origin():
    bound = MASKS["document"].bind(100, docs=[30, 70])
    sub = bound.restrict((40, 90), (20, 60))
    desc = sub.descriptor(16, 16)
    plain, _ = pack_mask_data(bound.mask.ranges, bound.params)
    assert desc.mask_data.tolist() == [40, 20] + plain.tolist()
    assert desc.mask_offsets.tolist() == [0, len(plain) + 2]
    assert sub.mask is bound.mask.with_offsets() is MASKS["document"].with_offsets().with_offsets()
    assert sub.kernel_spec(head_dim=64, dtype="bf16").mask_name == "document_sub"


@needs_gxx
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_offset_predicate_matches_dense(name):
    """The generated device code (compiled by g++ with a shim) of a sub-block, fed local positions."""
    compiled = MASKS[name]
    lib = compile_predicate(emit_predicate(compiled.ranges, offsets=True))
    rng = np.random.default_rng(7 + sum(map(ord, name)))
    for _ in range(8):
        bound = random_bound(name, rng, 1, 90)
        qr, kr = random_window(rng, bound.seq_len, bound.kv_len)
        sub = bound.restrict(qr, kr)
        data, offsets = pack_mask_data(compiled.ranges, bound.params, origin=sub.origin)
        for h in range(bound.num_heads or 1):
            got = predicate_dense(lib, data, offsets, 0, sub.seq_len, sub.kv_len, h)
            np.testing.assert_array_equal(got, sub.dense(0, h))


@pytest.mark.parametrize("name", ["document", "clear", "hstu"])
def test_offset_kernels_compile_through_nvrtc(name):
    """Forward and backward kernels of a sub-block (exact masks keep the interval path)."""
    pytest.importorskip("cupy")
    from maskc.codegen.emit import compile_to_cubin, emit_backward_kernel, emit_kernel, interval_regions
    bound = random_bound(name, np.random.default_rng(1), 200, 300)
    sub = bound.restrict((64, bound.seq_len), (0, 128))
    spec = sub.kernel_spec(head_dim=128, dtype="bf16")
    assert (interval_regions(spec) is None) == (not MASKS[name].ranges.linear)
    assert len(compile_to_cubin(emit_kernel(spec))) > 10_000
    source = emit_backward_kernel(sub.backward_spec(head_dim=64, dtype="fp16"))
    cubin = compile_to_cubin(source)
    assert all(entry.encode() in cubin for entry in source.functions)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_attention_on_a_block_is_the_parents_rows(name):
    """CPU reference path: attention of a q slice against a k/v slice with the restricted mask equals
    float64 attention on the slices with the parent's dense block."""
    torch = pytest.importorskip("torch")
    from maskc.runtime.reference import reference_attention
    rng = np.random.default_rng(3)
    bound = random_bound(name, rng, 30, 70)
    qr, kr = random_window(rng, bound.seq_len, bound.kv_len)
    sub = bound.restrict(qr, kr)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 2, bound.seq_len, 8, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 1, bound.kv_len, 8, generator=g, dtype=torch.float64) for _ in range(2))
    qs, ks, vs = q[:, :, qr[0]:qr[1]], k[:, :, kr[0]:kr[1]], v[:, :, kr[0]:kr[1]]
    out, lse = maskc.attention(qs, ks, vs, sub, return_lse=True, enable_gqa=True)
    want_out, want_lse = reference_attention(qs, ks, vs, sub, return_lse=True)
    np.testing.assert_allclose(out.numpy(), want_out, atol=1e-12)
    np.testing.assert_array_equal(np.isinf(lse.numpy()), np.isinf(want_lse))
    assert not sub.dense().any() or np.isfinite(lse.numpy()).any()
