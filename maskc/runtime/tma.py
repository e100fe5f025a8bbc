"""Tensor maps for the copy engine (TMA) of Hopper GPUs, built on the host for the ``wgmma_tma`` kernel.

A tensor map (the driver's 128-byte ``CUtensorMap``) tells the copy engine the shape and strides of a
tensor in global memory and the box one copy brings into shared memory. The kernel takes one per operand
(q, k, v) by value. They are made with the driver's ``cuTensorMapEncodeTiled`` through ctypes (the driver
library is loaded wherever CuPy runs a kernel; no extra package), and cached per (pointer, shape, strides)
since a training step calls attention on the same buffers again and again.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

TENSOR_MAP_BYTES = 128
BOX_COLUMNS = 64        # 64 16-bit elements = 128 bytes, the widest box the 128-byte swizzle allows

# CUtensorMap* enums (cuda.h)
_DATA_TYPE_UINT16 = 1   # a 16-bit copy: bf16 and fp16 alike
_INTERLEAVE_NONE = 0
_SWIZZLE_128B = 3
_L2_PROMOTION_256B = 3
_OOB_FILL_ZEROS = 0


class TensorMapError(RuntimeError):
    """The driver refused to encode a tensor map (layout it cannot describe, or no driver)."""


@functools.lru_cache(maxsize=1)
def _encode_tiled():
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise TensorMapError(f"no CUDA driver library: {exc}") from None
    fn = lib.cuTensorMapEncodeTiled
    u32p, u64p = ctypes.POINTER(ctypes.c_uint32), ctypes.POINTER(ctypes.c_uint64)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_void_p, u64p, u64p, u32p, u32p,
                   ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


def map_geometry(shape: tuple[int, int, int, int], strides: tuple[int, int, int, int], box_rows: int):
    """(dims, byte strides, box) of the 4-D map over a (B, H, S, D) 16-bit tensor with element ``strides``,
    innermost first as the driver wants them: dims (D, S, H, B), strides of S, H, B in bytes, box
    (64, box_rows, 1, 1). A dim of extent 1 is never stepped over: its stride is replaced by the compact one
    (the inner dim's stride times its extent), which the driver always accepts."""
    B, H, S, D = shape
    if strides[3] != 1 and D > 1:
        raise TensorMapError(f"the last dim must be contiguous, strides {strides}")
    if D % BOX_COLUMNS:
        raise TensorMapError(f"head dim {D} is not a multiple of {BOX_COLUMNS}")
    step, span = [], 2 * D          # span: the bytes one step of the next dim would cover if compact
    for extent, stride in ((S, strides[2]), (H, strides[1]), (B, strides[0])):
        nbytes = 2 * stride if extent > 1 else span
        if nbytes <= 0 or nbytes % 16 or nbytes >= 1 << 40:
            raise TensorMapError(f"stride {stride} elements cannot be described (multiple of 8, positive)")
        step.append(nbytes)
        span = nbytes * extent
    return (D, S, H, B), tuple(step), (BOX_COLUMNS, box_rows, 1, 1)


@functools.lru_cache(maxsize=512)
def tile_map(ptr: int, shape: tuple[int, int, int, int], strides: tuple[int, int, int, int], box_rows: int):
    """The tensor map (a one-element array of a 128-byte void type: CuPy passes a numpy array of size one by
    value, and this one stays alive in the cache while kernels use it) of the (B, H, S, D) tensor at
    device address ``ptr``: boxes of 64 columns x ``box_rows`` rows, 128-byte swizzle, rows past S read as 0."""
    if ptr % 16:
        raise TensorMapError(f"device address {ptr:#x} is not 16-byte aligned")
    dims, step, box = map_geometry(shape, strides, box_rows)
    storage = np.zeros(TENSOR_MAP_BYTES + 64, np.uint8)       # the driver wants a 64-byte aligned map
    offset = -storage.ctypes.data % 64
    out = storage[offset:offset + TENSOR_MAP_BYTES]
    status = _encode_tiled()(
        out.ctypes.data, _DATA_TYPE_UINT16, 4, ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * 4)(*dims), (ctypes.c_uint64 * 3)(*step), (ctypes.c_uint32 * 4)(*box),
        (ctypes.c_uint32 * 4)(1, 1, 1, 1), _INTERLEAVE_NONE, _SWIZZLE_128B, _L2_PROMOTION_256B, _OOB_FILL_ZEROS)
    if status != 0:
        raise TensorMapError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for dims {dims}, byte strides "
                             f"{step}, box {box}")
    return out.view(np.dtype((np.void, TENSOR_MAP_BYTES)))   # shape (1,): CuPy passes it by value


