"""The token order's moves kernel on the GPU (maskc/runtime/moves.py): every array of a call moved in one launch,
bitwise the torch moves (maskc.runtime.permute.to_order / from_order) for several orders, dtypes, GQA, strided
inputs, batches, LSE rows and CuPy arrays; the launch really taken (not the torch path); ordered attention,
forward and backward, bitwise the same with the kernel's moves as with torch's; inside a CUDA graph and under
torch.compile."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

import torch  # noqa: E402

import maskc  # noqa: E402
import maskc.runtime  # noqa: E402
from maskc import Options  # noqa: E402
from maskc.analysis.order import TokenOrder  # noqa: E402
from maskc.ordered import token_order  # noqa: E402
from maskc.runtime import moves  # noqa: E402
from maskc.runtime.permute import from_order, from_order_all, to_order, to_order_all  # noqa: E402
from gpu_support import load, randn  # noqa: E402
from test_token_moves import bits, layouts, ordered_of  # noqa: E402

CASES = [
    # (order, seq_len, B, Hq, Hkv, D, dtype): a text prefix not a multiple of 128 and a short last band; NATTEN's
    # prime width column by column; the benchmark's CLEAR; fp32 rows; head dims 64, 128, 256
    (TokenOrder(64, 64, 8, 8), 64 + 512 * 5 + 100, 2, 4, 2, 128, torch.bfloat16),
    (TokenOrder(0, 181, 8, 1), 181 * 181, 1, 4, 1, 64, torch.float16),
    (TokenOrder(512, 128, 8, 16), 32768, 1, 16, 16, 128, torch.bfloat16),
    (TokenOrder(512, 128, 4, 32), 8192, 3, 2, 2, 256, torch.float16),
    (TokenOrder(7, 10, 3, 5), 7 + 10 * 9 + 4, 2, 3, 1, 32, torch.float32),
]
IDS = [f"{c[0].name}-w{c[0].width}-o{c[0].origin}-S{c[1]}-d{c[5]}" for c in CASES]


@pytest.mark.parametrize("into", [True, False], ids=["into", "back"])
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_one_launch_moves_as_torch_does(case, into):
    """A backward's seven inputs at once (five head-dim arrays of four layouts, LSE and a strided dLSE), then the
    forward's (q, k, v; out and LSE): the kernel's launch is taken, and its bytes are the torch moves'."""
    order, S, B, Hq, Hkv, D, dtype = case
    ordered = ordered_of(order, S)
    xs = layouts(B, Hq, Hkv, S, D, dtype, device="cuda")
    reference = to_order if into else from_order
    for group in (xs, xs[:3], xs[3:5]):
        got = moves.move(group, ordered, into)
        assert got is not None, "the kernel's path was not taken"
        torch.cuda.synchronize()
        for x, g in zip(group, got):
            assert g.is_contiguous() and g.shape == x.shape and g.dtype == x.dtype
            assert torch.equal(bits(g), bits(reference(x, ordered)))
    there = to_order_all(xs, ordered)
    back = from_order_all(there, ordered)
    for x, b in zip(xs, back):
        assert torch.equal(bits(b), bits(x))


def test_cupy_arrays_move_as_torch_tensors_do():
    cupy = pytest.importorskip("cupy")
    order, S = TokenOrder(64, 64, 8, 8), 64 + 512 * 5 + 100
    ordered = ordered_of(order, S)
    q = randn(2, 4, S, 128, dtype="fp16")
    lse = torch.randn(2, 4, S, device="cuda")
    got = moves.move([cupy.asarray(q), cupy.asarray(lse)], ordered, True)
    assert got is not None and all(isinstance(g, cupy.ndarray) for g in got)
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(bits(torch.as_tensor(got[0], device="cuda")), bits(to_order(q, ordered)))
    assert torch.equal(bits(torch.as_tensor(got[1], device="cuda")), bits(to_order(lse, ordered)))


def test_what_the_kernel_cannot_take_moves_by_torch():
    """A misaligned data pointer, a strided last dim, mixed devices of kinds: the torch path, the same bytes."""
    order, S = TokenOrder(3, 16, 4, 4), 3 + 64 * 6 + 9
    ordered = ordered_of(order, S)
    base = randn(1, 2, S, 72, dtype="bf16")
    shifted = base[..., 1:65]                       # 2 bytes past a 16-byte boundary
    strided = base[..., ::2]                        # the last dim not contiguous
    assert moves.move([shifted], ordered, True) is None and moves.move([strided], ordered, True) is None
    assert moves.move([base, base.cpu()], ordered, True) is None
    for x in (shifted, strided):
        assert torch.equal(bits(to_order_all((x,), ordered)[0]), bits(to_order(x, ordered)))


