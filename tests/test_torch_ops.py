"""maskc in PyTorch on the CPU reference path: the custom ops' autograd (gradcheck in float64 checks the
backward formulas the kernels implement), against autograd of an independent dense attention, the fake
implementations (opcheck), and torch.compile without graph breaks."""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import maskc  # noqa: E402
from maskc.runtime import torch_ops  # noqa: E402

from conftest import EXAMPLE_NAMES, EXAMPLES, batch_params, example_params, example_score_mod  # noqa: E402


def bound_of(name, S, seed=0, batch=None, kv_len=None, heads=4):
    """A mask that reads h is bound to ``heads`` query heads."""
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    rng = np.random.default_rng(seed)
    kw = {} if kv_len is None else {"kv_len": kv_len}     # cross_images and tree_verify bring their own
    if batch is None:
        return mask.bind(seq_len=S, **{**kw, **example_params(name, S, rng, heads)})
    return mask.bind(seq_len=S, **{**kw, **batch_params(mask, name, S, rng, batch, heads, **kw)})


def inputs(B, Hq, Hkv, S, Skv, D, seed, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=dtype).requires_grad_()  # noqa: E731
    return make(B, Hq, S, D), make(B, Hkv, Skv, D), make(B, Hkv, Skv, D)


def dense_attention(q, k, v, bound, scale):
    """Independent of maskc's ops: softmax attention written directly, mask from bound.dense, autograd
    differentiates it. Rows without a visible key give 0."""
    B, Hq = q.shape[:2]
    group = Hq // k.shape[1]
    vis = torch.stack([torch.stack([torch.from_numpy(bound.dense(b if bound.batch > 1 else 0,
                                                                 h if bound.num_heads else 0))
                                    for h in range(Hq)]) for b in range(B)])
    s = q @ k.repeat_interleave(group, 1).transpose(-1, -2) * scale
    mod = example_score_mod(bound.mask.name, dict(bound.params.batch[0].floats))
    if mod is not None:                 # the example's modifier, from its definition (batch element 0's values)
        rows, cols = (torch.arange(n, dtype=s.dtype).view(shape) for n, shape in ((s.shape[2], (-1, 1)), (s.shape[3], (1, -1))))
        s = torch.stack([mod(s[:, h], h, rows, cols) for h in range(Hq)], 1)
    p = torch.softmax(s.masked_fill(~vis, -1e30), -1) * vis
    return p @ v.repeat_interleave(group, 1)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_gradcheck(name):
    """Finite differences against the backward op (LSE's gradient included), GQA, jagged batch."""
    bound = bound_of(name, 23, seed=1, batch=2 if maskc.load(EXAMPLES / f"{name}.mask").params else None)
    q, k, v = inputs(2, 4, 2, 23, bound.kv_len, 8, seed=2)

    def f(q, k, v):
        out, lse = maskc.attention(q, k, v, bound, return_lse=True, enable_gqa=True)
        return out, torch.where(torch.isinf(lse), 0, lse)

    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-7, rtol=1e-5)


def test_gradient_of_lse_alone():
    """A loss that reads only LSE: the output's gradient is absent (None), not a zero tensor."""
    bound = bound_of("shared_prompt", 19, seed=3)
    q, k, v = inputs(1, 2, 2, 19, 19, 8, seed=4)

    def f(q, k, v):
        _, lse = maskc.attention(q, k, v, bound, return_lse=True)
        return torch.where(torch.isinf(lse), 0, lse)

    assert torch.autograd.gradcheck(f, (q, k, v), atol=1e-7, rtol=1e-5)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_gradients_match_dense_autograd(name):
    """Non-multiple lengths, cross attention where the mask allows it, an explicit scale."""
    try:
        bound = bound_of(name, 45, seed=4, kv_len=61, heads=2)
    except maskc.MaskError:
        bound = bound_of(name, 45, seed=4, heads=2)
    q, k, v = inputs(1, 2, 1, 45, bound.kv_len, 16, seed=5)
    dout = torch.randn(1, 2, 45, 16, dtype=torch.float64)
    ours = torch.autograd.grad(maskc.attention(q, k, v, bound, scale=0.3, enable_gqa=True), (q, k, v), dout)
    ref = torch.autograd.grad(dense_attention(q, k, v, bound, 0.3), (q, k, v), dout)
    for a, b in zip(ours, ref):
        assert torch.allclose(a, b, atol=1e-10, rtol=1e-8)


