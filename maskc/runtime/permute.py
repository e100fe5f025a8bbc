"""Token orders at the runtime's boundary (:mod:`maskc.ordered`): which order a call runs in, and tensors moved
along the sequence into it and back.

    ordered = ordered_for(bound, options, q, k)    # None: the raster order (the call runs as it is)
    qp, kp, vp = to_order_all((q, k, v), ordered, options)
    out, = from_order_all((attention(qp, kp, vp, ordered.inner),), ordered, options)

The sequence axis is axis 2 of (B, H, S[, D]) data, torch tensors (any device) or CuPy arrays.
:func:`to_order_all` and :func:`from_order_all` move every array of a call in one launch of the moves kernel
(:mod:`maskc.runtime.moves`) where they are on a GPU and CuPy is there, else one by one as :func:`to_order` and
:func:`from_order` do: a reshape and a transpose, not a gather (positions before the image and past its last
whole band are copied as they are, and the bands of ``rows`` image rows, viewed as (bands, rows, width / cols,
cols), are copied as (bands, width / cols, rows, cols) and back), one strided copy per array. Both give the same
bytes.
"""
from __future__ import annotations

from typing import Sequence

from maskc.options import Options


def ordered_for(bound, options: Options, q, k):
    """The :class:`~maskc.ordered.OrderedMask` ``options.token_order`` gives ``bound``, or None: the raster order,
    a mask already in its order (the call an ordered one makes), and inputs whose lengths are not the mask's (the
    raster path reports them)."""
    if options.token_order == "raster" or not hasattr(bound, "params") or bound.mask.order is not None:
        return None
    q_shape, k_shape = tuple(getattr(q, "shape", ())), tuple(getattr(k, "shape", ()))
    if len(q_shape) != 4 or len(k_shape) != 4 or (q_shape[2], k_shape[2]) != (bound.seq_len, bound.kv_len):
        return None
    from maskc.ordered import token_order
    return token_order(bound, options)


def to_order_all(xs: Sequence, ordered, options: Options | None = None) -> tuple:
    """Every array of ``xs`` in the order of ``ordered`` (None stays None): in one launch on the GPU (module
    docstring), else :func:`to_order` each."""
    return _all(xs, ordered, True, options)


def from_order_all(xs: Sequence, ordered, options: Options | None = None) -> tuple:
    """Every array of ``xs`` (in the order) back in raster order (None stays None): in one launch on the GPU,
    else :func:`from_order` each."""
    return _all(xs, ordered, False, options)


def _all(xs: Sequence, ordered, into: bool, options: Options | None) -> tuple:
    present = [x for x in xs if x is not None]
    fast = None
    if present and _on_gpu(present[0]):
        from maskc.runtime.moves import move
        fast = move(present, ordered, into, options)
    moved = fast if fast is not None else tuple(_moved(x, ordered, into) for x in present)
    it = iter(moved)
    return tuple(None if x is None else next(it) for x in xs)


def _on_gpu(x) -> bool:
    return type(x).__module__.startswith("cupy") or bool(getattr(x, "is_cuda", False))


def to_order(x, ordered):
    """``x`` (raster order along axis 2) in the order of ``ordered``: ``x[:, :, ordered.permutation]``."""
    return _moved(x, ordered, into=True)


def from_order(x, ordered):
    """``x`` (in the order along axis 2) back in raster order: ``x[:, :, ordered.inverse]``."""
    return _moved(x, ordered, into=False)


def _moved(x, ordered, into: bool):
    if x is None:
        return None
    order, S = ordered.order, ordered.parent.seq_len
    start, end = order.origin, order.end(S)
    bands, wide = (end - start) // order.band, order.width // order.cols
    rest = tuple(x.shape[3:])
    lead = tuple(x.shape[:2])
    raster = lead + (bands, order.rows, wide, order.cols) + rest
    ordered_shape = lead + (bands, wide, order.rows, order.cols) + rest
    axes = (0, 1, 2, 4, 3, 5) + tuple(range(6, 6 + len(rest)))      # swaps (rows, wide): its own inverse
    src_shape, dst_shape = (raster, ordered_shape) if into else (ordered_shape, raster)
    if type(x).__module__.startswith("torch"):
        out = x.new_empty(x.shape)
        out[:, :, :start] = x[:, :, :start]
        out[:, :, end:] = x[:, :, end:]
        out[:, :, start:end].view(dst_shape).copy_(x[:, :, start:end].reshape(src_shape).permute(axes))
        return out
    import cupy
    out = cupy.empty_like(x)
    out[:, :, :start] = x[:, :, :start]
    out[:, :, end:] = x[:, :, end:]
    out[:, :, start:end] = x[:, :, start:end].reshape(src_shape).transpose(axes).reshape(
        lead + (end - start,) + rest)
    return out