def _ordered_call(bound, q, k, v, dout, options):
    out, lse = maskc.runtime.attention(q, k, v, bound, return_lse=True, options=options)
    grads = maskc.runtime.attention_backward(dout, q, k, v, out, lse, bound, deterministic=True, options=options)
    return (out, lse, *grads)


@pytest.mark.parametrize("name,params,S,shape", [
    ("clear", {"text": 64, "width": 64, "radius": 9}, 64 + 512 * 5 + 100, "8x8"),
    ("neighborhood", {"width": 61, "window": 7}, 61 * 45, "8x1"),
])
def test_ordered_attention_is_bitwise_the_same_with_torch_moves(name, params, S, shape, monkeypatch):
    """Forward (O, LSE) and the deterministic backward in an order: the kernel's moves or torch's, the same bits
    (the moves are copies; the kernels between them the same)."""
    bound = load(name).bind(seq_len=S, **params)
    options = Options(token_order=shape)
    q, k, v, dout = (randn(2, h, S, 128, dtype="bf16") for h in (4, 2, 2, 4))
    launches = []
    real = moves.move
    monkeypatch.setattr(moves, "move", lambda *a, **kw: launches.append(a[2]) or real(*a, **kw))
    fast = _ordered_call(bound, q, k, v, dout, options)
    assert launches == [True, False, True, False], launches    # one launch per direction, forward and backward
    monkeypatch.setattr(moves, "move", lambda *a, **kw: None)
    slow = _ordered_call(bound, q, k, v, dout, options)
    for a, b in zip(fast, slow):
        assert torch.equal(bits(a), bits(b))


def test_cuda_graph_captures_the_moves_of_an_ordered_step():
    """Forward and backward in an order captured once (after a warm-up on the capture stream); each replay on new
    inputs gives the eager step's output and gradients."""
    bound = load("clear").bind(seq_len=2724, text=64, width=64, radius=9)
    options = Options(token_order="8x8")
    q, k, v, dout = (randn(1, 2, 2724, 64, dtype="bf16") for _ in range(4))

    def step():
        return _ordered_call(bound, q, k, v, dout, options)

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        static = step()
    for _ in range(3):
        for x in (q, k, v, dout):
            x.copy_(randn(*x.shape, dtype="bf16"))
        graph.replay()
        torch.cuda.synchronize()
        for a, b in zip(static, step()):
            assert torch.equal(bits(a), bits(b))


def test_torch_compile_runs_the_ordered_call_without_graph_breaks():
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    bound = load("clear").bind(seq_len=2724, text=64, width=64, radius=9)
    assert token_order(bound, "8x8") is not None
    options = Options(token_order="8x8")

    def step(q, k, v):
        return (maskc.attention(q, k, v, bound, options=options) ** 2).sum()

    compiled = torch.compile(step, fullgraph=True)
    q, k, v = (randn(1, 2, 2724, 64, dtype="bf16").requires_grad_() for _ in range(3))
    got = torch.autograd.grad(compiled(q, k, v), (q, k, v))
    want = torch.autograd.grad(step(q, k, v), (q, k, v))
    for a, b in zip(got, want):
        assert torch.allclose(a.float(), b.float(), rtol=1e-2, atol=1e-3)
    assert not counters["graph_break"], dict(counters["graph_break"])


def test_the_kernel_moves_at_32k_match_index_select():
    """The benchmark's shape (CLEAR at 32K, auto's order, B=1, H=16, D=128): the gathers an index_select makes."""
    bound = load("clear").bind(seq_len=32768, text=512, width=128, radius=16)
    ordered = token_order(bound, "8x16")
    q, k, v = (randn(1, 16, 32768, 128, dtype="bf16") for _ in range(3))
    perm = torch.from_numpy(ordered.permutation).cuda()
    for x, m in zip((q, k, v), to_order_all((q, k, v), ordered)):
        assert torch.equal(bits(m), bits(x.index_select(2, perm)))
    inverse = torch.from_numpy(np.asarray(ordered.inverse)).cuda()
    assert torch.equal(bits(from_order_all((q,), ordered)[0]), bits(q.index_select(2, inverse)))
