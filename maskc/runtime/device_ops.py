"""The torch custom op behind :meth:`maskc.DeviceMask.update` under ``torch.compile``.

Apart from :mod:`maskc.runtime.torch_ops` so that the device mask, which the compiler's ``bind_on_device``
reaches, does not import the attention runtime (and through it the token orders, which compile masks).
The attention ops read the same token tensor that this op is declared to mutate, so they are ordered after it.
"""
from __future__ import annotations

import torch

from maskc.runtime import handles


@torch.library.custom_op("maskc::update_device_mask", mutates_args=("mask",))
def update_device_mask(mask: torch.Tensor, names: str, values: list[torch.Tensor]) -> None:
    """maskc.DeviceMask.update under torch.compile: new values (``names``, comma-separated, and their tensors)
    for the device mask whose handle ``mask`` (its token) holds. Declared as mutating the token: the attention ops
    that read it come after."""
    handles.lookup(int(mask)).update(**dict(zip(names.split(","), values)))


@update_device_mask.register_fake
def _(mask, names, values):
    return None
