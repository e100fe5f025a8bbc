"""The backward kernels on the GPU, through autograd (maskc.attention on torch tensors), against float64
autograd of a dense masked softmax attention on the same inputs, for every example mask, on each dK/dV
engine.

Every case: fresh random inputs and output gradient, gradient buffers poisoned with NaN first, GQA (dK/dV
summed over the group), ‖grad − ref‖ / ‖ref‖ per gradient; both backward modes, and the deterministic one
bitwise repeatable. Also against FlexAttention's backward, under torch.compile, and at 32K.
"""
from __future__ import annotations

import math
import threading

import pytest

from conftest import EXAMPLE_NAMES, gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("needs an NVIDIA GPU with CuPy and torch", allow_module_level=True)

import torch  # noqa: E402

import maskc  # noqa: E402
from maskc.kernel_ir import BACKWARD_ENGINES, DQ_REDUCTIONS  # noqa: E402
from gpu_support import EX, bind, load, modify_all, poison, randn, rel, visibility  # noqa: E402

# bf16/fp16 operands of P and dS: gradients land a little above the forward's error
GRAD_TOL = {"bf16": 2e-2, "fp16": 1e-2}


@pytest.fixture(autouse=True, params=BACKWARD_ENGINES)
def backward_engine(request, monkeypatch):
    """Every test runs on each dK/dV engine (MASKC_BWD_ENGINE; the runtime keys its plans by it)."""
    monkeypatch.setenv("MASKC_BWD_ENGINE", request.param)
    return request.param


def reference_grads(q, k, v, dout, bound, scale, dlse=None, dtype=torch.float64, with_out=False):
    """float64 (dq, dk, dv) (or ``dtype``'s; O first when ``with_out``) by autograd of softmax attention with the
    dense mask and the example's score modifier (gpu_support.modify_all). Hidden scores are set to -1e30 and P
    multiplied by the mask, so rows without a visible key give O = 0 and zero gradients."""
    qd, kd, vd = (x.detach().to(dtype).requires_grad_() for x in (q, k, v))
    B, Hq = q.shape[:2]
    group = Hq // k.shape[1]
    vis = visibility(bound, B, Hq)
    kx, vx = kd.repeat_interleave(group, 1), vd.repeat_interleave(group, 1)
    s = modify_all(qd @ kx.transpose(-1, -2) * scale, bound).masked_fill(~vis, -1e30)
    p = torch.softmax(s, -1) * vis
    out = p @ vx
    loss = (out * dout.to(dtype)).sum()
    if dlse is not None:
        seen = vis.any(-1)
        lse = torch.logsumexp(s, -1)
        loss = loss + torch.where(seen, lse * dlse.to(dtype), 0).sum()
    grads = torch.autograd.grad(loss, (qd, kd, vd))
    return (out.detach(), *grads) if with_out else grads


def run(bound, B, Hq, Hkv, D, dtype, deterministic=False, with_lse=False):
    S, Skv = bound.seq_len, bound.kv_len
    q = randn(B, Hq, S, D, dtype=dtype).requires_grad_()
    k = randn(B, Hkv, Skv, D, dtype=dtype).requires_grad_()
    v = randn(B, Hkv, Skv, D, dtype=dtype).requires_grad_()
    dout = randn(B, Hq, S, D, dtype=dtype)
    dlse = torch.randn(B, Hq, S, device="cuda") if with_lse else None
    out, lse = maskc.attention(q, k, v, bound, return_lse=True, deterministic=deterministic, enable_gqa=Hq != Hkv)
    poison((B, Hq, S, D), dtype)
    poison((B, Hkv, Skv, D), dtype)
    loss = (out * dout).sum() + ((torch.where(torch.isinf(lse), 0, lse) * dlse).sum() if with_lse else 0)
    grads = torch.autograd.grad(loss, (q, k, v))
    torch.cuda.synchronize()
    return (q, k, v, dout, dlse), grads


