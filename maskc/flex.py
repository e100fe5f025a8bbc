"""FlexAttention interop: a bound mask as a ``mask_mod``, and Flex's ``create_block_mask`` / ``create_mask``
with a .mask file where Flex takes a mask_mod.

    block_mask = maskc.create_block_mask("examples/document.mask", B=None, H=None, Q_LEN=4096, docs=[1000, 3096])
    flex_attention(q, k, v, block_mask=block_mask)        # or maskc.attention(q, k, v, block_mask=block_mask)

A mask with a score modifier (``score = ...``) exports it as a ``score_mod`` too (:class:`FlexScoreMod`,
``bound.flex_score_mod()``): ``flex_attention(q, k, v, score_mod=bound.flex_score_mod(), block_mask=...)``
computes what ``maskc.attention`` does (Flex also hands score_mod the scaled score).

The mask_mod and score_mod are in :mod:`maskc.flex_mods` (re-exported here): O(seq_len + kv_len) tables, any
length, torch.compile, pair for pair what ``bound.dense()`` gives.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from maskc.bound import check_flex_batch
from maskc.call_params import merged, own_keywords
from maskc.flex_mods import Device, FlexMaskMod, FlexScoreMod
from maskc.pipeline import BoundMask, CompiledMask, load

if TYPE_CHECKING:
    import torch
    from torch.nn.attention.flex_attention import BlockMask


def _bind(call: str, mask: "CompiledMask | str | os.PathLike[str]", B: int | None, H: int | None, Q_LEN: int | None,
          KV_LEN: int | None, params: Mapping[str, Any] | None, values: dict[str, Any],
          own: dict[str, tuple[bool, str]]) -> "BoundMask":
    """Flex's arguments to a bound mask: B checked against a batch the parameters give, H the number of
    heads for masks that read h; ``own``: the call's other keywords a mask parameter could be named
    (:mod:`maskc.call_params`)."""
    compiled = mask if isinstance(mask, CompiledMask) else load(os.fspath(mask))
    if Q_LEN is None:
        raise TypeError("Q_LEN is required: the number of query positions")
    own = {"B": (B is not None, "batch size"), "H": (H is not None, "number of heads"),
           "Q_LEN": (True, "number of query positions"), "KV_LEN": (KV_LEN is not None, "number of key positions"),
           **own}
    with own_keywords(call, compiled.resolved, params, own):
        bound = compiled.bind(seq_len=Q_LEN, kv_len=KV_LEN, num_heads=H if compiled.reads_head else None,
                              **merged(call, params, values))
    check_flex_batch(bound, B)
    return bound


def create_block_mask(mask: "CompiledMask | str | os.PathLike[str]", B: int | None = None, H: int | None = None,
                      Q_LEN: int | None = None, KV_LEN: int | None = None, device: Device = None,
                      BLOCK_SIZE: int | tuple[int, int] | None = None, *, params: Mapping[str, Any] | None = None,
                      **values: Any) -> "BlockMask":
    """Flex's ``create_block_mask`` for a .mask: a compiled mask or a path where Flex takes a mask_mod, and
    the mask's parameters as keyword arguments. Returns a Flex ``BlockMask`` on ``device`` (default: the
    CPU), built from maskc's tile classes in O(tiles) instead of evaluating the mask_mod on every pair,
    with :class:`FlexMaskMod` as its mask_mod. Its arrays are (B, H, ...) as Flex's are for the same arguments
    (None: 1), the blocks repeated where the mask is the same for every batch element or head; ``B`` must equal
    a batch that the parameters give (lists per element), whose size stands for None; ``H``: the number of
    heads, needed by masks that read ``h``; ``BLOCK_SIZE`` None: 128, Flex's default. ``maskc.attention`` accepts
    the result too. The mask's parameters come as keyword arguments and/or as ``params=``, a mapping: a parameter
    named like one of this function's own keywords (``H``, ``device``, ...) is given there
    (:mod:`maskc.call_params`)."""
    own = {"device": (device is not None, "device"), "BLOCK_SIZE": (BLOCK_SIZE is not None, "block size")}
    bound = _bind("create_block_mask", mask, B, H, Q_LEN, KV_LEN, params, values, own)
    return bound.to_flex_block_mask(128 if BLOCK_SIZE is None else BLOCK_SIZE, device, B, H)


def create_mask(mask: "CompiledMask | str | os.PathLike[str]", B: int | None = None, H: int | None = None,
                Q_LEN: int | None = None, KV_LEN: int | None = None, device: Device = None, *,
                params: Mapping[str, Any] | None = None, **values: Any) -> "torch.Tensor":
    """Flex's ``create_mask`` for a .mask: the dense bool mask (B, H, Q_LEN, KV_LEN), True where a query
    sees a key (e.g. for ``scaled_dot_product_attention``'s ``attn_mask``). B and H default to the
    mask's own (1 when it is the same for every batch element or head); O(Q_LEN x KV_LEN) memory. Parameters as
    :func:`create_block_mask` takes them."""
    import torch

    bound = _bind("create_mask", mask, B, H, Q_LEN, KV_LEN, params, values,
                  {"device": (device is not None, "device")})
    batch = B or bound.batch
    heads = H or bound.num_heads or 1
    rows = [[torch.from_numpy(bound.dense(b if bound.batch > 1 else 0, h if bound.num_heads else 0))
             for h in range(heads)] for b in range(batch)]
    return torch.stack([torch.stack(r) for r in rows]).to(device or "cpu")


__all__ = ["Device", "FlexMaskMod", "FlexScoreMod", "create_block_mask", "create_mask"]
