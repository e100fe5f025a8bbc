"""The stored path of PARTIAL tiles on the GPU (Options.partial_tiles="stored", ForwardPlan.stored): the words its
builder writes equal those of the dense mask, bit for bit, in the layout the forward reads; the forward's outputs
and LSE equal a float32 reference of the raster mask and the tile path's ("bits"), in raster order and in token
orders, with a ragged last tile, batches of parameters and GQA."""
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
from test_token_order_gpu import reference  # noqa: E402

CASES = [
    ("clear", {"text": 512, "width": 128, "radius": 16}, 8192, ("raster", "8x16")),
    ("clear", {"text": 64, "width": 64, "radius": [9, 4]}, 64 + 512 * 5 + 100, ("raster", "8x8")),
    ("neighborhood", {"width": 61, "window": 7}, 61 * 45, ("raster", "8x1")),
    ("video", {"width": 16, "height": 16, "radius": 3, "past": 1}, 16 * 16 * 10 + 40, ("raster", "8x8")),
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


def _built_words(bound):
    """(block_m, block_n, words) the runtime built for ``bound`` (kept in its state) in a forward."""
    from maskc.runtime.state import state_for
    found = {key: value for key, value in state_for(bound).items() if key[0] == "tile_words"}
    assert len(found) == 1, found.keys()
    (key, (_, words)), = found.items()
    return key[1], key[2], words.get()


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
