"""The arrays a kernel is called with: checked (dtype, shape, strides, device, alignment, lengths against the
bound mask) and described once per call, and the outputs allocated in the inputs' framework (torch or CuPy)
on their stream. Every refusal is an :class:`AttentionInputError` that names the argument.
"""
from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass
from typing import Any

from maskc.options import Options


class AttentionInputError(ValueError):
    """Inputs that the kernel cannot take (dtype, shape, device, strides, lengths vs the bound mask)."""


@dataclass
class Operand:
    name: str
    obj: Any                # the torch tensor or CuPy array
    framework: str          # "torch" or "cupy"
    dtype: str              # "bf16" or "fp16"
    shape: tuple[int, ...]
    strides: tuple[int, ...]   # in elements
    ptr: int
    device: int


def operand(x, name: str) -> Operand:
    mod = type(x).__module__
    if mod.startswith("torch"):
        import torch

        if not isinstance(x, torch.Tensor):
            raise AttentionInputError(f"{name}: expected a torch.Tensor or cupy.ndarray, got {type(x).__name__}")
        if not x.is_cuda:
            raise AttentionInputError(f"{name} is on {x.device}; maskc needs CUDA tensors")
        dtypes = {torch.bfloat16: "bf16", torch.float16: "fp16"}
        if x.dtype not in dtypes:
            raise AttentionInputError(f"{name} has dtype {x.dtype}; supported: torch.bfloat16, torch.float16")
        return Operand(name, x, "torch", dtypes[x.dtype], tuple(x.shape), tuple(x.stride()), x.data_ptr(),
                       x.get_device())
    if mod.startswith("cupy"):
        import cupy

        if not isinstance(x, cupy.ndarray):
            raise AttentionInputError(f"{name}: expected a torch.Tensor or cupy.ndarray, got {type(x).__name__}")
        kinds = {"bfloat16": "bf16", "float16": "fp16"}
        if x.dtype.name not in kinds:
            raise AttentionInputError(f"{name} has dtype {x.dtype}; supported: bfloat16, float16")
        item = x.dtype.itemsize
        if any(s % item for s in x.strides):
            raise AttentionInputError(f"{name}: strides {x.strides} are not whole elements")
        return Operand(name, x, "cupy", kinds[x.dtype.name], tuple(x.shape),
                        tuple(s // item for s in x.strides), x.data.ptr, x.device.id)
    raise AttentionInputError(f"{name}: expected a torch.Tensor or cupy.ndarray, got {type(x).__name__}")


def check_layout(op: Operand) -> None:
    if len(op.shape) != 4:
        raise AttentionInputError(f"{op.name} must be 4-D (B, H, S, D); got shape {op.shape}")
    if op.shape[3] > 1 and op.strides[3] != 1:
        raise AttentionInputError(f"{op.name}: the last dim must be contiguous (stride 1), strides {op.strides}")
    # cp.async moves 16-byte chunks: the base and every row/head/batch step must stay 16-byte aligned
    if op.ptr % 16 or any(s % 8 for s, n in zip(op.strides[:3], op.shape[:3]) if n > 1):
        raise AttentionInputError(f"{op.name}: data pointer and strides {op.strides[:3]} must be multiples of "
                                  f"16 bytes (8 elements); pass a .contiguous() copy")


def validate(q: Operand, k: Operand, v: Operand, bound) -> None:
    for op in (q, k, v):
        check_layout(op)
    if len({q.framework, k.framework, v.framework}) != 1:
        raise AttentionInputError("q, k and v must all be torch tensors or all CuPy arrays")
    if len({q.dtype, k.dtype, v.dtype}) != 1:
        raise AttentionInputError(f"q, k, v dtypes differ: {q.dtype}, {k.dtype}, {v.dtype}")
    if len({q.device, k.device, v.device}) != 1:
        raise AttentionInputError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    B, Hq, S, D = q.shape
    if k.shape != v.shape:
        raise AttentionInputError(f"k and v shapes differ: {k.shape} vs {v.shape}")
    Bk, Hkv, Skv, Dk = k.shape
    if Bk != B:
        raise AttentionInputError(f"batch sizes differ: q has {B}, k/v have {Bk}")
    if Dk != D:
        raise AttentionInputError(f"head dims differ: q has {D}, k/v have {Dk}")
    if Hkv == 0 or Hq % Hkv:
        raise AttentionInputError(f"query heads ({Hq}) must be a multiple of kv heads ({Hkv})")
    if S != bound.seq_len:
        raise AttentionInputError(f"q has {S} rows but the mask was bound to seq_len={bound.seq_len}")
    if Skv != bound.kv_len:
        raise AttentionInputError(f"k/v have {Skv} rows but the mask was bound to kv_len={bound.kv_len}")
    if bound.batch not in (1, B):
        raise AttentionInputError(f"the mask was bound to batch={bound.batch}; inputs have batch {B}")
    if bound.num_heads is not None and bound.num_heads != Hq:
        raise AttentionInputError(f"the mask was bound to num_heads={bound.num_heads}; q has {Hq} heads")
    if B == 0 or Hq == 0 or S == 0 or Skv == 0:
        raise AttentionInputError(f"empty inputs: q {q.shape}, k {k.shape}")


def check_scale(scale, head_dim: int) -> float:
    """The softmax scale: 1/sqrt(head_dim) by default, else a finite positive number (a bool, a string, nan or a
    negative one is refused naming what it got, on the CPU path as on the GPU's)."""
    if scale is None:
        return 1.0 / math.sqrt(head_dim)
    try:
        value = float(scale) if not isinstance(scale, (bool, str, bytes)) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise AttentionInputError(f"scale must be a finite positive number, got {scale!r}")
    return value


class Outputs:
    """Allocates outputs in the inputs' framework and names the stream (a CUDA handle) the launches go to."""

    def __init__(self, like: Operand):
        self.framework, self.like = like.framework, like
        if self.framework == "torch":
            import torch

            self.torch = torch
            self.stream = _torch_stream(like.device)
        else:
            import cupy

            self.stream = cupy.cuda.get_current_stream().ptr

    def empty(self, shape, fp32: bool = False, int32: bool = False):
        """A new contiguous array, not initialised: the inputs' 16-bit dtype, or float32, or int32; and its data
        pointer."""
        if self.framework == "torch":
            torch = self.torch
            dtype = torch.int32 if int32 else torch.float32 if fp32 else self.like.obj.dtype
            x = torch.empty(shape, dtype=dtype, device=self.like.obj.device)
            return x, x.data_ptr()
        import cupy

        x = cupy.empty(shape, dtype=cupy.int32 if int32 else cupy.float32 if fp32 else self.like.obj.dtype)
        return x, x.data.ptr

    def synchronize_if_asked(self, options: Options) -> None:
        """``options.sync``: wait for the launches, so that an asynchronous fault surfaces at its call."""
        if options.sync:
            import cupy

            cupy.cuda.runtime.streamSynchronize(self.stream)


def _torch_stream(device: int) -> int:
    """The handle of torch's current stream on ``device``: through the binding torch.compile's generated code uses,
    where it is, rather than ``torch.cuda.current_stream``, which builds a Stream object on every call."""
    import torch

    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device) if raw is not None else torch.cuda.current_stream(device).cuda_stream


def on_device(device: int):
    """A context that makes ``device`` current, or none when it already is (the usual case: cheaper). The launches
    go through the driver API, which needs a current CUDA context on the calling thread: a thread that has not used
    CUDA's runtime yet has none (torch's autograd engine runs a backward in a thread of its own, where allocating
    uninitialised outputs launches nothing), so the device's primary context is made current there first."""
    import cupy
    from cupy.cuda import driver, runtime

    if driver.ctxGetCurrent() == 0:
        runtime.setDevice(device)           # binds the device's primary context to this thread
        return contextlib.nullcontext()
    return contextlib.nullcontext() if runtime.getDevice() == device else cupy.cuda.Device(device)


def check_pointers(*ops: Operand) -> None:
    """The per-call part of the layout check (a plan was made for these shapes and strides)."""
    for op in ops:
        if op.ptr % 16:
            raise AttentionInputError(f"{op.name}: data pointer {op.ptr:#x} is not 16-byte aligned; pass a "
                                      ".contiguous() copy")


def operand_key(*ops: Operand) -> tuple:
    return tuple((op.framework, op.dtype, op.shape, op.strides, op.device) for op in ops)


def float32_rows(x, name: str, like: Operand, shape: tuple[int, ...]) -> int:
    """Data pointer of a contiguous float32 array of ``shape`` in like's framework and device (LSE, dLSE)."""
    if like.framework == "torch":
        import torch

        ok = isinstance(x, torch.Tensor) and x.dtype == torch.float32 and x.is_cuda and x.is_contiguous()
        ok = ok and x.device.index == like.device
        ptr = x.data_ptr() if ok else 0
    else:
        import cupy

        ok = isinstance(x, cupy.ndarray) and x.dtype == cupy.float32 and x.flags.c_contiguous
        ok = ok and x.device.id == like.device
        ptr = x.data.ptr if ok else 0
    if not ok:
        raise AttentionInputError(f"{name} must be a contiguous float32 array on the inputs' device")
    if tuple(x.shape) != shape:
        raise AttentionInputError(f"{name} has shape {tuple(x.shape)}; expected {shape}")
    return ptr
