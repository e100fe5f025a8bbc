"""The numerical oracle: masked attention and its gradients in numpy float64, from a bound mask's dense form."""
from __future__ import annotations

import numpy as np


def _as_numpy(x) -> np.ndarray:
    if hasattr(x, "detach"):                       # torch
        return x.detach().to("cpu").double().numpy()
    if hasattr(x, "get"):                          # CuPy
        return np.asarray(x.get(), np.float64)
    return np.asarray(x, np.float64)


def _modified(bound_mask, scores: np.ndarray, batch_index: int, head: int) -> tuple[np.ndarray, np.ndarray]:
    """The score modifier and its derivative on one head's scaled scores (scores and 1 without one)."""
    if bound_mask.mask.resolved.score is None:
        return scores, np.ones_like(scores)
    with np.errstate(all="ignore"):           # hidden pairs may overflow; np.where drops them
        return bound_mask.modified_scores(scores, batch_index, head)


def reference_attention(q, k, v, bound_mask, scale=None, return_lse=False):
    """softmax(mod(q kᵀ · scale), masked) v in float64, shapes (B, Hq, S, D) and (B, Hkv, K, D); ``mod`` is
    the mask's score modifier (none: the identity), applied to the scaled scores.

    Rows that see no key give 0 and log-sum-exp -inf. GQA: query head h reads kv head
    h // (Hq // Hkv). Returns numpy arrays.
    """
    q, k, v = _as_numpy(q), _as_numpy(k), _as_numpy(v)
    batch, hq, s, d = q.shape
    hkv = k.shape[1]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    out = np.zeros(q.shape, np.float64)
    lse = np.full((batch, hq, s), -np.inf)
    uses_head = bound_mask.num_heads is not None
    for b in range(batch):
        mb = b if bound_mask.batch > 1 else 0
        dense = None if uses_head else bound_mask.dense(mb)
        for h in range(hq):
            mask = bound_mask.dense(mb, h) if uses_head else dense
            kv = h // (hq // hkv)
            scores = np.where(mask, _modified(bound_mask, q[b, h] @ k[b, kv].T * scale, mb, h if uses_head else 0)[0],
                              -np.inf)
            peak = scores.max(axis=1, keepdims=True)
            seen = np.isfinite(peak[:, 0])
            p = np.where(mask, np.exp(scores - np.where(seen[:, None], peak, 0.0)), 0.0)
            total = p.sum(axis=1, keepdims=True)
            out[b, h] = np.where(seen[:, None], (p / np.where(total > 0, total, 1.0)) @ v[b, kv], 0.0)
            lse[b, h] = np.where(seen, np.log(np.where(seen, total[:, 0], 1.0)) + np.where(seen, peak[:, 0], 0), -np.inf)
    return (out, lse) if return_lse else out


def reference_attention_backward(q, k, v, dout, bound_mask, scale=None):
    """(dq, dk, dv) of :func:`reference_attention` for the output gradient ``dout``, in float64, by the
    textbook softmax backward dS = P * (dP - rowsum(P * dP)) (the kernels use rowsum(dO * O) instead: equal
    in exact arithmetic, computed differently), times the score modifier's derivative mod'(scaled score). dk and
    dv are summed over each GQA group."""
    q, k, v, dout = _as_numpy(q), _as_numpy(k), _as_numpy(v), _as_numpy(dout)
    batch, hq, s, d = q.shape
    group = hq // k.shape[1]
    scale = 1.0 / np.sqrt(d) if scale is None else float(scale)
    dq, dk, dv = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape)
    for b in range(batch):
        mb = b if bound_mask.batch > 1 else 0
        for h in range(hq):
            mh = h if bound_mask.num_heads is not None else 0       # a binding without num_heads: one head
            mask = bound_mask.dense(mb, mh)
            kv = h // group
            modified, slope = _modified(bound_mask, q[b, h] @ k[b, kv].T * scale, mb, mh)
            scores = np.where(mask, modified, -np.inf)
            peak = scores.max(axis=1, keepdims=True)
            p = np.where(mask, np.exp(scores - np.where(np.isfinite(peak), peak, 0.0)), 0.0)
            total = p.sum(axis=1, keepdims=True)
            p = p / np.where(total > 0, total, 1.0)
            dp = dout[b, h] @ v[b, kv].T
            ds = p * (dp - (p * dp).sum(axis=1, keepdims=True)) * np.where(mask, slope, 0.0)
            dq[b, h] = ds @ k[b, kv] * scale
            dk[b, kv] += ds.T @ q[b, h] * scale
            dv[b, kv] += p.T @ dout[b, h]
    return dq, dk, dv