def check(bound, B, Hq, Hkv, D, dtype, deterministic=False, with_lse=False):
    (q, k, v, dout, dlse), grads = run(bound, B, Hq, Hkv, D, dtype, deterministic, with_lse)
    refs = reference_grads(q, k, v, dout, bound, 1 / math.sqrt(D), dlse)
    for name, got, ref in zip(("dq", "dk", "dv"), grads, refs):
        assert got.shape == ref.shape and got.dtype == q.dtype
        assert not torch.isnan(got).any(), f"NaN in {name} (unwritten or -inf arithmetic)"
        # A gradient can vanish by cancellation (one query seeing one key: dS = dO.v - dO.o = 0), where its
        # computed value is rounding noise: measure it against dV's size, the natural scale, then.
        scale = torch.linalg.vector_norm(ref) if ref.abs().max() > 0 else torch.linalg.vector_norm(refs[2])
        err = (torch.linalg.vector_norm(got.double() - ref) / scale.clamp_min(1e-30)).item()
        if scale == 0:
            assert (got == 0).all(), f"{name} must be 0 where no query sees a key"
        else:
            assert err <= GRAD_TOL[dtype], f"{name} rel err {err:.2e}"
    return grads


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S", [1, 127, 1000])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_gradients(name, S, D, dtype):
    """Every example: GQA 4/2, batch 2 with different parameters per element, both modes."""
    bound = bind(name, S, seed=S + D + 1, batch=2 if load(name).params else None)
    check(bound, B=2, Hq=4, Hkv=2, D=D, dtype=dtype, deterministic=(S + D) % 2 == 0)


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("S", [127, 1000, 4097])
@pytest.mark.parametrize("name", ["alibi", "softcap"])
def test_score_modifier_against_float32(name, S, D, dtype):
    """The score-modifier examples (scores changed on every visible pair, the gradient through mod'): O and
    dQ, dK, dV against a float32 reference (eager torch, the modifier from its definition), GQA 4/2."""
    bound = bind(name, S, seed=S + D, heads=4)
    (q, k, v, dout, _), grads = run(bound, 1, 4, 2, D, dtype)
    out = maskc.attention(q, k, v, bound, enable_gqa=True)
    ref = reference_grads(q, k, v, dout, bound, 1 / math.sqrt(D), dtype=torch.float32, with_out=True)
    assert rel(out.double(), ref[0].double()) <= 1e-2, "O vs the float32 reference"
    for what, got, want in zip(("dq", "dk", "dv"), grads, ref[1:]):
        assert not torch.isnan(got).any(), what
        assert rel(got.double(), want.double()) <= GRAD_TOL[dtype], f"{what} vs the float32 reference"


@pytest.mark.parametrize("S", [127, 1000])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_head_dim_256_gradients(name, S, backward_engine):
    """Head dim 256 (wgmma_tma alone: its two warpgroups share 64 keys and split the head dim, P^T and dS^T
    through shared memory, dQ added by vector reductions): every example, GQA 4/2, batch 2, both modes; fp16
    for half of the examples."""
    if backward_engine != "wgmma_tma":
        pytest.skip("head dim 256: the wgmma_tma kernel only")
    dtype = "fp16" if EXAMPLE_NAMES.index(name) % 2 else "bf16"
    bound = bind(name, S, seed=S + 256, batch=2 if load(name).params else None)
    check(bound, B=2, Hq=4, Hkv=2, D=256, dtype=dtype, deterministic=S == 1000)


@pytest.mark.parametrize("name", ["causal", "document", "hstu", "clear", "softcap"])
def test_head_dim_256_gradients_4097(name, backward_engine):
    """Many steps per key block, ragged last blocks, the causal diagonal; gradients of the LSE too."""
    if backward_engine != "wgmma_tma":
        pytest.skip("head dim 256: the wgmma_tma kernel only")
    check(bind(name, 4097, seed=7, heads=2), B=1, Hq=2, Hkv=1, D=256, dtype="bf16", with_lse=True)


