"""The GPU boundary: compile (cached), upload descriptors (cached), validate inputs, launch the forward kernel.

This is the only maskc module that touches CuPy or torch, and it imports them lazily, so ``import maskc``
works on a machine without either. What it asks of a bound mask (``maskc`` binds a mask to sizes)::

    bound.seq_len, bound.kv_len       query and key lengths the mask was bound to
    bound.batch                       B, or 1 when the mask is the same for every batch element
    bound.num_heads                   None when the mask does not depend on the head, else Hq
    bound.descriptor(block_m, block_n) -> kernel_ir.Descriptor
    bound.mask.kernel_spec(head_dim=, dtype=, block_m=, block_n=, num_warps=) -> kernel_ir.KernelSpec

Compiled kernels are cached in memory and as cubins on disk (``$MASKC_CACHE_DIR``, else
``~/.cache/maskc``), keyed by a hash of source, options, NVRTC version and maskc version, so a second
process loads the cubin instead of compiling.
"""
from __future__ import annotations

import hashlib
import math
import os
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from .emit import compile_to_cubin, emit_kernel, nvrtc_version, shared_memory_bytes
from .kernel_ir import Descriptor, KernelSource
from .schedule import choose_tiles

__all__ = ["attention", "cache_dir", "load_kernel", "AttentionInputError"]


class AttentionInputError(ValueError):
    """Inputs that the kernel cannot take (dtype, shape, device, strides, lengths vs the bound mask)."""


def _maskc_version() -> str:
    try:
        import maskc

        v = getattr(maskc, "__version__", None)
        if v:
            return str(v)
    except ImportError:  # pragma: no cover
        pass
    try:
        from importlib.metadata import version

        return version("maskc")
    except Exception:
        return "0+unknown"


def cache_dir() -> Path:
    return Path(os.environ.get("MASKC_CACHE_DIR") or Path.home() / ".cache" / "maskc")


# ---- compiled kernels ----------------------------------------------------------------------------------

@dataclass
class LoadedKernel:
    source: KernelSource
    module: object          # cupy.RawModule (kept alive)
    function: object        # cupy.RawKernel
    shared_bytes: int
    cubin_path: Path
    compiled: bool          # False when the cubin came from the disk cache


_kernels: dict[str, LoadedKernel] = {}


