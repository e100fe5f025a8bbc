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


def attention(q, k, v, bound_mask, scale=None, return_lse=False):
    """Masked attention on the GPU with maskc's generated kernel (torch or CuPy tensors, B×H×S×D)."""
    from .runtime import attention as _attention
    return _attention(q, k, v, bound_mask, scale=scale, return_lse=return_lse)


__all__ = ["load", "compile_mask", "compile_all", "CompiledMask", "BoundMask", "attention",
           "reference_attention", "MaskError", "MaskSyntaxError", "BindError", "InputError",
           "EMPTY", "PARTIAL", "FULL", "__version__"]
