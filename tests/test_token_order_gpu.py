"""Token orders on the GPU (issue 15 item 2): the kernels of masks rewritten in patch order, with q, k, v gathered
into it and the results back, against a float32 reference of the original (raster) mask: outputs, LSE and
gradients, forward and backward engines, GQA, batches, pre-ordered inputs, CuPy inputs."""
from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

import torch  # noqa: E402

import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from maskc.ordered import token_order  # noqa: E402
from gpu_support import TOL, load, randn, rel  # noqa: E402

# (example, bind parameters, seq_len, patch shapes to run): images with a text prefix and a last band the
# sequence does not fill, NATTEN on a prime width (bands column by column), frames of a video
CASES = [
    ("clear", {"text": 64, "width": 64, "radius": 9}, 64 + 512 * 5 + 100, ("8x8", "4x16", "16x4", "8x1")),
    ("clear", {"text": 512, "width": 128, "radius": 16}, 8192, ("8x16", "auto")),
    ("neighborhood", {"width": 61, "window": 7}, 61 * 45, ("8x1", "4x1", "auto")),
    ("video", {"width": 16, "height": 16, "radius": 3, "past": 1}, 16 * 16 * 10 + 40, ("8x8", "4x8")),
]
IDS = [f"{c[0]}-{c[2]}" for c in CASES]


def reference(q, k, v, bound, scale):
    """float32 O and LSE of the original (raster) mask, head by head, from its dense form."""
    B, Hq, S, D = q.shape
    group = Hq // k.shape[1]
    out = torch.empty(B, Hq, S, D, dtype=torch.float32, device="cuda")
    lse = torch.empty(B, Hq, S, dtype=torch.float32, device="cuda")
    for b in range(B):
        vis = torch.as_tensor(bound.dense(b if bound.batch > 1 else 0), device="cuda")
        for h in range(Hq):
            s = (q[b, h].float() @ k[b, h // group].float().T) * scale
            s = s.masked_fill(~vis, -math.inf)
            lse[b, h] = torch.logsumexp(s, -1)
            out[b, h] = torch.softmax(s, -1).nan_to_num(0.0) @ v[b, h // group].float()
    return out, lse


def reference_grads(q, k, v, dout, bound, scale):
    qf, kf, vf = (x.detach().float().requires_grad_() for x in (q, k, v))
    out, _ = _autograd_reference(qf, kf, vf, bound, scale)
    return torch.autograd.grad(out, (qf, kf, vf), dout.float())


def _autograd_reference(q, k, v, bound, scale):
    B, Hq, S, D = q.shape
    group = Hq // k.shape[1]
    vis = torch.stack([torch.as_tensor(bound.dense(b if bound.batch > 1 else 0), device="cuda") for b in range(B)])
    kx, vx = k.repeat_interleave(group, 1), v.repeat_interleave(group, 1)
    s = (q @ kx.transpose(-1, -2)) * scale
    s = s.masked_fill(~vis[:, None], -math.inf)
    return torch.softmax(s, -1).nan_to_num(0.0) @ vx, None


def _bound(name, params, S):
    return load(name).bind(seq_len=S, **params)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("name,params,S,shapes", CASES, ids=IDS)
def test_forward_in_order_against_float32(name, params, S, shapes, dtype):
    bound = _bound(name, params, S)
    B, Hq, Hkv, D = 2, 4, 2, 128
    q, k, v = randn(B, Hq, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype)
    scale = 1 / math.sqrt(D)
    ref_o, ref_lse = reference(q, k, v, bound, scale)
    raster, _ = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True,
                                options=Options(token_order="raster"))
    for shape in shapes:
        if shape == "auto" and token_order(bound) is None:
            continue
        o, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True, options=Options(token_order=shape))
        torch.cuda.synchronize()
        assert not torch.isnan(o).any()
        assert rel(o.double(), ref_o.double()) <= TOL[dtype], f"{shape}: O"
        seen = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), seen), f"{shape}: rows without keys"
        assert rel(lse[seen].double(), ref_lse[seen].double()) <= TOL[dtype], f"{shape}: LSE"
        assert rel(o.double(), raster.double()) <= TOL[dtype], f"{shape}: against the raster kernel"


