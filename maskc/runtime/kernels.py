"""The GPU boundary: compile (cached), upload descriptors (cached), validate inputs, launch the forward and
backward kernels.

This is the only maskc module that touches CuPy or torch, and it imports them lazily, so ``import maskc``
works on a machine without either. What it asks of a bound mask (``maskc`` binds a mask to sizes)::

    bound.seq_len, bound.kv_len       query and key lengths the mask was bound to
    bound.batch                       B, or 1 when the mask is the same for every batch element
    bound.num_heads                   None when the mask does not depend on the head, else Hq
    bound.descriptor(block_m, block_n) -> kernel_ir.Descriptor
    bound.kernel_spec(head_dim=, dtype=, block_m=, block_n=, num_warps=) -> kernel_ir.KernelSpec
    bound.backward_spec(head_dim=, dtype=) -> kernel_ir.BackwardSpec

Compiled kernels are cached in memory and as cubins in the disk cache (:mod:`maskc.runtime.cache`, in
``Options.cache_path``), keyed by a hash of source, NVRTC options, NVRTC version and maskc version, so a
second process loads the cubin instead of compiling. Every entry point takes ``options``
(:class:`maskc.options.Options`); without them, those of the environment (``Options.from_environment``).
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import math
import os
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from maskc.codegen.emit import (backward_layout, compile_to_cubin, emit_backward_kernel, emit_kernel, is_ptx,
                                nvrtc_version)
from maskc.codegen.plan import POINTERS, TENSOR_MAPS
from maskc.codegen.schedule import (BackwardTiles, Tiles, arch_for, capability_of, choose_backward_tiles, choose_tiles,
                                    forward_candidates)
from maskc.kernel_ir import BackwardSpec, Descriptor, KernelSource
from maskc.options import Options
from maskc.runtime import autotune, cache
from maskc.runtime.launch import PackedLaunch
from maskc.runtime.tma import tile_map

__all__ = ["attention", "attention_backward", "binary_name", "disk_cache", "load_kernel", "AttentionInputError"]


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


def _resolved(options: Options | None) -> Options:
    """The options of a call: those given, else those of the environment."""
    return Options.from_environment() if options is None else options


def disk_cache(options: Options | None = None) -> cache.DiskCache:
    """The disk cache at ``options.cache_path`` (one object per directory and process)."""
    return cache.at(_resolved(options).cache_path)


# ---- compiled kernels ----------------------------------------------------------------------------------

@dataclass
class LoadedKernel:
    source: KernelSource
    module: object          # cupy.RawModule (kept alive)
    functions: dict         # entry name -> cupy.RawKernel, for every entry of the source
    shared: dict            # entry name -> dynamic shared memory bytes of one CTA
    cubin_path: Path
    compiled: bool          # False when the cubin came from the disk cache

    @property
    def function(self):     # the main entry (the forward source has only that one)
        return self.functions[self.source.entry]

    @property
    def shared_bytes(self) -> int:
        return self.shared[self.source.entry]


def _shared_by_entry(src: KernelSource) -> dict[str, int]:
    if src.spec is None:   # a check kernel: sized at its launch
        return {src.entry: 0}
    if isinstance(src.spec, BackwardSpec):
        layout, spec = backward_layout(src.spec), src.spec
        return {spec.entry_prep: 0, spec.entry_dkdv: layout["dkdv"]["total"],
                spec.entry_dkdv_det: layout["dkdv"]["total"], spec.entry_dq: layout["dq"]["total"],
                spec.entry_dq_convert: 0}
    assert src.plan is not None         # a forward source always has its plan
    return {src.entry: src.plan.shared_bytes}


_kernels: dict[str, LoadedKernel] = {}


def kernel_key(src: KernelSource) -> str:
    """The cache key of ``src``: a hash of its source, NVRTC options, NVRTC's version and maskc's. Include
    directories (``-I``) are left out: they are host paths, and the templates include no header."""
    options = [o for o in src.options if not o.startswith("-I")]
    h = hashlib.sha256()
    for part in (src.source, "\0".join(options), repr(nvrtc_version()), _maskc_version()):
        h.update(part.encode())
        h.update(b"\1")
    return h.hexdigest()


def binary_name(src: KernelSource) -> str:
    """The disk cache's entry for ``src``'s cubin (PTX for a compute_XY target)."""
    return f"{src.entry}-{kernel_key(src)[:32]}.{'ptx' if is_ptx(src) else 'cubin'}"


def load_kernel(src: KernelSource, options: Options | None = None) -> LoadedKernel:
    """The kernel for ``src``: from memory, else the disk cache's cubin (in ``options.cache_path``), else
    NVRTC (then written to disk)."""
    key = kernel_key(src)
    hit = _kernels.get(key)
    if hit is not None:
        return hit
    import cupy

    path, compiled = disk_cache(options).artifact(binary_name(src), lambda: compile_to_cubin(src))
    module = cupy.RawModule(path=str(path))
    shared = _shared_by_entry(src)
    functions = {}
    for entry in src.functions:
        functions[entry] = module.get_function(entry)
        if shared[entry] > 48 * 1024:
            functions[entry].max_dynamic_shared_size_bytes = shared[entry]
    loaded = LoadedKernel(src, module, functions, shared, path, compiled)
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
    """A descriptor's arrays on the GPU (CuPy arrays: untyped)."""

    descriptor: Descriptor
    run_offsets: Any
    runs: Any
    work_order: Any
    mask_data: Any
    mask_offsets: Any


