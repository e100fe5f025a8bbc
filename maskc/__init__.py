"""maskc: a compiler for transformer attention masks.

    import maskc
    mask = maskc.load("examples/document.mask")
    bound = mask.bind(seq_len=4096, docs=[1000, 3000, 96])
    bound.tiles(128, 128)          # EMPTY / PARTIAL / FULL per tile, sound and exact
    bound.descriptor(128, 64)      # the compact int32 runs the CUDA kernel walks
    out = maskc.attention(q, k, v, bound)           # shaped like flex_attention(q, k, v, block_mask=...)

For FlexAttention users: :func:`create_block_mask` and :func:`create_mask` take a .mask file where Flex takes
a ``mask_mod``, and give Flex's ``BlockMask`` and dense mask; ``maskc.attention`` accepts that BlockMask too.
"""
from __future__ import annotations

from typing import Any

from maskc.device_mask import DeviceMask
from maskc.errors import BindError, InputError, MaskError, MaskFileError, MaskSyntaxError
from maskc.flex import create_block_mask, create_mask
from maskc.kernel_ir import EMPTY, FULL, PARTIAL, Descriptor, TileMap
from maskc.options import Options
from maskc.pipeline import BoundMask, CompiledMask, compile_all, compile_mask, load
from maskc import ordered  # noqa: F401  (maskc.ordered.token_order: a bound mask's token order)
from maskc.restrict import RestrictedMask
from maskc.runtime.reference import reference_attention

__version__ = "0.1.0"


def _bound_of(mask: Any, block_mask: Any) -> BoundMask | RestrictedMask | DeviceMask:
    """The BoundMask behind ``mask`` or ``block_mask``: a BoundMask itself, or a Flex BlockMask made by
    :func:`create_block_mask` / :meth:`BoundMask.to_flex_block_mask`."""
    if (mask is None) == (block_mask is None):
        raise TypeError("attention() takes the mask once: as its fourth argument or as block_mask=")
    given = mask if mask is not None else block_mask
    if isinstance(given, (BoundMask, RestrictedMask, DeviceMask)):   # sub-blocks and masks bound on the GPU too
        return given
    bound = getattr(getattr(given, "mask_mod", None), "bound", None)
    if isinstance(bound, BoundMask):
        lengths = getattr(given, "seq_lengths", None)
        if lengths is not None and tuple(lengths) != (bound.seq_len, bound.kv_len):
            raise InputError(f"this BlockMask covers {tuple(lengths)} query and key positions; the mask it was "
                             f"made from was bound to ({bound.seq_len}, {bound.kv_len})")
        return bound
    raise TypeError(f"attention() needs a bound mask (maskc.load(...).bind(...)) or a BlockMask from "
                    f"maskc.create_block_mask, not {type(given).__name__}")


def _check_inputs(query: Any, key: Any, value: Any, enable_gqa: bool) -> None:
    """Flex's rules: one floating-point dtype for query, key and value; 4-D; head counts that match unless
    ``enable_gqa``, and then divide."""
    dtypes = [getattr(x, "dtype", None) for x in (query, key, value)]
    if len({str(d) for d in dtypes}) != 1:
        raise ValueError(f"query, key and value must have the same dtype; got {dtypes[0]}, {dtypes[1]}, {dtypes[2]}")
    floating = getattr(dtypes[0], "is_floating_point", None)        # torch's dtypes; NumPy's and CuPy's: kind
    if not (floating if floating is not None else getattr(dtypes[0], "kind", "") == "f"):
        raise ValueError(f"query, key and value must be floating point (bf16 or fp16 on the GPU); got {dtypes[0]}")
    shapes = [tuple(getattr(x, "shape", ())) for x in (query, key, value)]
    if any(len(s) != 4 for s in shapes):
        raise ValueError(f"query, key and value must be 4-D (B, H, S, D); got shapes {shapes[0]}, {shapes[1]}, "
                         f"{shapes[2]}")
    hq, hkv = shapes[0][1], shapes[1][1]
    if not enable_gqa and hq != hkv:
        raise ValueError(f"Expect query and key/value to have the same number of heads but got Hq={hq} and "
                         f"Hkv={hkv}. Try setting enable_gqa=True for GQA.")
    if enable_gqa and (hkv == 0 or hq % hkv):
        raise ValueError(f"Expect number of query heads to be a multiple of kv heads for GQA but got Hq={hq} and "
                         f"Hkv={hkv}.")


def attention(query: Any, key: Any, value: Any, mask: BoundMask | DeviceMask | None = None, *, block_mask: Any = None,
              scale: float | None = None, enable_gqa: bool = False, return_lse: bool = False,
              deterministic: bool = False, options: Options | None = None) -> Any:
    """Masked attention with maskc's generated kernels, shaped like ``flex_attention``.

    ``query`` (B, Hq, S, D), ``key`` and ``value`` (B, Hkv, Skv, D): torch tensors (differentiable through
    ``maskc.runtime.torch_ops``; CUDA runs the kernels, CPU the reference path; traceable by torch.compile) or
    CuPy arrays (the forward kernel; see :func:`attention_backward`). ``mask``: a :class:`BoundMask`, or,
    as ``block_mask=``, a Flex ``BlockMask`` from :func:`create_block_mask`; or a :class:`DeviceMask`
    (``bind_on_device``: the descriptor built on the GPU). ``scale`` defaults to
    1/sqrt(D). ``enable_gqa``: allow Hq to be a multiple of Hkv (query head h reads key/value head
    h // (Hq // Hkv)); without it differing head counts are an error, as in Flex. ``return_lse``: also the
    log-sum-exp of each row's scaled scores (natural log, -inf where a row sees no key). ``deterministic``
    makes the backward bitwise repeatable (no atomics). ``options``: how the kernels are built and run
    (:class:`Options`: engines, tiles, autotuning, cache directory, target...); default: those the
    ``MASKC_*`` environment variables set (:meth:`Options.from_environment`).

    Returns the output, or ``(output, lse)`` with ``return_lse``.
    """
    bound = _bound_of(mask, block_mask)
    _check_inputs(query, key, value, enable_gqa)
    if type(query).__module__.startswith("torch"):
        from maskc.runtime.torch_ops import attention as _torch_attention
        return _torch_attention(query, key, value, bound, scale=scale, return_lse=return_lse,
                                deterministic=deterministic, options=options)
    from maskc.runtime.kernels import attention as _attention
    return _attention(query, key, value, bound, scale=scale, return_lse=return_lse, options=options)


def attention_backward(dout: Any, q: Any, k: Any, v: Any, out: Any, lse: Any, bound_mask: BoundMask,
                       scale: float | None = None, dlse: Any = None, deterministic: bool = False,
                       options: Options | None = None) -> tuple[Any, Any, Any]:
    """(dQ, dK, dV) on the GPU from the forward's O and LSE, for torch tensors or CuPy arrays (no autograd:
    torch users get this through ``attention(...).backward()``)."""
    from maskc.runtime.kernels import attention_backward as _backward
    return _backward(dout, q, k, v, out, lse, bound_mask, scale=scale, dlse=dlse, deterministic=deterministic,
                     options=options)


__all__ = ["load", "compile_mask", "compile_all", "CompiledMask", "BoundMask", "DeviceMask", "TileMap", "Descriptor",
           "attention", "attention_backward", "create_block_mask", "create_mask", "reference_attention",
           "MaskError", "MaskFileError", "MaskSyntaxError", "BindError", "InputError", "Options",
           "EMPTY", "PARTIAL", "FULL", "__version__"]