@pytest.mark.parametrize("engine", ["wgmma_tma", "wgmma", "mma"])
@pytest.mark.parametrize("name,params,S,shapes", CASES, ids=IDS)
def test_gradients_in_order_against_float32(name, params, S, shapes, engine):
    bound = _bound(name, params, S)
    B, Hq, Hkv, D = 1, 4, 2, 128
    dtype = "bf16"
    q, k, v, dout = (randn(B, h, S, D, dtype=dtype) for h in (Hq, Hkv, Hkv, Hq))
    scale = 1 / math.sqrt(D)
    want = reference_grads(q, k, v, dout, bound, scale)
    for shape in shapes[:2]:
        if shape == "auto" and token_order(bound) is None:
            continue
        options = Options(token_order=shape, backward_engine=engine)
        for deterministic in (False, True):
            qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
            out = maskc.attention(qg, kg, vg, bound, enable_gqa=True, deterministic=deterministic, options=options)
            got = torch.autograd.grad(out, (qg, kg, vg), dout)
            for name_g, g, w in zip("qkv", got, want):
                assert not torch.isnan(g).any()
                assert rel(g.double(), w.double()) <= 3e-2, f"{shape} {engine} d{name_g} (deterministic={deterministic})"


def test_batch_of_radii_and_preordered_inputs():
    """A batch with a radius per element in one order; inputs already in the order (the model keeps them so)
    run on the rewritten mask directly and give the same output, permuted."""
    bound = load("clear").bind(seq_len=2724, text=64, width=64, radius=[9, 4])
    ordered = token_order(bound, "8x8")
    q, k, v = (randn(2, 2, 2724, 64, dtype="bf16") for _ in range(3))
    o = maskc.attention(q, k, v, bound, options=Options(token_order="8x8"))
    ref, _ = reference(q, k, v, bound, 1 / 8)
    assert rel(o.double(), ref.double()) <= TOL["bf16"]
    p = torch.from_numpy(ordered.permutation).cuda()
    o_p = maskc.attention(q[:, :, p], k[:, :, p], v[:, :, p], ordered.inner)
    assert torch.equal(o_p, o[:, :, p])


def test_cupy_inputs_in_order():
    """CuPy arrays (maskc.runtime.attention) take the same order and come back as CuPy arrays, raster order."""
    import cupy

    from maskc.runtime import attention as runtime_attention
    S = 61 * 45
    bound = load("neighborhood").bind(seq_len=S, width=61, window=7)
    q, k, v = (cupy.random.standard_normal((1, 2, S, 64), dtype=cupy.float32).astype(cupy.float16) for _ in range(3))
    o, lse = runtime_attention(q, k, v, bound, return_lse=True, options=Options(token_order="8x1"))
    assert isinstance(o, cupy.ndarray) and o.dtype == cupy.float16 and isinstance(lse, cupy.ndarray)
    qt, kt, vt = (torch.as_tensor(x, device="cuda") for x in (q, k, v))
    ref, ref_lse = reference(qt, kt, vt, bound, 1 / 8)
    assert rel(torch.as_tensor(o, device="cuda").double(), ref.double()) <= TOL["fp16"]
    assert rel(torch.as_tensor(lse, device="cuda").double(), ref_lse.double()) <= TOL["fp16"]


def test_benchmark_shapes_at_32k():
    """The benchmark's CLEAR (its auto order) and NATTEN (8 x 1 bands: auto keeps its raster order) at 32K
    against the raster kernels."""
    for name, S, shape in (("clear", 32768, "auto"), ("neighborhood", 181 * 181, "8x1")):
        bound = load(name).bind(seq_len=S)
        assert token_order(bound, shape) is not None
        q, k, v = (randn(1, 16, S, 128, dtype="bf16") for _ in range(3))
        o = maskc.attention(q, k, v, bound, options=Options(token_order=shape))
        raster = maskc.attention(q, k, v, bound, options=Options(token_order="raster"))
        assert rel(o.double(), raster.double()) <= TOL["bf16"], name
        rows = np.random.default_rng(0).choice(S, 256, replace=False)
        dense = torch.as_tensor(bound.dense()[rows], device="cuda")
        rows_t = torch.as_tensor(rows, device="cuda")
        s = (q[0, :, rows_t].float() @ k[0].float().transpose(-1, -2)) / math.sqrt(128)
        ref = torch.softmax(s.masked_fill(~dense, -math.inf), -1) @ v[0].float()
        assert rel(o[0, :, rows_t].double(), ref.double()) <= TOL["bf16"], name