def _device_int32(a, min_len: int = 1):
    import cupy

    a = np.ascontiguousarray(a, dtype=np.int32).reshape(-1)
    if a.size < min_len:   # a zero-size allocation has a null pointer; give the kernel something valid
        a = np.zeros(min_len, np.int32)
    return cupy.asarray(a)


def _upload(desc: Descriptor, transposed: bool = False) -> DeviceDescriptor:
    """The descriptor's row view (forward, deterministic dQ) or, with ``transposed``, its column view
    (the backward's dK/dV kernel) in the same fields: offsets, runs, heaviest-first order."""
    if transposed:
        views = (desc.col_offsets, desc.col_runs, desc.col_work_order)
    else:
        views = (desc.run_offsets, desc.runs, desc.work_order)
    offsets, runs, order = (_device_int32(a) for a in views)
    return DeviceDescriptor(desc, offsets, runs, order, _device_int32(desc.mask_data),
                            _device_int32(desc.mask_offsets))


def _prepared(bound, head_dim: int, dtype: str, tiles: Tiles, device: int, options: Options):
    """(DeviceDescriptor, LoadedKernel) for this bound mask: the descriptor cached on it, the kernel on
    its compiled mask."""
    ddesc = _device_descriptor(bound, tiles.block_m, tiles.block_n, device, options)
    # The kernel depends on the compiled mask, not on lengths or values: a new bind reuses it. (Values of
    # const parameters are compiled in, and the predicate's width follows the binding: both in the key.)
    mask_state = _state_for(bound.mask)
    arch = _arch(device, options)
    kkey = ("kernel", head_dim, dtype, *tiles, device, arch, bound.constants, bound.narrow, options.forward_switches)
    kernel = mask_state.get(kkey)
    if kernel is None:
        spec = bound.kernel_spec(head_dim=head_dim, dtype=dtype, block_m=tiles.block_m, block_n=tiles.block_n,
                                 num_warps=tiles.num_warps, engine=tiles.engine, arch=arch)
        kernel = mask_state[kkey] = load_kernel(emit_kernel(spec, options), options)
    return ddesc, kernel


@functools.lru_cache(maxsize=None)
def _device_capability(device: int) -> tuple[int, int]:
    import cupy

    major, minor = divmod(int(cupy.cuda.Device(device).compute_capability), 10)
    return major, minor


def _arch(device: int, options: Options) -> str:
    """The target kernels are built for on ``device``: ``options.arch`` (for instance compute_80: PTX of the
    portable mma kernels that the driver compiles, to test them on a Hopper), else the device's own
    (maskc.codegen.schedule.arch_for)."""
    return options.arch or arch_for(_device_capability(device))


def _capability(device: int, options: Options) -> tuple[int, int]:
    """The compute capability the schedule plans for: the target's."""
    return capability_of(_arch(device, options))


@functools.lru_cache(maxsize=None)
def _l2_bytes(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["L2CacheSize"])