@pytest.mark.parametrize("reduction", DQ_REDUCTIONS)
@pytest.mark.parametrize("D", [64, 128])
@pytest.mark.parametrize("name", ["causal", "document", "hstu", "clear"])
def test_dq_reductions(name, D, reduction, backward_engine, monkeypatch):
    """Each way the wgmma kernel adds dQ to the fp32 buffer (MASKC_BWD_DQ_REDUCTION), ragged rows included."""
    if backward_engine != "wgmma":
        pytest.skip("the mma kernel has one reduction")
    monkeypatch.setenv("MASKC_BWD_DQ_REDUCTION", reduction)
    check(bind(name, 1000, seed=D, batch=2 if load(name).params else None), B=2, Hq=4, Hkv=2, D=D, dtype="bf16")


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_example_gradients_4097(name):
    check(bind(name, 4097, seed=5, heads=2), B=1, Hq=2, Hkv=1, D=128, dtype="bf16")


@pytest.mark.parametrize("name", ["document", "hstu", "clear", "shared_prompt"])
def test_lse_gradient_flows(name):
    check(bind(name, 700, seed=11), B=1, Hq=2, Hkv=2, D=64, dtype="bf16", with_lse=True)


@pytest.mark.parametrize("name,S,H", [("causal", 2000, 4), ("document", 2000, 4), ("clear", 2000, 4),
                                      ("causal", 8192, 16), ("hstu", 8192, 16)])
def test_deterministic_is_bitwise_repeatable(name, S, H):
    """Bitwise equal gradients call after call (on wgmma_tma the CTAs add dQ in turns: at 8K x 16 heads, some
    thousand CTAs in several waves race for the same rows), and within bf16 tolerance of the fast mode."""
    bound = bind(name, S, seed=3)
    q, k, v, dout = (randn(1, H, S, 128, dtype="bf16") for _ in range(4))
    first = maskc.attention_backward(dout, q, k, v, *maskc.attention(q, k, v, bound, return_lse=True), bound,
                                     deterministic=True)
    for _ in range(2):
        again = maskc.attention_backward(dout, q, k, v, *maskc.attention(q, k, v, bound, return_lse=True), bound,
                                         deterministic=True)
        for a, b in zip(first, again):
            assert torch.equal(a, b)
    fast = maskc.attention_backward(dout, q, k, v, *maskc.attention(q, k, v, bound, return_lse=True), bound)
    for a, b in zip(first, fast):
        assert rel(a.double(), b.double()) <= 1e-2


@pytest.mark.parametrize("variant", [{"dq_turn_order": "wave"}, {"deterministic_dq": "kernel"}], ids=str)
@pytest.mark.parametrize("name,S", [("causal", 4096), ("hstu", 8192), ("document", 2000), ("clear", 8192)])
def test_deterministic_variants_are_bitwise_repeatable(name, S, variant, backward_engine):
    """The deterministic mode's other ways on wgmma_tma: Options(dq_turn_order="wave"), the launch order whose
    first wave goes shortest first and the rest longest first (the turns follow it: no deadlock, whatever stays
    resident), and Options(deterministic_dq="kernel"), dQ by its own kernel instead of in turns: bitwise equal call
    after call, and within bf16 tolerance of the fast mode."""
    if backward_engine != "wgmma_tma":
        pytest.skip("dQ in turns or by its own kernel: a choice of the wgmma_tma kernel only")
    bound = bind(name, S, seed=9)
    q, k, v, dout = (randn(1, 16, S, 128, dtype="bf16") for _ in range(4))
    o, lse = maskc.attention(q, k, v, bound, return_lse=True)
    options = maskc.Options(**variant)
    first = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True, options=options)
    again = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True, options=options)
    fast = maskc.attention_backward(dout, q, k, v, o, lse, bound)
    for a, b, c in zip(first, again, fast):
        assert torch.equal(a, b) and rel(a.double(), c.double()) <= 1e-2