def test_forward_matches_numpy_reference_in_float32():
    bound = bound_of("hstu", 70, seed=6)
    q, k, v = inputs(1, 2, 2, 70, 70, 16, seed=7, dtype=torch.float32)
    out, lse = maskc.attention(q, k, v, bound, return_lse=True)
    ref_out, ref_lse = maskc.reference_attention(q, k, v, bound, return_lse=True)
    assert out.dtype == torch.float32 and lse.dtype == torch.float32
    assert np.allclose(out.detach().numpy(), ref_out, atol=1e-5)
    assert np.array_equal(np.isneginf(lse.detach().numpy()), np.isneginf(ref_lse))


@pytest.mark.parametrize("grad_off", ["no_grad", "inputs_without_grad"])
def test_inference_path_records_no_graph_and_matches(grad_off):
    """Without gradients to compute, attention skips autograd: same O and LSE, no grad_fn."""
    bound = bound_of("document", 50, seed=3)
    q, k, v = inputs(2, 4, 2, 50, 50, 16, seed=4)
    out, lse = maskc.attention(q, k, v, bound, return_lse=True, enable_gqa=True)
    if grad_off == "no_grad":
        with torch.no_grad():
            fast, fast_lse = maskc.attention(q, k, v, bound, return_lse=True, enable_gqa=True)
    else:
        fast, fast_lse = maskc.attention(q.detach(), k.detach(), v.detach(), bound, return_lse=True, enable_gqa=True)
    assert fast.grad_fn is None and fast_lse.grad_fn is None and out.grad_fn is not None
    assert torch.equal(fast, out.detach()) and torch.equal(fast_lse, lse.detach())
    assert torch.equal(maskc.attention(q.detach(), k.detach(), v.detach(), bound, enable_gqa=True), out.detach())


def test_rows_without_keys_have_zero_gradients():
    # sliding window 5 over 20 keys: queries 24.. see nothing
    bound = maskc.load(EXAMPLES / "sliding_window.mask").bind(seq_len=40, kv_len=20, window=5)
    q, k, v = inputs(1, 1, 1, 40, 20, 8, seed=8)
    out = maskc.attention(q, k, v, bound)
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (out[:, :, 24:] == 0).all() and (dq[:, :, 24:] == 0).all()
    assert not any(torch.isnan(g).any() for g in (dq, dk, dv))


def test_opcheck_fake_implementations():
    """torch.library.opcheck: schema, fake (meta) implementation and autograd registration agree."""
    bound = bound_of("document", 30, seed=9)
    q, k, v = inputs(1, 2, 1, 30, 30, 8, seed=10)
    handle = torch.from_numpy(bound.handle_array)
    for options in ("", maskc.Options(sync=True).token):    # "": the environment's options
        torch.library.opcheck(torch_ops.attention_forward, (q, k, v, handle, 0.25, False, options))
        out, lse = torch_ops.attention_forward(q, k, v, handle, 0.25, False, options)
        dout = torch.randn_like(out)
        args = (dout, q.detach(), k.detach(), v.detach(), out.detach(), lse.detach(), None, handle, 0.25, False,
                options)
        torch.library.opcheck(torch_ops.attention_backward, args)


