"""Device state per bound mask (its descriptor's arrays uploaded once per tile shape and device, its kernels),
dropped with the bound object; and what the runtime asks of a device (capability, target architecture, L2
size, SM count), each read once per process.
"""
from __future__ import annotations

import functools
import weakref
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from maskc.codegen.emit import emit_backward_kernel, emit_kernel
from maskc.codegen.plan import TILE_WORDS_PARAMS, stored_bytes
from maskc.codegen.schedule import BackwardTiles, Tiles, arch_for, capability_of
from maskc.kernel_ir import AUTO_STORED, BackwardSpec, Descriptor, KernelSpec
from maskc.options import Options
from maskc.runtime.loader import LoadedKernel, load_kernel

if TYPE_CHECKING:
    from maskc.runtime.device_builder import DeviceShape


_bound_state: dict[int, dict] = {}
_strong_refs: dict[int, object] = {}   # for bound objects that cannot be weakly referenced


def state_for(bound) -> dict:
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
    """A descriptor's arrays on the GPU (CuPy arrays: untyped); ``descriptor`` the host Descriptor, or for a mask
    bound on the device its sizes (maskc.runtime.device_builder.DeviceShape)."""

    descriptor: "Descriptor | DeviceShape"
    run_offsets: Any
    runs: Any
    work_order: Any
    mask_data: Any
    mask_offsets: Any


def device_int32(a, min_len: int = 1):
    import cupy

    a = np.ascontiguousarray(a, dtype=np.int32).reshape(-1)
    if a.size < min_len:   # a zero-size allocation has a null pointer; give the kernel something valid
        a = np.zeros(min_len, np.int32)
    return cupy.asarray(a)


def upload(desc: Descriptor, transposed: bool = False) -> DeviceDescriptor:
    """The descriptor's row view (forward, deterministic dQ) or, with ``transposed``, its column view
    (the backward's dK/dV kernel) in the same fields: offsets, runs, heaviest-first order."""
    if transposed:
        views = (desc.col_offsets, desc.col_runs, desc.col_work_order)
    else:
        views = (desc.run_offsets, desc.runs, desc.work_order)
    offsets, runs, order = (device_int32(a) for a in views)
    return DeviceDescriptor(desc, offsets, runs, order, device_int32(desc.mask_data),
                            device_int32(desc.mask_offsets))


def prepared(bound, head_dim: int, dtype: str, tiles: Tiles, device: int, options: Options):
    """(DeviceDescriptor, LoadedKernel) for this bound mask: the descriptor cached on it, the kernel on
    its compiled mask."""
    ddesc = device_descriptor(bound, tiles.block_m, tiles.block_n, device, options)
    if options.partial_tiles in AUTO_STORED and not can_store(ddesc.descriptor, options):
        options = options.replace(partial_tiles="bits")
    # The kernel depends on the compiled mask, not on lengths or values: a new bind reuses it. (Values of
    # const parameters are compiled in, and the predicate's width and a fixed softmax maximum follow the
    # binding: all in the key.)
    mask_state = state_for(bound.mask)
    arch = target_arch(device, options)
    kkey = ("kernel", head_dim, dtype, *tiles, device, arch, bound.constants, bound.narrow,
            getattr(bound, "fixed_max", False), options.forward_switches)
    kernel = mask_state.get(kkey)
    if kernel is None:
        spec = bound.kernel_spec(head_dim=head_dim, dtype=dtype, block_m=tiles.block_m, block_n=tiles.block_n,
                                 num_warps=tiles.num_warps, engine=tiles.engine, arch=arch)
        kernel = mask_state[kkey] = load_kernel(emit_kernel(spec, options), options)
    return ddesc, kernel


def can_store(desc: "Descriptor | DeviceShape", options: Options, transposed: bool = False) -> bool:
    """Whether a kernel may take the stored path for this descriptor: built on the host (a mask bound on the
    device changes its tiles with every update, and keeps the tile path), and its words, with the descriptor,
    within ``options.max_descriptor_bytes``."""
    return (isinstance(desc, Descriptor)
            and desc.nbytes + stored_bytes(desc, transposed) <= options.max_descriptor_bytes)


@dataclass
class StoredWords:
    """The stored path's words of one view of a bound mask on one device (:func:`stored_words`)."""

    slots: Any          # int32 per run of the view: the number of its first PARTIAL tile
    words: Any          # uint32: every PARTIAL tile's words, in that numbering
    stream: int         # the stream the builder ran on
    built: Any          # a CUDA event recorded after the builder; None: no PARTIAL tile, nothing built

    def ready_on(self, stream: int) -> None:
        """Make a launch on ``stream`` wait for the builder (a launch on the builder's stream follows it anyway)."""
        if self.built is not None and stream != self.stream:
            import cupy

            cupy.cuda.runtime.streamWaitEvent(stream, self.built.ptr, 0)