def test_deterministic_sections_change_no_bit(monkeypatch, backward_engine):
    """The benchmark's CLEAR at 16K, 16 heads: its deterministic turns launch in wider sections than the L2's (4 heads
    against 2: Descriptor.turn_sections, the chains of its text rows); the turns, and so dQ, dK and dV, are bit for
    bit those of the L2's sections."""
    if backward_engine != "wgmma_tma":
        pytest.skip("dQ in turns: the wgmma_tma kernel only")
    from maskc.kernel_ir import Descriptor
    from maskc.ordered import token_order
    from maskc.runtime import kernels
    from maskc.runtime.state import sm_count
    S, params = 16384, {"text": 512, "width": 128, "radius": 16}
    q, k, v, dout = (randn(1, 16, S, 128, dtype="bf16") for _ in range(4))
    bound = load("clear").bind(seq_len=S, **params)
    l2 = kernels._l2_section_heads(16, S * (128 * (2 + 2 + 4) + 8), 0)       # as the runtime asks the L2
    assert token_order(bound).inner.descriptor(64, 128).turn_sections(16, l2, sm_count(0)) > l2
    o, lse = maskc.attention(q, k, v, bound, return_lse=True)
    wider = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True)
    monkeypatch.setattr(Descriptor, "turn_sections", lambda self, pairs, section_pairs, sms, group=1: section_pairs)
    # other options (sync: nothing in the kernels), so another plan, made with the L2's sections (a new binding of
    # the same parameters would share the ordered mask's plans)
    in_l2_sections = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True,
                                              options=maskc.Options.from_environment().replace(sync=True))
    for a, b in zip(wider, in_l2_sections):
        assert torch.equal(a, b)


@pytest.mark.parametrize("deterministic", [False, True])
def test_dq_buffers_need_no_zeroed_memory(deterministic):
    """The prep kernel zeroes the fp32 dQ buffer and the dQ turn counters (the runtime allocates them
    uninitialised): blocks of their sizes filled with garbage and freed just before each call (the caching
    allocator hands them over), and a second call on the first's memory, both give the reference gradients."""
    B, H, S, D = 2, 3, 1000, 128
    bound = bind("document", S, seed=6)
    q, k, v, dout = (randn(B, H, S, D, dtype="bf16") for _ in range(4))
    o, lse = maskc.attention(q, k, v, bound, return_lse=True)
    refs = reference_grads(q, k, v, dout, bound, 1 / math.sqrt(D))
    padded = -(-S // 64) * 64
    for _ in range(2):
        torch.full((B, H, padded, D), float("nan"), device="cuda")          # freed at once
        torch.full((B, H, padded // 64), 12345, dtype=torch.int32, device="cuda")
        grads = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=deterministic)
        for got, ref in zip(grads, refs):
            assert rel(got.double(), ref) <= GRAD_TOL["bf16"]


def test_backward_from_a_thread_new_to_cuda():
    """torch's autograd engine runs a backward in a thread of its own, where CUDA's runtime may not have been used
    yet, so that no context is current for the driver API's launches: the runtime makes the device's current
    (run 70 found CUDA_ERROR_INVALID_CONTEXT there once the backward no longer zeroed a buffer through torch)."""
    bound = bind("causal", 1000, seed=8)
    q, k, v, dout = (randn(1, 2, 1000, 128, dtype="bf16") for _ in range(4))
    o, lse = maskc.attention(q, k, v, bound, return_lse=True)
    here = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True)
    found = {}

    def backward():
        try:
            found["grads"] = maskc.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True)
            torch.cuda.synchronize()
        except Exception as exc:   # noqa: BLE001 - reported by the assertion below
            found["error"] = exc

    worker = threading.Thread(target=backward)
    worker.start()
    worker.join()
    assert "error" not in found, repr(found.get("error"))
    for a, b in zip(found["grads"], here):
        assert torch.equal(a, b)