@functools.lru_cache(maxsize=None)
def _sm_count(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


def _device_descriptor(bound, block_m: int, block_n: int, device: int, options: Options,
                       transposed: bool = False) -> DeviceDescriptor:
    """The bound mask's descriptor for these tiles on ``device``, uploaded once per bound mask; at most
    ``options.max_descriptor_bytes`` (a BindError past it)."""
    state = _state_for(bound)
    dkey = ("descriptor", block_m, block_n, device, transposed)
    ddesc = state.get(dkey)
    if ddesc is None:
        desc = bound.descriptor(block_m, block_n, max_bytes=options.max_descriptor_bytes)
        if (desc.block_m, desc.block_n) != (block_m, block_n):
            raise RuntimeError(f"bound.descriptor({block_m}, {block_n}) returned tiles {desc.block_m}x{desc.block_n}")
        ddesc = state[dkey] = _upload(desc, transposed)
    return ddesc


def _backward_kernel(bound, tiles: BackwardTiles, head_dim: int, dtype: str, device: int,
                     options: Options) -> LoadedKernel:
    mask_state = _state_for(bound.mask)
    arch = _arch(device, options)
    kkey = ("backward", head_dim, dtype, device, arch, bound.constants, bound.narrow, tiles.engine,
            options.dq_reduction)
    kernel = mask_state.get(kkey)
    if kernel is None:
        spec = bound.backward_spec(head_dim=head_dim, dtype=dtype, engine=tiles.engine, arch=arch,
                                   dq_reduction=options.dq_reduction)
        kernel = mask_state[kkey] = load_kernel(emit_backward_kernel(spec), options)
    return kernel


# ---- inputs --------------------------------------------------------------------------------------------

@dataclass
class _Operand:
    name: str
    obj: Any                # the torch tensor or CuPy array
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


# ---- the entry points -----------------------------------------------------------------------------------

def _check_scale(scale, head_dim: int) -> float:
    scale = 1.0 / math.sqrt(head_dim) if scale is None else float(scale)
    if not (math.isfinite(scale) and scale > 0):
        raise AttentionInputError(f"scale must be a finite positive number, got {scale}")
    return scale


class _Outputs:
    """Allocates outputs in the inputs' framework and names the stream (a CUDA handle) the launches go to."""

    def __init__(self, like: _Operand):
        self.framework, self.like = like.framework, like
        if self.framework == "torch":
            import torch

            self.torch = torch
            self.stream = torch.cuda.current_stream(like.obj.device).cuda_stream
        else:
            import cupy

            self.stream = cupy.cuda.get_current_stream().ptr

    def empty(self, shape, fp32: bool = False, zero: bool = False):
        """A new contiguous array: the inputs' 16-bit dtype, or float32; and its data pointer."""
        if self.framework == "torch":
            torch = self.torch
            make = torch.zeros if zero else torch.empty
            x = make(shape, dtype=torch.float32 if fp32 else self.like.obj.dtype, device=self.like.obj.device)
            return x, x.data_ptr()
        import cupy

        make = cupy.zeros if zero else cupy.empty
        x = make(shape, dtype=cupy.float32 if fp32 else self.like.obj.dtype)
        return x, x.data.ptr

    def synchronize_if_asked(self, options: Options) -> None:
        """``options.sync``: wait for the launches, so that an asynchronous fault surfaces at its call."""
        if options.sync:
            import cupy

            cupy.cuda.runtime.streamSynchronize(self.stream)


def _on_device(device: int):
    """A context that makes ``device`` current, or none when it already is (the usual case: cheaper)."""
    import cupy

    return contextlib.nullcontext() if cupy.cuda.runtime.getDevice() == device else cupy.cuda.Device(device)


def _check_pointers(*ops: _Operand) -> None:
    """The per-call part of the layout check (a plan was made for these shapes and strides)."""
    for op in ops:
        if op.ptr % 16:
            raise AttentionInputError(f"{op.name}: data pointer {op.ptr:#x} is not 16-byte aligned; pass a "
                                      ".contiguous() copy")


def _operand_key(*ops: _Operand) -> tuple:
    return tuple((op.framework, op.dtype, op.shape, op.strides, op.device) for op in ops)


@dataclass
class _ForwardCall:
    """Everything about a forward call but its data: made once per bound mask and input layout."""
    launch: PackedLaunch    # data pointers (and tensor maps) rewritten per call
    out_shape: tuple
    lse_shape: tuple
    tensor_maps: tuple | None   # (rows per box) of q, k, v when the kernel takes tensor maps, else None
    slots: dict                 # kernel parameter name -> its position (maskc.codegen.plan), for per-call arguments
    schedules: dict = field(default_factory=dict)   # stream -> the persistent kernel's work counter (int32[2])

    def schedule(self, stream: int) -> int:
        """The device address of this stream's work counter: launches on one stream run one after the other,
        and each resets its counter when it is done, so the next finds it at zero."""
        counter = self.schedules.get(stream)
        if counter is None:
            import cupy

            counter = self.schedules[stream] = cupy.zeros(2, np.int32)
            cupy.cuda.get_current_stream().synchronize()   # zeroed before any stream's kernel reads it
        return counter.data.ptr


def _l2_heads(ko: _Operand, mask_batch: int, pairs: int, device: int) -> int:
    """How many (batch, head) pairs' K and V fit in most of the L2 at once, a power of two (at least 1, at
    most ``pairs``): the persistent kernel takes work items section by section of that many pairs."""
    _, Hkv, Skv, D = ko.shape
    group = max(1, pairs // max(1, Hkv))            # query heads that read one kv head
    bytes_per_pair = 2 * Skv * D * 2 * mask_batch / group
    budget = 0.8 * _l2_bytes(device)
    fit = max(1, int(budget // max(1.0, bytes_per_pair)))
    return max(1, min(pairs, 1 << (fit.bit_length() - 1)))


def attention(q, k, v, bound, scale: float | None = None, return_lse: bool = False, *,
              options: Options | None = None):
    """Masked attention forward: softmax(scale * Q K^T + mask) V for the mask ``bound``.

    q: (B, Hq, S, D), k and v: (B, Hkv, Skv, D), torch CUDA tensors or CuPy arrays, bf16 or fp16, any
    strides with the last dim contiguous. Returns O (B, Hq, S, D) in the input's type and dtype, and with
    ``return_lse`` also LSE float32 (B, Hq, S) (natural log; -inf for a row that sees no key, whose O is 0).
    ``options`` (default: the environment's): ``tiles`` overrides the schedule's (block_m, block_n,
    num_warps[, engine]) (benchmarks; engine "mma" when not given), ``engine`` its engine; ``autotune``
    times the candidates on these inputs the first time and reuses the fastest (maskc.runtime.autotune).
    """
    options = _resolved(options)
    qo, ko, vo = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    # Everything the plan depends on besides the bound mask (whose state holds the plans).
    key = ("forward", _operand_key(qo, ko, vo), scale, bool(return_lse), options)
    state = _state_for(bound)
    call = state.get(key)
    if call is None:
        call = state[key] = _forward_call(q, k, v, qo, ko, vo, bound, scale, options)
    _check_pointers(qo, ko, vo)
    with _on_device(qo.device):
        outs = _Outputs(qo)
        o, o_ptr = outs.empty(call.out_shape)
        lse, lse_ptr = outs.empty(call.lse_shape, fp32=True) if return_lse else (None, 0)
        index = call.slots.__getitem__
        maps: list = []
        pointers = [(index(n), ptr) for n, ptr in zip(POINTERS, (qo.ptr, ko.ptr, vo.ptr, o_ptr, lse_ptr))]
        if call.tensor_maps is not None:
            maps = [(index(name), tile_map(op.ptr, op.shape, op.strides, rows))
                    for name, op, rows in zip(TENSOR_MAPS, (qo, ko, vo), call.tensor_maps)]
            pointers.append((index("schedule"), call.schedule(outs.stream)))
        call.launch(outs.stream, pointers, maps)
        outs.synchronize_if_asked(options)
    return (o, lse) if return_lse else o


def _forward_call(q, k, v, qo: _Operand, ko: _Operand, vo: _Operand, bound, scale, options: Options) -> _ForwardCall:
    """Validate the inputs' layout against the bound mask, choose (or tune) the tiles, compile or fetch the
    kernel, upload the descriptor, and pack the launch's arguments (data pointers left 0)."""
    _validate(qo, ko, vo, bound)
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    scale = _check_scale(scale, D)
    tiles = options.tiles
    if options.autotune:
        tiles = _tuned_tiles(q, k, v, qo, bound, scale, options)
    if tiles is None:
        try:
            tiles = choose_tiles(D, qo.dtype, _capability(qo.device, options), engine=options.engine,
                                 table_regions=bound.mask.table_regions)
        except ValueError as exc:
            raise AttentionInputError(f"tiles: {exc}") from None

    with _on_device(qo.device):
        ddesc, kernel = _prepared(bound, D, qo.dtype, tiles, qo.device, options)
        desc, plan = ddesc.descriptor, kernel.source.plan
        if (desc.seq_len, desc.kv_len) != (S, Skv) or desc.batch not in (1, B):
            raise RuntimeError(f"descriptor sizes {desc.batch}x{desc.seq_len}x{desc.kv_len} do not match inputs")
        n_work = int(desc.work_order.size)
        batch_grid = B if desc.batch == 1 else 1
        i64, i32, u64 = np.int64, np.int32, np.uint64
        values = {name: u64(0) for name in POINTERS}          # set per call
        for prefix, op in (("q", qo), ("k", ko), ("v", vo)):
            values.update({f"{prefix}_s{axis}": i64(s) for axis, s in zip("bhs", op.strides[:3])})
        values.update({f"o_s{axis}": i64(s) for axis, s in zip("bhs", (Hq * S * D, S * D, D))})
        values.update(num_heads=i32(Hq), num_kv_heads=i32(Hkv), seq_len=i32(S), kv_len=i32(Skv),
                      mask_batch=i32(desc.batch), run_offsets=ddesc.run_offsets, runs=ddesc.runs,
                      work_order=ddesc.work_order, mask_data=ddesc.mask_data, mask_offsets=ddesc.mask_offsets,
                      scale_log2=np.float32(scale * math.log2(math.e)))
        grid = (n_work * Hq, batch_grid, 1)
        tensor_maps = None
        if "q_map" in {p.name for p in plan.params}:
            # the warp-specialized kernel: tensor maps (set per call: they hold the data pointers), a
            # persistent grid of one CTA per SM taking work items from a counter (one per stream, set per
            # call), and the number of heads whose K and V share L2 (the item order's sections)
            pairs = Hq * batch_grid
            tensor_maps = (plan.spec.block_m, plan.spec.block_n, plan.spec.block_n)
            for name, op, rows in zip(TENSOR_MAPS, (qo, ko, vo), tensor_maps):
                values[name] = tile_map(op.ptr, op.shape, op.strides, rows)
            values.update(batch_grid=i32(batch_grid), n_work=i32(n_work),
                          l2_heads=i32(_l2_heads(ko, desc.batch, pairs, qo.device)), schedule=u64(0))
            grid = (min(n_work * pairs, _sm_count(qo.device)), 1, 1)
        args = tuple(values[p.name] for p in plan.params)
        packed = PackedLaunch(kernel.function, args, grid, (plan.threads, 1, 1), kernel.shared_bytes)
    slots = {p.name: i for i, p in enumerate(plan.params)}
    return _ForwardCall(packed, (B, Hq, S, D), (B, Hq, S), tensor_maps, slots)


def _tuned_tiles(q, k, v, qo: _Operand, bound, scale: float, options: Options) -> Tiles:
    """The autotuner's choice for these inputs' key: from its cache, else measured now on these inputs."""
    import cupy

    D = qo.shape[3]
    # Once per bound mask and shape: the key renders the predicate, too slow to redo on every call.
    state = _state_for(bound)
    disk = disk_cache(options)
    memo = ("tuned", D, qo.dtype, qo.device, str(disk.root))
    if memo in state:
        return state[memo]
    gpu = cupy.cuda.runtime.getDeviceProperties(qo.device)["name"]
    gpu = gpu.decode() if isinstance(gpu, bytes) else str(gpu)
    key = autotune.tuning_key(bound, D, qo.dtype, gpu)
    tuned = autotune.cache_for(disk)
    chosen = tuned.get(key)
    if chosen is not None:
        state[memo] = chosen
        return chosen
    device = cupy.cuda.Device(qo.device)

    def run(tiles):
        return attention(q, k, v, bound, scale, options=options.replace(autotune=False, tiles=tiles))

    def agrees(out, ref) -> bool:
        if qo.framework == "torch":
            a, b = out.float(), ref.float()
            return bool((a - b).norm() <= autotune.AGREEMENT * b.norm())
        a, b = out.astype(cupy.float32), ref.astype(cupy.float32)
        return bool(cupy.linalg.norm(a - b) <= autotune.AGREEMENT * cupy.linalg.norm(b))

    def measure(tiles, reps: int = 10) -> float:
        run(tiles)
        device.synchronize()
        start = time.perf_counter()
        for _ in range(reps):
            run(tiles)
        device.synchronize()
        return (time.perf_counter() - start) * 1e3 / reps

    candidates = forward_candidates(D, qo.dtype, _capability(qo.device, options))
    chosen, report = autotune.pick(candidates, run, agrees, measure)
    tuned.put(key, chosen, report)
    state[memo] = chosen
    return chosen


def _float32_rows(x, name: str, like: _Operand, shape: tuple[int, ...]) -> int:
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


def attention_backward(dout, q, k, v, out, lse, bound, scale: float | None = None, dlse=None,
                       deterministic: bool = False, *, options: Options | None = None):
    """Gradients of :func:`attention`: (dQ, dK, dV) for the output gradient ``dout``.

    ``out`` and ``lse`` are the forward's O and LSE (``return_lse=True``); ``dlse`` is an optional gradient
    of LSE (B, Hq, S) float32. dK and dV are summed over each GQA group. ``deterministic`` computes dQ with
    its own query-major kernel instead of fp32 atomics: bitwise repeatable, somewhat slower. Head dims 64
    and 128. ``options`` (default: the environment's): the dK/dV engine, its dQ reduction, the target.
    Returns arrays of the inputs' type and dtype, contiguous.
    """
    options = _resolved(options)
    qo, ko, vo = _operand(q, "q"), _operand(k, "k"), _operand(v, "v")
    oo, do = _operand(out, "out"), _operand(dout, "dout")
    key = ("backward", _operand_key(qo, ko, vo, oo, do), scale, bool(deterministic), options)
    state = _state_for(bound)
    plan = state.get(key)
    if plan is None:
        plan = state[key] = _backward_plan(qo, ko, vo, oo, do, bound, scale, deterministic, options)
    _check_pointers(qo, ko, vo, oo, do)
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    lse_ptr = _float32_rows(lse, "lse", qo, (B, Hq, S))
    dlse_ptr = _float32_rows(dlse, "dlse", qo, (B, Hq, S)) if dlse is not None else 0

    with _on_device(qo.device):
        outs = _Outputs(qo)
        dq, dq_ptr = outs.empty((B, Hq, S, D))
        dk, dk_ptr = outs.empty((B, Hkv, Skv, D))
        dv, dv_ptr = outs.empty((B, Hkv, Skv, D))
        lse_log2, lse_log2_ptr = outs.empty((B, Hq, S), fp32=True)
        delta, delta_ptr = outs.empty((B, Hq, S), fp32=True)
        # rows padded to the 64-row query blocks the bulk_tile reduction lays the buffer out in
        dq_accum, dq_accum_ptr = (None, 0) if deterministic else outs.empty((B, Hq, -(-S // 64) * 64, D), fp32=True,
                                                                            zero=True)
        pointers = {"q": qo.ptr, "k": ko.ptr, "v": vo.ptr, "out": oo.ptr, "dout": do.ptr, "lse": lse_ptr,
                    "dlse": dlse_ptr, "lse_log2": lse_log2_ptr, "delta": delta_ptr, "dq": dq_ptr, "dk": dk_ptr,
                    "dv": dv_ptr, "dq_accum": dq_accum_ptr}
        for launch, slots in plan:
            launch(outs.stream, [(index, pointers[name]) for index, name in slots])
        outs.synchronize_if_asked(options)
        del dq_accum, lse_log2, delta   # the stream orders their reuse (torch and CuPy pools are stream-aware)
    return dq, dk, dv


def _backward_plan(qo: _Operand, ko: _Operand, vo: _Operand, oo: _Operand, do: _Operand, bound, scale,
                   deterministic: bool, options: Options) -> list:
    """Validate, compile or fetch the backward kernels, upload the descriptor's views, and pack the three
    launches: [(PackedLaunch, ((argument index, pointer name), ...) set per call), ...] in launch order."""
    _validate(qo, ko, vo, bound)
    for op in (oo, do):
        _check_layout(op)
        if op.shape != qo.shape or op.dtype != qo.dtype or op.framework != qo.framework or op.device != qo.device:
            raise AttentionInputError(f"{op.name} must match q: shape {qo.shape}, dtype {qo.dtype}, same device "
                                      f"and framework; got {op.shape}, {op.dtype}")
    B, Hq, S, D = qo.shape
    Hkv, Skv = ko.shape[1], ko.shape[2]
    scale = _check_scale(scale, D)
    try:
        tiles = choose_backward_tiles(D, qo.dtype, _capability(qo.device, options), engine=options.backward_engine)
    except ValueError as exc:
        raise AttentionInputError(str(exc)) from None
    block_m, block_n, dq_block_n = tiles.block_m, tiles.block_n, tiles.dq_block_n

    with _on_device(qo.device):
        kernel = _backward_kernel(bound, tiles, D, qo.dtype, qo.device, options)
        spec = kernel.source.spec
        assert isinstance(spec, BackwardSpec)
        cols = _device_descriptor(bound, block_m, block_n, qo.device, options, transposed=True)
        mask_batch = cols.descriptor.batch
        i64, i32, u64, f32 = np.int64, np.int32, np.uint64, np.float32
        strides = lambda op: tuple(i64(s) for s in op.strides[:3])   # noqa: E731
        batch_grid = B if mask_batch == 1 else 1
        rows = B * Hq * S
        fns = kernel.functions
        scales = (f32(scale), f32(scale * math.log2(math.e)))
        common = (*strides(qo), *strides(ko), *strides(vo), *strides(do), i32(Hq), i32(Hkv), i32(S), i32(Skv),
                  i32(mask_batch))

        def packed(entry, names, rest, grid, block):   # a kernel whose pointer arguments come first
            args = tuple(u64(0) for _ in names) + rest
            return PackedLaunch(fns[entry], args, grid, block, kernel.shared[entry]), tuple(enumerate(names))

        # prep: out, dout, lse, dlse, the strides of out and dout, then lse_log2 and delta
        prep = PackedLaunch(fns[spec.entry_prep], (
            u64(0), u64(0), u64(0), u64(0), *strides(oo), *strides(do), u64(0), u64(0), i32(Hq), i32(S), i64(rows)),
            ((rows + 7) // 8, 1, 1), (256, 1, 1), 0)
        plan = [(prep, ((0, "out"), (1, "dout"), (2, "lse"), (3, "dlse"), (10, "lse_log2"), (11, "delta")))]
        entry = spec.entry_dkdv_det if deterministic else spec.entry_dkdv
        plan.append(packed(entry, ("q", "k", "v", "dout", "lse_log2", "delta", "dk", "dv", "dq_accum"), (
            *common, cols.run_offsets, cols.runs, cols.work_order, cols.mask_data, cols.mask_offsets, *scales),
            (int(cols.work_order.size) * Hkv, batch_grid, 1), (block_n // 16 * 32, 1, 1)))
        if deterministic:
            rows_view = _device_descriptor(bound, block_m, dq_block_n, qo.device, options)
            plan.append(packed(spec.entry_dq, ("q", "k", "v", "dout", "lse_log2", "delta", "dq"), (
                *common, rows_view.run_offsets, rows_view.runs, rows_view.work_order, rows_view.mask_data,
                rows_view.mask_offsets, *scales), (int(rows_view.work_order.size) * Hq, batch_grid, 1),
                (block_m // 16 * 32, 1, 1)))
        else:
            n = B * Hq * S * D
            plan.append(packed(spec.entry_dq_convert, ("dq_accum", "dq"), (f32(scale), i64(n), i32(S)),
                               ((n // 2 + 255) // 256, 1, 1), (256, 1, 1)))
    return plan
