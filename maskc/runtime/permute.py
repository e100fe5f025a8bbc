"""Token orders at the runtime's boundary (:mod:`maskc.ordered`): which order a call runs in, and tensors gathered
along the sequence into it and back.

    ordered = ordered_for(bound, options, q, k)    # None: the raster order (the call runs as it is)
    out = take(attention(take(q, ordered.permutation), ..., ordered.inner), ordered.inverse)

``take(x, index)`` is ``x[:, :, index]`` for torch tensors (any device) and CuPy arrays, contiguous; the index
is uploaded once per device and kept on the ordered mask.
"""
from __future__ import annotations

import numpy as np

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
    return token_order(bound, options.token_order)


def take(x, index: np.ndarray, owner):
    """``x[:, :, index]`` (the sequence axis of (B, H, S[, D]) data), torch or CuPy, contiguous; ``index``'s copy on
    ``x``'s device kept in ``owner.__dict__``."""
    if x is None:
        return None
    copies = owner.__dict__.setdefault("_device_index", {})
    key: tuple
    if type(x).__module__.startswith("torch"):
        import torch
        key = ("torch", str(x.device), id(index))
        if key not in copies:
            copies[key] = (torch.from_numpy(index).to(x.device), index)    # the array kept: its id stays its own
        return torch.index_select(x, 2, copies[key][0])
    import cupy
    key = ("cupy", int(x.device.id), id(index))
    if key not in copies:
        with cupy.cuda.Device(x.device.id):
            copies[key] = (cupy.asarray(index), index)
    return cupy.take(x, copies[key][0], axis=2)