@pytest.mark.parametrize("name", ["causal", "document", "hstu", "clear", "alibi", "softcap"])
def test_against_flex_backward(name):
    from torch.nn.attention.flex_attention import flex_attention

    bound = bind(name, 1000, seed=2, heads=2)
    q, k, v = (randn(1, 2, 1000, 128, dtype="bf16").requires_grad_() for _ in range(3))
    dout = randn(1, 2, 1000, 128, dtype="bf16")
    ours = torch.autograd.grad(maskc.attention(q, k, v, bound), (q, k, v), dout)
    flex_out = flex_attention(q, k, v, block_mask=bound.to_flex_block_mask(device="cuda"),
                              score_mod=bound.flex_score_mod("cuda"))
    theirs = torch.autograd.grad(flex_out, (q, k, v), dout)
    for a, b in zip(ours, theirs):
        assert rel(a.double(), b.double()) <= 3e-2


def test_torch_compile_fullgraph_backward():
    """A model calling maskc.attention compiles without graph breaks; a new bound mask (new document
    lengths) through the same compiled function still gives its own, right gradients."""
    mask = maskc.load(EX / "document.mask")

    def step(q, k, v, bound):
        return (maskc.attention(q, k, v, bound) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True)
    for docs in ([300, 700], [100, 200, 700], [1000]):
        bound = mask.bind(seq_len=1000, docs=docs)
        q, k, v = (randn(1, 2, 1000, 64, dtype="bf16").requires_grad_() for _ in range(3))
        got = torch.autograd.grad(compiled(q, k, v, bound), (q, k, v))
        want = torch.autograd.grad(step(q, k, v, bound), (q, k, v))
        for a, b in zip(got, want):
            assert rel(a.double(), b.double()) <= 1e-2


@pytest.mark.parametrize("name,params", [("causal", {}), ("document", {"docs": [2731] * 11 + [32768 - 2731 * 11]})])
def test_32k_against_flex_backward(name, params):
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.cache_size_limit = 1000
    bound = load(name).bind(seq_len=32768, **params)
    q, k, v = (randn(1, 2, 32768, 128, dtype="bf16").requires_grad_() for _ in range(3))
    dout = randn(1, 2, 32768, 128, dtype="bf16")
    ours = torch.autograd.grad(maskc.attention(q, k, v, bound), (q, k, v), dout)
    flex = torch.compile(flex_attention)
    theirs = torch.autograd.grad(flex(q, k, v, block_mask=bound.to_flex_block_mask(device="cuda")), (q, k, v), dout)
    for a, b in zip(ours, theirs):
        assert not torch.isnan(a).any()
        assert rel(a.double(), b.double()) <= 3e-2


def test_unsupported_head_dim_is_a_clear_error(backward_engine):
    """Head dim 256's backward is wgmma_tma's alone: the other engines say so."""
    if backward_engine == "wgmma_tma":
        pytest.skip("runs head dim 256 (test_head_dim_256_gradients)")
    bound = bind("causal", 128)
    q = randn(1, 1, 128, 256, dtype="bf16").requires_grad_()
    out = maskc.attention(q, q, q, bound)
    with pytest.raises(ValueError, match="head dim 256"):
        out.sum().backward()


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_portable_build_runs_here(name, backward_engine, monkeypatch):
    """The build for Ampere and newer (compute_80 PTX of the mma.sync kernels, no Hopper instruction), compiled
    by the driver for this GPU: forward and both backward modes against float64."""
    if backward_engine != "mma":
        pytest.skip("the portable build's backward is the mma kernel")
    monkeypatch.setenv("MASKC_ARCH", "compute_80")
    bound = bind(name, 1000, seed=11, batch=2 if load(name).params else None)
    check(bound, B=2, Hq=4, Hkv=2, D=128, dtype="bf16", deterministic=False)
    check(bound, B=2, Hq=4, Hkv=2, D=64, dtype="fp16", deterministic=True)