def kernel_key(src: KernelSource) -> str:
    h = hashlib.sha256()
    for part in (src.source, "\0".join(src.options), repr(nvrtc_version()), _maskc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


def load_kernel(src: KernelSource) -> LoadedKernel:
    """The kernel for ``src``: from memory, else the disk cache's cubin, else NVRTC (then written to disk)."""
    key = kernel_key(src)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    import cupy

    path = cache_dir() / f"{src.entry}-{key[:32]}.cubin"
    compiled = False
    if not path.is_file():
        cubin = compile_to_cubin(src)
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(cubin)
        os.replace(tmp, path)   # atomic: a concurrent process sees the old state or the whole file
        compiled = True
    module = cupy.RawModule(path=str(path))
    function = module.get_function(src.entry)
    smem = shared_memory_bytes(src.spec, src.source)
    if smem > 48 * 1024:
        function.max_dynamic_shared_size_bytes = smem
    loaded = LoadedKernel(src, module, function, smem, path, compiled)
    _kernels[key] = loaded
    return loaded


# ---- per-bound-mask device state (descriptor arrays, kernels), dropped with the bound object ------------

_bound_state: dict[int, dict] = {}
_strong_refs: dict[int, object] = {}   # for bound objects that cannot be weakly referenced


def _state_for(bound) -> dict:
    key = id(bound)
    state = _bound_state.get(key)
    if state is None:
        state = {}
        _bound_state[key] = state
        try:
            weakref.finalize(bound, _bound_state.pop, key, None)
        except TypeError:
            _strong_refs[key] = bound   # keep it alive so that its id is not reused
    return state


@dataclass
class DeviceDescriptor:
    descriptor: Descriptor
    run_offsets: object
    runs: object
    work_order: object
    mask_data: object
    mask_offsets: object


def _upload(desc: Descriptor) -> DeviceDescriptor:
    import cupy

    def up(a, min_len=1):
        a = np.ascontiguousarray(a, dtype=np.int32).reshape(-1)
        if a.size < min_len:   # a zero-size allocation has a null pointer; give the kernel something valid
            a = np.zeros(min_len, np.int32)
        return cupy.asarray(a)

    return DeviceDescriptor(desc, up(desc.run_offsets), up(desc.runs), up(desc.work_order),
                            up(desc.mask_data), up(desc.mask_offsets))


def _prepared(bound, head_dim: int, dtype: str, tiles: tuple[int, int, int], device: int):
    """(DeviceDescriptor, LoadedKernel) for this bound mask: the descriptor cached on it, the kernel on
    its compiled mask."""
    block_m, block_n, num_warps = tiles
    state = _state_for(bound)
    dkey = ("descriptor", block_m, block_n, device)
    ddesc = state.get(dkey)
    if ddesc is None:
        desc = bound.descriptor(block_m, block_n)
        if (desc.block_m, desc.block_n) != (block_m, block_n):
            raise RuntimeError(f"bound.descriptor({block_m}, {block_n}) returned tiles {desc.block_m}x{desc.block_n}")
        ddesc = state[dkey] = _upload(desc)
    # The kernel depends on the compiled mask alone, not on lengths or values: a new bind reuses it.
    # (Values of const parameters are compiled in: they are part of the key.)
    mask_state = _state_for(bound.mask)
    kkey = ("kernel", head_dim, dtype, block_m, block_n, num_warps, device, bound.constants)
    kernel = mask_state.get(kkey)
    if kernel is None:
        spec = bound.mask.kernel_spec(head_dim=head_dim, dtype=dtype, block_m=block_m, block_n=block_n,
                                      num_warps=num_warps, constants=bound.constants)
        kernel = mask_state[kkey] = load_kernel(emit_kernel(spec))
    return ddesc, kernel


# ---- inputs --------------------------------------------------------------------------------------------

@dataclass
class _Operand:
    name: str
    obj: object
    framework: str          # "torch" or "cupy"
    dtype: str              # "bf16" or "fp16"
    shape: tuple[int, ...]
    strides: tuple[int, ...]   # in elements
    ptr: int
    device: int


def _operand(x, name: str) -> _Operand:
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
        return _Operand(name, x, "torch", dtypes[x.dtype], tuple(x.shape), tuple(x.stride()), x.data_ptr(),
                        x.device.index if x.device.index is not None else torch.cuda.current_device())
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
        return _Operand(name, x, "cupy", kinds[x.dtype.name], tuple(x.shape),
                        tuple(s // item for s in x.strides), x.data.ptr, x.device.id)
    raise AttentionInputError(f"{name}: expected a torch.Tensor or cupy.ndarray, got {type(x).__name__}")


def _check_layout(op: _Operand) -> None:
    if len(op.shape) != 4:
        raise AttentionInputError(f"{op.name} must be 4-D (B, H, S, D); got shape {op.shape}")
    if op.shape[3] > 1 and op.strides[3] != 1:
        raise AttentionInputError(f"{op.name}: the last dim must be contiguous (stride 1), strides {op.strides}")
    # cp.async moves 16-byte chunks: the base and every row/head/batch step must stay 16-byte aligned
    if op.ptr % 16 or any(s % 8 for s, n in zip(op.strides[:3], op.shape[:3]) if n > 1):
        raise AttentionInputError(f"{op.name}: data pointer and strides {op.strides[:3]} must be multiples of "
                                  f"16 bytes (8 elements); pass a .contiguous() copy")


def _validate(q: _Operand, k: _Operand, v: _Operand, bound) -> None:
    for op in (q, k, v):
        _check_layout(op)
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


# ---- the entry point -----------------------------------------------------------------------------------

def attention(q, k, v, bound, scale: float | None = None, return_lse: bool = False, *, tiles=None):
    """Masked attention forward: softmax(scale * Q K^T + mask) V for the mask ``bound``.

    q: (B, Hq, S, D), k and v: (B, Hkv, Skv, D), torch CUDA tensors or CuPy arrays, bf16 or fp16, any
    strides with the last dim contiguous. Returns O (B, Hq, S, D) in the input's type and dtype, and with
    ``return_lse`` also LSE float32 (B, Hq, S) (natural log; -inf for a row that sees no key, whose O is 0).
    ``tiles`` overrides the schedule's (block_m, block_n, num_warps) (benchmarks).
    """
    qo, ko, vo = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    _validate(qo, ko, vo, bound)
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    if scale is None:
        scale = 1.0 / math.sqrt(D)
    scale = float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale must be a finite positive number, got {scale}")
    try:
        tiles = tuple(tiles) if tiles is not None else choose_tiles(D, qo.dtype)
    except ValueError as exc:
        raise AttentionInputError(str(exc)) from None

    import cupy

    with cupy.cuda.Device(qo.device):
        ddesc, kernel = _prepared(bound, D, qo.dtype, tiles, qo.device)
        desc = ddesc.descriptor
        if (desc.seq_len, desc.kv_len) != (S, Skv) or desc.batch not in (1, B):
            raise RuntimeError(f"descriptor sizes {desc.batch}x{desc.seq_len}x{desc.kv_len} do not match inputs")
        if qo.framework == "torch":
            import torch

            o = torch.empty((B, Hq, S, D), dtype=q.dtype, device=q.device)
            lse = torch.empty((B, Hq, S), dtype=torch.float32, device=q.device) if return_lse else None
            o_ptr, o_strides = o.data_ptr(), o.stride()
            lse_ptr = lse.data_ptr() if lse is not None else 0
            stream = cupy.cuda.ExternalStream(torch.cuda.current_stream(q.device).cuda_stream)
        else:
            o = cupy.empty((B, Hq, S, D), dtype=q.dtype)
            lse = cupy.empty((B, Hq, S), dtype=cupy.float32) if return_lse else None
            o_ptr, o_strides = o.data.ptr, tuple(s // o.itemsize for s in o.strides)
            lse_ptr = lse.data.ptr if lse is not None else 0
            stream = cupy.cuda.get_current_stream()

        n_work = int(desc.work_order.size)
        grid = (n_work * Hq, B if desc.batch == 1 else 1, 1)
        block = (tiles[2] * 32, 1, 1)
        i64, i32 = np.int64, np.int32
        args = (
            np.uint64(qo.ptr), np.uint64(ko.ptr), np.uint64(vo.ptr), np.uint64(o_ptr), np.uint64(lse_ptr),
            *(i64(s) for s in qo.strides[:3]), *(i64(s) for s in ko.strides[:3]),
            *(i64(s) for s in vo.strides[:3]), *(i64(s) for s in o_strides[:3]),
            i32(Hq), i32(Hkv), i32(S), i32(Skv), i32(desc.batch),
            ddesc.run_offsets, ddesc.runs, ddesc.work_order, ddesc.mask_data, ddesc.mask_offsets,
            np.float32(scale * math.log2(math.e)),
        )
        with stream:
            kernel.function(grid, block, args, shared_mem=kernel.shared_bytes)
        if os.environ.get("MASKC_SYNC"):
            stream.synchronize()   # surfaces asynchronous faults at the launch that caused them
    return (o, lse) if return_lse else o