def expected_box(x: np.ndarray, col: int, row: int, head: int, batch: int, box_rows: int) -> np.ndarray:
    """The 16-bit elements a box of ``tile_map`` over the (B, H, S, D) array ``x`` holds in shared memory,
    in order: rows of 128 bytes in which 16-byte chunk c of row r sits at chunk c ^ (r % 8) (the 128-byte
    swizzle), rows past S as zeros."""
    rows = x[batch, head, row:row + box_rows, col:col + BOX_COLUMNS]
    box = np.zeros((box_rows, BOX_COLUMNS), x.dtype)
    box[:rows.shape[0]] = rows
    chunks = box.reshape(box_rows, 8, 8)                     # (row, 16-byte chunk, element)
    out = np.empty_like(chunks)
    for r in range(box_rows):
        out[r, np.arange(8) ^ (r % 8)] = chunks[r]
    return out.reshape(-1)


def check_copy_engine(device: int = 0) -> list[str]:
    """Run the copy-engine check kernel (emit.emit_tma_check) on ``device`` for a few boxes of a strided,
    ragged (B, H, S, D) tensor, and compare what landed in shared memory with ``expected_box``. Returns
    the failures, one line each (empty: the tensor maps, their passing as kernel arguments, the mbarrier
    and the 128-byte swizzle all work as the wgmma_tma kernel assumes). Needs CuPy and a Hopper GPU."""
    import cupy

    from maskc.codegen.emit import emit_tma_check
    from maskc.runtime.loader import load_kernel

    failures = []
    with cupy.cuda.Device(device):
        function = load_kernel(emit_tma_check()).function
        rng = np.random.default_rng(0)
        # a (B, S, H, D) buffer viewed as (B, H, S, D), and a plain (1, 1, S, D) one (unit dims)
        tensors = {"strided": (rng.integers(0, 0xFFFF, size=(2, 300, 3, 128), dtype=np.uint16), (0, 2, 1, 3)),
                   "plain": (rng.integers(0, 0xFFFF, size=(1, 1, 1000, 64), dtype=np.uint16), (0, 1, 2, 3))}
        cases = [("strided", 0, 0, 0, 0, 128), ("strided", 64, 256, 2, 1, 64), ("strided", 64, 200, 1, 0, 128),
                 ("plain", 0, 896, 0, 0, 128), ("plain", 0, 64, 0, 0, 64)]
        for name, col, row, head, batch, box_rows in cases:
            storage, axes = tensors[name]
            host, x = storage.transpose(axes), cupy.asarray(storage).transpose(axes)
            strides = tuple(s // 2 for s in x.strides)
            tmap = tile_map(x.data.ptr, tuple(x.shape), strides, box_rows)
            box_bytes = box_rows * BOX_COLUMNS * 2
            out = cupy.zeros(box_bytes // 2, cupy.uint16)
            function((1,), (128,), (tmap, out, np.int32(col), np.int32(row), np.int32(head), np.int32(batch),
                                    np.int32(box_bytes)), shared_mem=box_bytes + 1024)
            cupy.cuda.Device(device).synchronize()
            got, want = out.get(), expected_box(host, col, row, head, batch, box_rows)
            bad = np.flatnonzero(got != want)
            if bad.size:
                failures.append(f"{name} box col={col} row={row} head={head} batch={batch} rows={box_rows}: {bad.size} of "
                                f"{want.size} elements differ (first at {bad[0]}: got {got[bad[0]]:#06x}, "
                                f"want {want[bad[0]]:#06x})")
    return failures