DOCUMENTS = ([10, 27], [37], [5, 5, 27], [20, 17], [1, 2, 3, 4, 27])     # new lengths and counts every step


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_new_mask_every_step_compiles_once(backend):
    """A new bound mask every step (new document lengths and counts, same shapes): one graph, no recompile,
    no graph break (fullgraph=True), and each step's gradients are eager's for that step's mask."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()        # other tests' graphs (flex_attention compiles its own) do not count
    mask = maskc.load(EXAMPLES / "document.mask")

    def step(q, k, v, bound):
        return (maskc.attention(q, k, v, bound) ** 2).sum()

    compiled = torch.compile(step, backend=backend, fullgraph=True)
    q, k, v = inputs(1, 2, 2, 37, 37, 8, seed=11)
    for docs in DOCUMENTS:
        bound = mask.bind(seq_len=37, docs=docs)
        got = torch.autograd.grad(compiled(q, k, v, bound), (q, k, v))
        want = torch.autograd.grad(dense_attention(q, k, v, bound, 8 ** -0.5).pow(2).sum(), (q, k, v))
        for a, b in zip(got, want):
            assert torch.allclose(a, b)
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert not counters["recompiles"] and not counters["graph_break"], (dict(counters["recompiles"]),
                                                                         dict(counters["graph_break"]))


def test_torch_compile_new_batched_masks_and_sub_blocks_compile_once():
    """The same with a batch of masks per step (jagged users) and with sub-blocks of them (restrict)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    mask = maskc.load(EXAMPLES / "hstu.mask")
    compiled = torch.compile(lambda q, k, v, bound: maskc.attention(q, k, v, bound).sum(), backend="aot_eager",
                             fullgraph=True)
    q, k, v = inputs(2, 2, 2, 40, 40, 8, seed=12)
    rng = np.random.default_rng(0)
    for _ in range(4):
        users = [[int(x) for x in np.diff(np.concatenate([[0], np.sort(rng.choice(np.arange(1, 40), n - 1,
                                                                                  replace=False)), [40]]))]
                 for n in rng.integers(1, 5, size=2)]
        bound = mask.bind(seq_len=40, users=users, targets=[[min(1, u) for u in us] for us in users])
        for sub in (bound, bound.restrict((8, 40), (0, 40))):
            qs = q[:, :, 8:] if sub is not bound else q
            got = torch.autograd.grad(compiled(qs, k, v, sub), (q, k, v))
            want = torch.autograd.grad(maskc.attention(qs, k, v, sub).sum(), (q, k, v))
            for a, b in zip(got, want):
                assert torch.allclose(a, b)
    assert counters["stats"]["unique_graphs"] == 2, dict(counters["stats"])     # one per shape of q
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_torch_compile_with_options(monkeypatch):
    """Options given to the compiled call reach the custom ops' implementations (as their token, no graph
    break), and the environment's where none are given; the result is eager's."""
    import torch._dynamo

    torch._dynamo.reset()
    bound = bound_of("document", 29, seed=13)
    options = maskc.Options(engine="mma", sync=True, dq_reduction="red2")
    monkeypatch.setenv("MASKC_BWD_ENGINE", "mma")
    seen = []
    forward, backward = torch_ops._forward, torch_ops._backward_of
    monkeypatch.setattr(torch_ops, "_forward", lambda *a: seen.append(a[-1]) or forward(*a))
    monkeypatch.setattr(torch_ops, "_backward_of", lambda *a: seen.append(a[-1]) or backward(*a))

    def step(q, k, v, options):
        return (maskc.attention(q, k, v, bound, options=options) ** 2).sum()

    q, k, v = inputs(1, 2, 2, 29, 29, 8, seed=14)
    want = torch.autograd.grad(step(q, k, v, None), (q, k, v))
    for given, expected in ((options, options), (None, maskc.Options(backward_engine="mma"))):
        seen.clear()
        compiled = torch.compile(lambda q, k, v: step(q, k, v, given), backend="aot_eager", fullgraph=True)
        for a, b in zip(torch.autograd.grad(compiled(q, k, v), (q, k, v)), want):
            assert torch.allclose(a, b)
        assert seen == [expected, expected]            # the forward's and the backward's


def test_eager_backward_runs_with_its_forwards_options(monkeypatch):
    """The environment is read once per call: a MASKC_* variable changed between the forward and the backward
    does not reach the backward, which runs with the options its forward ran with."""
    bound = bound_of("document", 29, seed=13)
    seen = []
    forward, backward = torch_ops._forward, torch_ops._backward_of
    monkeypatch.setattr(torch_ops, "_forward", lambda *a: seen.append(a[-1]) or forward(*a))
    monkeypatch.setattr(torch_ops, "_backward_of", lambda *a: seen.append(a[-1]) or backward(*a))
    monkeypatch.setenv("MASKC_BWD_ENGINE", "mma")
    q, k, v = inputs(1, 2, 2, 29, 29, 8, seed=14)
    out = maskc.attention(q, k, v, bound)
    monkeypatch.setenv("MASKC_BWD_ENGINE", "wgmma")
    torch.autograd.grad(out.sum(), (q, k, v))
    assert seen == [maskc.Options(backward_engine="mma")] * 2


def test_input_errors_are_clear():
    bound = bound_of("causal", 16)
    q, k, v = inputs(1, 2, 1, 16, 16, 8, seed=12)
    with pytest.raises(ValueError, match="seq_len"):
        maskc.attention(q[:, :, :8], k, v, bound, enable_gqa=True)
    three, two = torch.randn(1, 3, 16, 8, dtype=torch.float64), torch.randn(1, 2, 16, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match="multiple"):
        maskc.attention(three, two, two, bound, enable_gqa=True)
    with pytest.raises(ValueError, match="same number of heads.*enable_gqa=True"):
        maskc.attention(q, k, v, bound)                  # GQA only when asked for, as in Flex
    with pytest.raises(TypeError, match="once"):
        maskc.attention(q, k, v, bound, block_mask=bound.to_flex_block_mask(), enable_gqa=True)
    with pytest.raises(TypeError, match="bound mask"):
        maskc.attention(q, k, v, "causal", enable_gqa=True)
