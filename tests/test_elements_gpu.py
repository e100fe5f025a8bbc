"""The element path of PARTIAL tiles on the GPU (Options.partial_tiles="elements", maskc.codegen.elements): the
forward's outputs and LSE equal, within the dtype's tolerance, the tile path's ("bits") and a float32 reference
of the raster mask, in raster order and in token orders (tiles mapped from their first key, and key by key);
the backward's gradients on every dK/dV engine."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from gpu_support import TOL, load, randn, rel  # noqa: E402
from test_token_order_gpu import reference  # noqa: E402

# (example, bind parameters, seq_len, token orders): CLEAR at the benchmark's constants (8 x 16 and 16 x 8: tiles of
# whole patches; 8 x 1: keys mapped one by one), with a ragged last tile and a short last band; NATTEN on a prime
# width; a video's frames
CASES = [
    ("clear", {"text": 512, "width": 128, "radius": 16}, 8192, ("raster", "8x16", "16x8", "8x1")),
    ("clear", {"text": 64, "width": 64, "radius": 9}, 64 + 512 * 5 + 100, ("raster", "8x8", "4x16")),
    ("neighborhood", {"width": 61, "window": 7}, 61 * 45, ("raster", "8x1")),
    ("video", {"width": 16, "height": 16, "radius": 3, "past": 1}, 16 * 16 * 10 + 40, ("raster", "8x8", "4x8")),
]
IDS = [f"{c[0]}-{c[2]}" for c in CASES]


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_element_path_equals_the_tile_path_and_float32(name, params, S, orders, dtype):
    bound = load(name).bind(seq_len=S, **params)
    B, Hq, Hkv, D = 2, 4, 2, 128
    q, k, v = randn(B, Hq, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype)
    ref_o, ref_lse = reference(q, k, v, bound, 1 / math.sqrt(D))
    seen = torch.isfinite(ref_lse)
    for order in orders:
        outs = {}
        for partial in ("bits", "elements"):
            options = Options(token_order=order, partial_tiles=partial)
            o, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True, options=options)
            torch.cuda.synchronize()
            assert not torch.isnan(o).any(), f"{order} {partial}"
            assert rel(o.double(), ref_o.double()) <= TOL[dtype], f"{order} {partial}: O"
            assert torch.equal(torch.isfinite(lse), seen), f"{order} {partial}: rows without keys"
            assert rel(lse[seen].double(), ref_lse[seen].double()) <= TOL[dtype], f"{order} {partial}: LSE"
            outs[partial] = o
        assert rel(outs["elements"].double(), outs["bits"].double()) <= TOL[dtype], f"{order}: elements vs bits"


def test_element_path_reads_each_batch_elements_radius():
    """A batch of radii: each element's table (mask_data + mask_offsets[b]) reaches the pair test."""
    bound = load("clear").bind(seq_len=2724, text=64, width=64, radius=[9, 4])
    B, H, D = 2, 2, 128
    q, k, v = (randn(B, H, 2724, D, dtype="bf16") for _ in range(3))
    ref_o, _ = reference(q, k, v, bound, 1 / math.sqrt(D))
    for order in ("raster", "8x8"):
        o = maskc.attention(q, k, v, bound, options=Options(token_order=order, partial_tiles="elements"))
        assert rel(o.double(), ref_o.double()) <= TOL["bf16"], order


@pytest.mark.parametrize("engine", ["wgmma_tma", "wgmma", "mma"])
@pytest.mark.parametrize("name,params,S,orders", CASES, ids=IDS)
def test_element_path_gradients_against_float32(name, params, S, orders, engine):
    """The backward's visibility words from the element path (a warp's ballot per row and word), every dK/dV engine,
    default and deterministic: dQ, dK, dV against float32 and against the tile path's."""
    from test_token_order_gpu import reference_grads
    bound = load(name).bind(seq_len=S, **params)
    B, Hq, Hkv, D = 1, 4, 2, 128
    q, k, v, dout = (randn(B, h, S, D, dtype="bf16") for h in (Hq, Hkv, Hkv, Hq))
    want = reference_grads(q, k, v, dout, bound, 1 / math.sqrt(D))
    for order in orders[:2]:
        for deterministic in (False, True):
            got = {}
            for partial in ("bits", "elements"):
                options = Options(token_order=order, partial_tiles=partial, backward_engine=engine)
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                out = maskc.attention(qg, kg, vg, bound, enable_gqa=True, deterministic=deterministic,
                                      options=options)
                got[partial] = torch.autograd.grad(out, (qg, kg, vg), dout)
                for which, g, w in zip("qkv", got[partial], want):
                    assert not torch.isnan(g).any()
                    assert rel(g.double(), w.double()) <= 3e-2, f"{order} {partial} d{which} ({deterministic})"
            for which, a, b in zip("qkv", got["elements"], got["bits"]):
                assert rel(a.double(), b.double()) <= 3e-2, f"{order} d{which}: elements vs bits"
