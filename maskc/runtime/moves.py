"""The token order's moves on the GPU: every array of a call moved into the order (or back) in one launch of the
moves kernel (:mod:`maskc.codegen.moves`), on the current stream, into new arrays from the framework's allocator
(torch's caching allocator, CuPy's pool): nothing is read back and nothing waits, so a CUDA graph captures it.

    moved = move((q, k, v), ordered, into=True)     # new contiguous arrays, or None: the caller's torch path

:func:`plan_moves` decides the launch from the arrays' shapes and strides alone (pure: the host's tests run its
arguments through the kernel's CTA body compiled by g++); :func:`move` keeps a plan per layout on the order and
sets the data pointers per call.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Sequence

import numpy as np

from maskc.analysis.order import TokenOrder
from maskc.analysis.values import INT32
from maskc.codegen.moves import MoveSpec, emit_moves, moved_operand
from maskc.options import Options


class Array(NamedTuple):
    """What the moves kernel reads of one array: its shape (B, H, S) or (B, H, S, D), strides in bytes, item size
    and data address."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    itemsize: int
    ptr: int


@dataclass(frozen=True)
class MovePlan:
    """One launch: the kernel's spec, its arguments in signature order (data pointers 0: set per call), where
    each operand's source and destination pointers go (argument indices), the grid's blocks, and the shapes of
    the new (contiguous) arrays."""

    spec: MoveSpec
    args: tuple
    pointers: tuple[tuple[int, int], ...]
    blocks: int
    shapes: tuple[tuple[int, ...], ...]


def plan_moves(arrays: Sequence[Array], order: TokenOrder, seq_len: int, into: bool,
               arch: str = "sm_90a") -> MovePlan | None:
    """The launch that moves ``arrays`` along axis 2 into ``order`` (``into``) or back, into new contiguous arrays
    of their shapes; None where the kernel cannot take them (the torch path moves them): not (B, H, S[, D]) of one
    B and S = ``seq_len``, an empty one, a last dim that is not contiguous, rows whose bytes no unit divides, strides
    that are not whole units, or more blocks than a grid holds. The data pointers' alignment is the caller's
    check (:func:`aligned`): they change per call."""
    if not arrays or seq_len < 1:
        return None
    batch = arrays[0].shape[0]
    i32, i64, u64 = np.int32, np.int64, np.uint64
    args: list = [i32(seq_len), i32(order.end(seq_len))]
    operands, pointers, shapes, blocks = [], [], [], 0
    for a in arrays:
        if len(a.shape) not in (3, 4) or a.shape[0] != batch or a.shape[2] != seq_len or 0 in a.shape:
            return None
        width = a.shape[3] if len(a.shape) == 4 else 1
        if width > 1 and a.strides[3] != a.itemsize:
            return None
        row = a.itemsize * width
        op = moved_operand(row)
        # a size-one axis is never stepped along: its stride, whatever it is, is left out (0)
        src = tuple(s if n > 1 else 0 for s, n in zip(a.strides[:3], a.shape[:3]))
        if op is None or any(s % op.unit for s in src):
            return None
        heads = a.shape[1]
        dst = (heads * seq_len * row, seq_len * row, row)
        blocks += batch * heads * -(-seq_len // op.tile)
        if blocks > INT32:
            return None
        pointers.append((len(args), len(args) + 1))
        args += [u64(0), u64(0), *(i64(s) for s in src + dst), i32(heads), i32(blocks)]
        operands.append(op)
        shapes.append(tuple(a.shape))
    spec = MoveSpec(order, into, tuple(operands), arch)
    return MovePlan(spec, tuple(args), tuple(pointers), blocks, tuple(shapes))


def aligned(plan: MovePlan, ptrs: Sequence[int]) -> bool:
    """Whether each operand's data pointer is a whole number of its units (the kernel's loads need it)."""
    return all(p % op.unit == 0 for p, op in zip(ptrs, plan.spec.operands))


def move(xs: Sequence, ordered, into: bool, options: Options | None = None) -> tuple | None:
    """``xs`` (torch CUDA tensors or CuPy arrays, one framework and device; (B, H, S[, D]) along the sequence)
    moved into ``ordered``'s order (``into``) or back to raster order, as new contiguous arrays, in one launch on
    the current stream; None where this path does not apply (CuPy missing, CPU tensors, mixed inputs, layouts
    :func:`plan_moves` refuses, a misaligned pointer): the caller moves them with torch."""
    found = [_described(x) for x in xs]
    described = [d for d in found if d is not None]
    if not described or len(described) < len(found) or len({d[1:] for d in described}) != 1:
        return None
    try:
        import cupy
    except ImportError:
        return None
    from maskc.runtime.launch import PackedLaunch
    from maskc.runtime.loader import load_kernel, resolved_options
    from maskc.runtime.operands import on_device
    from maskc.runtime.state import state_for, target_arch

    arrays = [d[0] for d in described]
    _, framework, device = described[0]
    options = resolved_options(options)
    state = state_for(ordered)
    key = ("moves", into, tuple(a[:3] for a in arrays), framework, device, options.arch)
    with on_device(device):
        prepared = state.get(key)
        if prepared is None:
            plan = plan_moves(arrays, ordered.order, ordered.parent.seq_len, into, target_arch(device, options))
            launch = None
            if plan is not None:
                kernel = load_kernel(emit_moves(plan.spec), options)
                launch = PackedLaunch(kernel.function, plan.args, (plan.blocks, 1, 1), (plan.spec.threads, 1, 1))
            prepared = state[key] = (plan, launch)
        plan, launch = prepared
        if plan is None or launch is None or not aligned(plan, [a.ptr for a in arrays]):
            return None
        outs = [_empty(x, framework) for x in xs]
        ptrs = [(s, a.ptr) for (s, _), a in zip(plan.pointers, arrays)]
        ptrs += [(d, _pointer(o, framework)) for (_, d), o in zip(plan.pointers, outs)]
        stream = _stream(xs[0], framework)
        launch(stream, ptrs)
        if options.sync:            # a fault surfaces at its call (Options.sync), as the attention launches' do
            cupy.cuda.runtime.streamSynchronize(stream)
    return tuple(outs)


def _described(x) -> tuple[Array, str, int] | None:
    """(Array, framework, device) of a torch CUDA tensor or a CuPy array; None for anything else."""
    mod = type(x).__module__
    if mod.startswith("torch"):
        if not getattr(x, "is_cuda", False):
            return None
        item = x.element_size()
        device = x.device.index
        if device is None:
            import torch

            device = torch.cuda.current_device()
        return Array(tuple(x.shape), tuple(s * item for s in x.stride()), item, x.data_ptr()), "torch", device
    if mod.startswith("cupy"):
        return Array(tuple(x.shape), tuple(x.strides), x.dtype.itemsize, x.data.ptr), "cupy", x.device.id
    return None


def _empty(x, framework: str):
    """A new contiguous array of ``x``'s shape and dtype, from the framework's allocator on the current stream."""
    if framework == "torch":
        return x.new_empty(x.shape)
    import cupy

    return cupy.empty(x.shape, x.dtype)


def _pointer(x, framework: str) -> int:
    return x.data_ptr() if framework == "torch" else x.data.ptr


def _stream(x, framework: str) -> int:
    """The current stream's handle (torch's for torch tensors, CuPy's for CuPy arrays): the launch goes there."""
    if framework == "torch":
        import torch

        return torch.cuda.current_stream(x.device).cuda_stream
    import cupy

    return cupy.cuda.get_current_stream().ptr
