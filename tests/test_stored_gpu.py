"""The stored path of PARTIAL tiles on the GPU (Options.partial_tiles="stored": ForwardPlan.stored and the wgmma_tma
dK/dV kernel's): the words its builders write equal those of the dense mask, bit for bit, in the layouts the
kernels read; the forward's outputs and LSE, and the gradients, equal a float32 reference of the raster mask and
the tile path's ("bits"), in raster order and in token orders, with a ragged last tile, batches of parameters and
GQA."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from maskc.codegen.plan import STORED_WORDS  # noqa: E402
from gpu_support import TOL, load, randn, rel  # noqa: E402
from test_token_order_gpu import reference, reference_grads  # noqa: E402

CASES = [
    ("clear", {"text": 512, "width": 128, "radius": 16}, 8192, ("raster", "8x16")),
    ("clear", {"text": 64, "width": 64, "radius": [9, 4]}, 64 + 512 * 5 + 100, ("raster", "8x8")),
    ("neighborhood", {"width": 61, "window": 7}, 61 * 45, ("raster", "8x1")),
    ("video", {"width": 16, "height": 16, "radius": 3, "past": 1}, 16 * 16 * 10 + 40, ("raster", "8x8")),
    # one token a frame row: every key its own chunk. The builder's four 32-bit mask_bits calls per row came out
    # of ptxas (CUDA 13.0, -O1 and up) wrong for keys 96..127 of this binding (bench/NOTES.md, session 19)
    ("video", {"width": 1, "height": 6, "radius": [0, 1], "past": [2, 1]}, 127, ("raster",)),
]
IDS = [f"{c[0]}-{c[2]}" for c in CASES]


def expected_words(bound, block_m: int, block_n: int) -> np.ndarray:
    """uint32[n_partial, block_m, STORED_WORDS] from the dense mask: PARTIAL tile n (maskc.runs.partial_slots), row
    rr (clamped to the last query), word t, bit 2 nt + e = column 8 nt + 2 t + e; keys past kv_len cleared."""
    desc = bound.descriptor(block_m, block_n)
    _, tiles = desc.partial_slots
    q_blocks = desc.n_q_blocks
    out = np.zeros((len(tiles), block_m, STORED_WORDS), np.uint32)
    dense = {}
    for n, (r, kv) in enumerate(tiles.tolist()):
        b = r // q_blocks
        if b not in dense:
            dense[b] = bound.dense(b)
        rows = np.minimum((r % q_blocks) * block_m + np.arange(block_m), bound.seq_len - 1)
        keys = kv * block_n + np.arange(block_n)
        vis = np.zeros((block_m, block_n), bool)
        inside = keys < bound.kv_len
        vis[:, inside] = dense[b][np.ix_(rows, keys[inside])]
        c = np.arange(block_n)
        for t in range(STORED_WORDS):
            cols = c[(c % 8) // 2 == t]
            shifts = (2 * (cols // 8) + cols % 2).astype(np.uint32)
            out[n, :, t] = (vis[:, cols].astype(np.uint32) << shifts).sum(axis=1, dtype=np.uint64).astype(np.uint32)
    return out


def expected_column_words(bound, block_m: int, block_n: int) -> np.ndarray:
    """uint32[n_partial, block_m, block_n / 32] from the dense mask for the column view's PARTIAL tiles
    (Descriptor.col_partial_slots): row rr of query block qb, bit j of word w = key k0 + 32 w + j; rows past
    seq_len and keys past kv_len cleared (the dK/dV kernel's tile_visibility)."""
    desc = bound.descriptor(block_m, block_n)
    _, tiles = desc.col_partial_slots
    kv_blocks = desc.n_kv_blocks
    out = np.zeros((len(tiles), block_m, block_n // 32), np.uint32)
    for n, (column, qb) in enumerate(tiles.tolist()):
        dense = bound.dense(column // kv_blocks)
        rows = qb * block_m + np.arange(block_m)
        keys = (column % kv_blocks) * block_n + np.arange(block_n)
        vis = np.zeros((block_m, block_n), bool)
        vis[np.ix_(rows < bound.seq_len, keys < bound.kv_len)] = dense[np.ix_(rows[rows < bound.seq_len],
                                                                              keys[keys < bound.kv_len])]
        bits = vis.reshape(block_m, block_n // 32, 32).astype(np.uint64) << np.arange(32, dtype=np.uint64)
        out[n] = bits.sum(axis=2).astype(np.uint32)
    return out


def _built_words(bound, transposed: bool = False):
    """(block_m, block_n, words) the runtime built for ``bound`` (kept in its state) for a view."""
    from maskc.runtime.state import state_for
    found = {key: value for key, value in state_for(bound).items()
             if key[0] == "tile_words" and key[4] == transposed}
    assert len(found) == 1, found.keys()
    (key, stored), = found.items()
    return key[1], key[2], stored.words.get()


@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_builder_words_equal_the_dense_mask(name, params, S, orders):
    for order in orders:
        bound = load(name).bind(seq_len=S, **params)
        options = Options(token_order=order, partial_tiles="stored")
        q = randn(bound.batch, 2, S, 128, dtype="bf16")
        maskc.attention(q, q, q, bound, options=options)
        torch.cuda.synchronize()
        ordered = maskc.ordered.token_order(bound, order)      # None in raster order
        target = ordered.inner if ordered is not None else bound
        block_m, block_n, words = _built_words(target)
        want = expected_words(target, block_m, block_n)
        assert want.shape[0] > 0, "the case has PARTIAL tiles"
        np.testing.assert_array_equal(words.reshape(want.shape), want, err_msg=order)


@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_backward_builder_words_equal_the_dense_mask(name, params, S, orders):
    for order in orders:
        bound = load(name).bind(seq_len=S, **params)
        options = Options(token_order=order, partial_tiles="stored", backward_engine="wgmma_tma")
        q = randn(bound.batch, 2, S, 128, dtype="bf16").requires_grad_()
        torch.autograd.grad(maskc.attention(q, q, q, bound, options=options).sum(), q)
        torch.cuda.synchronize()
        ordered = maskc.ordered.token_order(bound, order)
        target = ordered.inner if ordered is not None else bound
        block_m, block_n, words = _built_words(target, transposed=True)
        want = expected_column_words(target, block_m, block_n)
        assert want.shape[0] > 0, "the case has PARTIAL tiles"
        np.testing.assert_array_equal(words.reshape(want.shape), want, err_msg=order)


@pytest.mark.parametrize("deterministic", [False, True])
@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_stored_gradients_equal_float32(name, params, S, orders, deterministic):
    bound = load(name).bind(seq_len=S, **params)
    B, Hq, Hkv, D = 2, 4, 2, 128
    q, k, v, dout = (randn(B, h, S, D, dtype="bf16") for h in (Hq, Hkv, Hkv, Hq))
    want = reference_grads(q, k, v, dout, bound, 1 / math.sqrt(D))
    for order in orders:
        got = {}
        for partial in ("bits", "stored"):
            options = Options(token_order=order, partial_tiles=partial, backward_engine="wgmma_tma")
            o, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True, options=options)
            got[partial] = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=deterministic,
                                                    options=options)
            for grad, a, ref in zip("qkv", got[partial], want):
                assert not torch.isnan(a).any(), f"{order} {partial} d{grad}"
                assert rel(a.double(), ref.double()) <= 3e-2, f"{order} {partial}: d{grad}"
        for grad, a, b in zip("qkv", got["stored"], got["bits"]):
            assert rel(a.double(), b.double()) <= TOL["bf16"], f"{order}: d{grad} stored vs bits"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_stored_path_equals_the_tile_path_and_float32(name, params, S, orders, dtype):
    bound = load(name).bind(seq_len=S, **params)
    B, Hq, Hkv, D = 2, 4, 2, 128
    q, k, v = randn(B, Hq, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype)
    ref_o, ref_lse = reference(q, k, v, bound, 1 / math.sqrt(D))
    seen = torch.isfinite(ref_lse)
    for order in orders:
        outs = {}
        for partial in ("bits", "stored"):
            options = Options(token_order=order, partial_tiles=partial)
            o, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True, options=options)
            torch.cuda.synchronize()
            assert not torch.isnan(o).any(), f"{order} {partial}"
            assert rel(o.double(), ref_o.double()) <= TOL[dtype], f"{order} {partial}: O"
            assert torch.equal(torch.isfinite(lse), seen), f"{order} {partial}: rows without keys"
            assert rel(lse[seen].double(), ref_lse[seen].double()) <= TOL[dtype], f"{order} {partial}: LSE"
            outs[partial] = o
        assert rel(outs["stored"].double(), outs["bits"].double()) <= TOL[dtype], f"{order}: stored vs bits"


def test_stored_path_at_head_dims_64_and_256():
    bound = load("clear").bind(seq_len=4096 + 77, text=256, width=64, radius=9)
    for D in (64, 256):
        q, k, v = (randn(1, 2, bound.seq_len, D, dtype="bf16") for _ in range(3))
        ref_o, _ = reference(q, k, v, bound, 1 / math.sqrt(D))
        o = maskc.attention(q, k, v, bound, options=Options(token_order="raster", partial_tiles="stored"))
        assert rel(o.double(), ref_o.double()) <= TOL["bf16"], D


def test_a_launch_on_another_stream_waits_for_the_builder():
    """The builder runs on the first call's stream, with no wait on the host; a call on another stream right after
    (a new binding, nothing synchronized) still reads finished words."""
    bound = load("clear").bind(seq_len=8192, text=512, width=128, radius=16)
    q = randn(1, 4, 8192, 128, dtype="bf16")
    options = Options(token_order="raster", partial_tiles="stored")
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    first.wait_stream(torch.cuda.current_stream())
    second.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(first):
        torch.cuda._sleep(50_000_000)          # the builder queues behind a long wait on this stream
        maskc.attention(q, q, q, bound, options=options)
    with torch.cuda.stream(second):
        o = maskc.attention(q, q, q, bound, options=options)
    torch.cuda.synchronize()
    ref, _ = reference(q, q, q, bound, 1 / math.sqrt(128))
    assert rel(o.double(), ref.double()) <= TOL["bf16"]
