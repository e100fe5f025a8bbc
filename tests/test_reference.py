"""The float64 attention oracle against textbook formulas on masks whose answer is known."""
import numpy as np

import maskc
from conftest import EXAMPLES


def _inputs(rng, b=1, hq=2, hkv=1, s=9, k=9, d=4):
    return (rng.standard_normal((b, hq, s, d)), rng.standard_normal((b, hkv, k, d)),
            rng.standard_normal((b, hkv, k, d)))


def test_full_mask_is_plain_softmax_attention():
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, hq=2, hkv=2)
    bound = maskc.compile_mask("mask full()\n  allow true\n").bind(seq_len=9)
    out, lse = maskc.reference_attention(q, k, v, bound, return_lse=True)
    scores = q @ k.transpose(0, 1, 3, 2) / np.sqrt(4)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    weights /= weights.sum(-1, keepdims=True)
    np.testing.assert_allclose(out, weights @ v, rtol=1e-12)
    np.testing.assert_allclose(lse, np.log(np.exp(scores).sum(-1)), rtol=1e-12)


def test_causal_rows_match_prefix_softmax_and_gqa_shares_kv_heads():
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, hq=4, hkv=2, s=6, k=6)
    bound = maskc.load(EXAMPLES / "causal.mask").bind(seq_len=6)
    out = maskc.reference_attention(q, k, v, bound, scale=0.7)
    for h in range(4):
        kv = h // 2
        for i in range(6):
            s = q[0, h, i] @ k[0, kv, : i + 1].T * 0.7
            w = np.exp(s - s.max())
            np.testing.assert_allclose(out[0, h, i], (w / w.sum()) @ v[0, kv, : i + 1], rtol=1e-12)


def test_rows_that_see_nothing_give_zero_and_minus_infinity():
    rng = np.random.default_rng(2)
    q, k, v = _inputs(rng, s=5, k=5)
    bound = maskc.compile_mask("mask m()\n  allow k <= q, q >= 2\n").bind(seq_len=5)
    out, lse = maskc.reference_attention(q, k, v, bound, return_lse=True)
    assert np.all(out[:, :, :2] == 0) and np.all(np.isneginf(lse[:, :, :2]))
    assert np.all(np.isfinite(lse[:, :, 2:])) and not np.isnan(out).any()


def test_batch_elements_use_their_own_parameters():
    rng = np.random.default_rng(3)
    q, k, v = _inputs(rng, b=2, s=8, k=8)
    bound = maskc.load(EXAMPLES / "document.mask").bind(seq_len=8, docs=[[4, 4], [8]])
    out = maskc.reference_attention(q, k, v, bound)
    single = maskc.load(EXAMPLES / "document.mask").bind(seq_len=8, docs=[4, 4])
    np.testing.assert_allclose(out[:1], maskc.reference_attention(q[:1], k[:1], v[:1], single), rtol=1e-12)
    assert not np.allclose(out[1, :, 5], out[0, :, 5])   # row 5 sees keys 0..5 only in element 1


def test_backward_oracle_against_finite_differences():
    """reference_attention_backward is the gradient of reference_attention: central differences of
    <dout, O> in every input coordinate, on a masked GQA case with an empty row."""
    from maskc.runtime.reference import reference_attention_backward
    rng = np.random.default_rng(5)
    q, k, v = _inputs(rng, hq=2, hkv=1, s=6, k=4, d=3)
    bound = maskc.load(EXAMPLES / "sliding_window.mask").bind(seq_len=6, kv_len=4, window=2)
    dout = rng.standard_normal(q.shape)
    grads = reference_attention_backward(q, k, v, dout, bound, scale=0.7)
    loss = lambda q, k, v: float((maskc.reference_attention(q, k, v, bound, scale=0.7) * dout).sum())  # noqa: E731
    eps = 1e-6
    for which, grad in enumerate(grads):
        args = [q, k, v]
        numeric = np.zeros_like(args[which])
        for idx in np.ndindex(numeric.shape):
            plus = [a.copy() for a in args]
            minus = [a.copy() for a in args]
            plus[which][idx] += eps
            minus[which][idx] -= eps
            numeric[idx] = (loss(*plus) - loss(*minus)) / (2 * eps)
        np.testing.assert_allclose(grad, numeric, atol=1e-7)
    assert not bound.dense()[5].any() and np.all(grads[0][:, :, 5] == 0)   # query 5 sees no key: dq = 0