def stored_words(bound, kernel: LoadedKernel, block_m: int, block_n: int, device: int, options: Options,
                 stream: int, transposed: bool = False) -> StoredWords:
    """The stored path's words for the bound mask's row view at these tiles on ``device`` (the forward:
    ForwardPlan.stored) or its column view (``transposed``: the dK/dV kernel, BackwardSpec.partial_tiles
    "stored"), built once per bound mask by the kernel source's builder on ``stream``, with no wait on the host:
    a training step that binds a new mask keeps the GPU's queue full."""
    import cupy

    state = state_for(bound)
    key = ("tile_words", block_m, block_n, device, transposed)
    if key not in state:
        ddesc = device_descriptor(bound, block_m, block_n, device, options, transposed)
        desc = ddesc.descriptor
        assert isinstance(desc, Descriptor), "the stored path needs the host's descriptor (can_store)"
        slots, tiles = desc.col_partial_slots if transposed else desc.partial_slots
        with cupy.cuda.ExternalStream(stream):    # allocations and copies ordered on it, as the builder
            words = cupy.empty(max(1, stored_bytes(desc, transposed) // 4), np.uint32)
            built = None
            if len(tiles):
                spec = kernel.source.spec
                assert isinstance(spec, (KernelSpec, BackwardSpec)), "a forward or backward source"
                values = dict(tiles=device_int32(tiles), n_tiles=np.int32(len(tiles)), mask_data=ddesc.mask_data,
                              mask_offsets=ddesc.mask_offsets, seq_len=np.int32(desc.seq_len),
                              kv_len=np.int32(desc.kv_len), tile_words=words)
                # the forward's builder takes a thread per row of a tile, the backward's 128 threads per tile
                kernel.functions[spec.entry_tile_words]((min(len(tiles), 1 << 16), 1, 1),
                                                        (128 if transposed else block_m, 1, 1),
                                                        tuple(values[p.name] for p in TILE_WORDS_PARAMS))
                built = cupy.cuda.Event(disable_timing=True)
                built.record()
            state[key] = StoredWords(device_int32(slots), words, stream, built)
    return state[key]


@functools.lru_cache(maxsize=None)
def device_capability(device: int) -> tuple[int, int]:
    import cupy

    major, minor = divmod(int(cupy.cuda.Device(device).compute_capability), 10)
    return major, minor


def target_arch(device: int, options: Options) -> str:
    """The target kernels are built for on ``device``: ``options.arch`` (for instance compute_80: PTX of the
    portable mma kernels that the driver compiles, to test them on a Hopper), else the device's own
    (maskc.codegen.schedule.arch_for)."""
    return options.arch or arch_for(device_capability(device))


def capability(device: int, options: Options) -> tuple[int, int]:
    """The compute capability the schedule plans for: the target's."""
    return capability_of(target_arch(device, options))


@functools.lru_cache(maxsize=None)
def l2_bytes(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["L2CacheSize"])


@functools.lru_cache(maxsize=None)
def sm_count(device: int) -> int:
    import cupy

    return int(cupy.cuda.Device(device).attributes["MultiProcessorCount"])


def device_descriptor(bound, block_m: int, block_n: int, device: int, options: Options,
                       transposed: bool = False) -> DeviceDescriptor:
    """The bound mask's descriptor for these tiles on ``device``, uploaded once per bound mask; at most
    ``options.max_descriptor_bytes`` (a BindError past it)."""
    on_device = getattr(bound, "device_descriptor", None)
    if on_device is not None:               # a maskc.DeviceMask: built on the GPU (build_views before each launch)
        return on_device(block_m, block_n, transposed)
    state = state_for(bound)
    dkey = ("descriptor", block_m, block_n, device, transposed)
    ddesc = state.get(dkey)
    if ddesc is None:
        desc = bound.descriptor(block_m, block_n, max_bytes=options.max_descriptor_bytes)
        if (desc.block_m, desc.block_n) != (block_m, block_n):
            raise RuntimeError(f"bound.descriptor({block_m}, {block_n}) returned tiles {desc.block_m}x{desc.block_n}")
        ddesc = state[dkey] = upload(desc, transposed)
    return ddesc


def device_turns(bound, block_m: int, block_n: int, device: int, options: Options,
                 first_wave: int | None = None) -> tuple[Any, Any, Any]:
    """The column view's order and dQ turns for the deterministic wgmma_tma backward (Descriptor.turns, with its
    ``first_wave``) on ``device``: (order, rank_base, ranks), uploaded once per bound mask."""
    state = state_for(bound)
    key = ("turns", block_m, block_n, device, first_wave)
    if key not in state:
        desc = device_descriptor(bound, block_m, block_n, device, options, transposed=True).descriptor
        assert isinstance(desc, Descriptor), "a mask bound on the device has no turns: its own dQ kernel runs"
        state[key] = tuple(device_int32(a) for a in desc.turns(first_wave))
    return state[key]


def refresh(bound, views: tuple[tuple[int, int, bool], ...], stream: int) -> None:
    """Before a launch that reads the descriptor views ``views`` ((block_m, block_n, transposed), ...): a mask bound
    on the device (maskc.DeviceMask) rebuilds those its new values made stale, on the launch's stream; a host
    BoundMask's never change."""
    build = getattr(bound, "build_views", None)
    if build is not None:
        build(views, stream)


def backward_kernel(bound, tiles: BackwardTiles, head_dim: int, dtype: str, device: int,
                     options: Options) -> LoadedKernel:
    mask_state = state_for(bound.mask)
    arch = target_arch(device, options)
    kkey = ("backward", head_dim, dtype, device, arch, bound.constants, bound.narrow, tiles.engine,
            options.dq_reduction, options.partial_tiles)
    kernel = mask_state.get(kkey)
    if kernel is None:
        spec = bound.backward_spec(head_dim=head_dim, dtype=dtype, engine=tiles.engine, arch=arch,
                                   dq_reduction=options.dq_reduction, partial_tiles=options.partial_tiles)
        kernel = mask_state[kkey] = load_kernel(emit_backward_kernel(spec), options)
    return kernel
