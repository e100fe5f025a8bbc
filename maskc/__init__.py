"""maskc: a compiler for transformer attention masks.

    import maskc
    mask = maskc.load("examples/document.mask")
    bound = mask.bind(seq_len=4096, docs=[1000, 3000, 96])
    bound.tiles(128, 128)          # EMPTY / PARTIAL / FULL per tile, sound and exact
    bound.descriptor(128, 64)      # the compact int32 runs the CUDA kernel walks
"""
from .errors import BindError, InputError, MaskError, MaskSyntaxError
from .kernel_ir import EMPTY, FULL, PARTIAL
from .pipeline import BoundMask, CompiledMask, compile_all, compile_mask, load
from .reference import reference_attention

__version__ = "0.1.0"


def attention(q, k, v, bound_mask, scale=None, return_lse=False, deterministic=False):
    """Masked attention with maskc's generated kernels, shapes (B, H, S, D).

    torch tensors: differentiable (``maskc.torch_ops``; CUDA runs the kernels, CPU the reference path) and
    traceable by torch.compile. CuPy arrays: the forward kernel (see :func:`attention_backward`).
    ``deterministic`` makes the backward bitwise repeatable (no atomics)."""
    if type(q).__module__.startswith("torch"):
        from .torch_ops import attention as _torch_attention
        return _torch_attention(q, k, v, bound_mask, scale=scale, return_lse=return_lse, deterministic=deterministic)
    from .runtime import attention as _attention
    return _attention(q, k, v, bound_mask, scale=scale, return_lse=return_lse)


def attention_backward(dout, q, k, v, out, lse, bound_mask, scale=None, dlse=None, deterministic=False):
    """(dQ, dK, dV) on the GPU from the forward's O and LSE, for torch tensors or CuPy arrays (no autograd:
    torch users get this through ``attention(...).backward()``)."""
    from .runtime import attention_backward as _backward
    return _backward(dout, q, k, v, out, lse, bound_mask, scale=scale, dlse=dlse, deterministic=deterministic)


__all__ = ["load", "compile_mask", "compile_all", "CompiledMask", "BoundMask", "attention", "attention_backward",
           "reference_attention", "MaskError", "MaskSyntaxError", "BindError", "InputError",
           "EMPTY", "PARTIAL", "FULL", "__version__"]
