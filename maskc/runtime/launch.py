"""Kernel launches from packed argument buffers: the host side of a call made cheap.

CuPy's ``RawKernel.__call__`` converts every argument on every call (a type dispatch, a numpy view and a holder
object for each of the forward's ~35 arguments). A :class:`PackedLaunch` lays out one kernel's
arguments once, in signature order, in a host buffer, with the array of their addresses that
``cuLaunchKernel`` takes; a call rewrites in place only what changes between calls (data pointers, tensor
maps) and launches through the driver. ``cuLaunchKernel`` copies the argument values when it is called, so
the buffer may be rewritten as soon as a launch returns; a lock makes rewrite-and-launch one step, so
threads that share a launch (one bound mask used from several threads) cannot mix their arguments.
Measured on the H200 (bench/NOTES.md, run 20): a forward call's host cost went from 63 to 46 µs.

Arguments are given as for ``RawKernel``: numpy scalars (by value), size-one numpy arrays (by value: a
tensor map), CuPy arrays (their data pointer). Nothing here needs a GPU until :meth:`PackedLaunch.__call__`.
"""
from __future__ import annotations

import threading
from typing import Iterable, Sequence

import numpy as np

_WORD = 8


def _value_bytes(arg) -> bytes:
    """The bytes of one kernel argument as the kernel receives it."""
    if isinstance(arg, np.generic):
        return arg.tobytes()
    if isinstance(arg, np.ndarray):
        if arg.size != 1:
            raise TypeError(f"a numpy array passed by value must have one element, got shape {arg.shape}")
        return arg.tobytes()
    data = getattr(arg, "data", None)
    if data is not None and hasattr(data, "ptr"):        # a cupy.ndarray: its device address
        return np.uint64(data.ptr).tobytes()
    raise TypeError(f"unsupported kernel argument {type(arg).__name__}: pass numpy scalars, size-one numpy "
                    "arrays or CuPy arrays")


def pack_arguments(args: Sequence) -> tuple[np.ndarray, list[int]]:
    """(buffer, offsets): the arguments' bytes in one uint8 buffer of a multiple of 8 bytes, argument i at
    ``offsets[i]``, every argument 8-byte aligned (so that a pointer can be rewritten as one word)."""
    blobs = [_value_bytes(a) for a in args]
    offsets, at = [], 0
    for blob in blobs:
        offsets.append(at)
        at += -(-len(blob) // _WORD) * _WORD
    buffer = np.zeros(max(at, _WORD), np.uint8)
    for blob, off in zip(blobs, offsets):
        buffer[off:off + len(blob)] = np.frombuffer(blob, np.uint8)
    return buffer, offsets


class PackedLaunch:
    """One kernel launch with its arguments packed once (see the module docstring)."""

    def __init__(self, function, args: Sequence, grid: tuple[int, int, int], block: tuple[int, int, int],
                 shared_mem: int = 0):
        """``function``: a ``cupy.RawKernel`` (loaded on the current device); ``args`` as for it."""
        self._buffer, self._offsets = pack_arguments(args)
        self._words = self._buffer.view(np.uint64)
        base = self._buffer.ctypes.data
        self._addresses = np.array([base + off for off in self._offsets], np.uint64)   # the void*[] array
        self._keep = tuple(args)           # device arrays named by pointer stay alive with the launch
        self._function = function
        self._function_ptr = function.kernel.ptr
        self.grid = tuple(int(x) for x in grid)
        self.block = tuple(int(x) for x in block)
        self.shared_mem = int(shared_mem)
        self._lock = threading.Lock()
        self._values_set: dict[int, np.ndarray] = {}   # index -> the value object last copied in (see __call__)

    def _set_pointer(self, index: int, address: int) -> None:
        self._words[self._offsets[index] // _WORD] = address

    def _set_value(self, index: int, value: np.ndarray) -> None:
        raw = value.view(np.uint8).reshape(-1)
        off = self._offsets[index]
        self._buffer[off:off + raw.size] = raw

    def argument_bytes(self, index: int, size: int) -> bytes:
        """The ``size`` bytes argument ``index`` holds now (tests)."""
        off = self._offsets[index]
        return self._buffer[off:off + size].tobytes()

    def __call__(self, stream: int, pointers: Iterable[tuple[int, int]] = (),
                 values: Iterable[tuple[int, np.ndarray]] = ()) -> None:
        """Launch on ``stream`` (a CUDA stream handle; 0 for the legacy default stream) after setting
        arguments: ``pointers`` (index, device address) and ``values`` (index, bytes passed by value, a
        tensor map say). What is set stays set for later calls. A value is taken as immutable: the object last
        copied into an argument is not copied again."""
        from cupy.cuda import driver

        with self._lock:
            for index, address in pointers:
                self._set_pointer(index, address)
            for index, value in values:
                # a tensor map comes from tile_map's cache: the same object for the same tensor, whose bytes
                # are in the buffer already
                if self._values_set.get(index) is not value:
                    self._set_value(index, value)
                    self._values_set[index] = value
            driver.launchKernel(self._function_ptr, *self.grid, *self.block, self.shared_mem, stream,
                                self._addresses.ctypes.data, 0)
