"""Packed kernel arguments (maskc.runtime.launch): the bytes cuLaunchKernel will read, checked without a GPU."""
from __future__ import annotations

import types

import numpy as np
import pytest

from maskc.runtime.launch import PackedLaunch, pack_arguments


class FakeDeviceArray:
    """Stands in for a cupy.ndarray: what the packer reads is its data pointer."""

    def __init__(self, ptr: int):
        self.data = types.SimpleNamespace(ptr=ptr)


def fake_kernel():
    return types.SimpleNamespace(kernel=types.SimpleNamespace(ptr=0xF00D))


def test_arguments_laid_out_in_order_each_on_an_8_byte_boundary():
    tmap = np.arange(128, dtype=np.uint8).view(np.dtype((np.void, 128)))
    args = (np.int32(-7), np.uint64(2**63 + 5), np.float32(1.5), FakeDeviceArray(0xABC0), tmap, np.int64(-3))
    buffer, offsets = pack_arguments(args)
    assert offsets == [0, 8, 16, 24, 32, 160]
    assert buffer.size % 8 == 0 and buffer.size >= 168
    assert buffer[0:4].view(np.int32)[0] == -7
    assert buffer[8:16].view(np.uint64)[0] == 2**63 + 5
    assert buffer[16:20].view(np.float32)[0] == 1.5
    assert buffer[24:32].view(np.uint64)[0] == 0xABC0
    assert bytes(buffer[32:160]) == bytes(range(128))
    assert buffer[160:168].view(np.int64)[0] == -3


def test_a_call_rewrites_only_the_arguments_it_names(monkeypatch):
    """A launch's pointers and by-value arguments are set in place before cuLaunchKernel reads them."""
    launched = []
    driver = pytest.importorskip("cupy").cuda.driver
    monkeypatch.setattr(driver, "launchKernel", lambda *a: launched.append(a))
    args = (np.uint64(0), np.int32(11), np.uint64(0), np.zeros(1, np.dtype((np.void, 16))), np.int32(12))
    launch = PackedLaunch(fake_kernel(), args, (3, 1, 1), (384, 1, 1), 4096)
    launch(7, pointers=[(2, 0x7F0000001230)],
           values=[(3, np.frombuffer(bytes(range(16)), np.uint8).view(np.dtype((np.void, 16))))])
    assert launched == [(0xF00D, 3, 1, 1, 384, 1, 1, 4096, 7, launch._addresses.ctypes.data, 0)]
    assert launch.argument_bytes(0, 8) == bytes(8)
    assert launch.argument_bytes(1, 4) == np.int32(11).tobytes()
    assert launch.argument_bytes(2, 8) == np.uint64(0x7F0000001230).tobytes()
    assert launch.argument_bytes(3, 16) == bytes(range(16))
    assert launch.argument_bytes(4, 4) == np.int32(12).tobytes()
    # the address array cuLaunchKernel reads points at each argument's bytes
    addresses = launch._addresses
    assert len(addresses) == 5 and list(np.diff(addresses)) == [8, 8, 8, 16]
    assert (launch.grid, launch.block, launch.shared_mem) == ((3, 1, 1), (384, 1, 1), 4096)


def test_a_value_is_copied_whenever_another_object_was_set(monkeypatch):
    """Values are copied in by identity (tensor maps come from a cache): A, B, then A again holds A's bytes."""
    driver = pytest.importorskip("cupy").cuda.driver
    monkeypatch.setattr(driver, "launchKernel", lambda *a: None)
    void16 = np.dtype((np.void, 16))
    a, b = (np.frombuffer(bytes(range(s, s + 16)), np.uint8).view(void16) for s in (0, 100))
    launch = PackedLaunch(fake_kernel(), (np.uint64(0), np.zeros(1, void16)), (1, 1, 1), (32, 1, 1))
    for value, start in ((a, 0), (b, 100), (a, 0), (a, 0)):
        launch(0, values=[(1, value)])
        assert launch.argument_bytes(1, 16) == bytes(range(start, start + 16))


@pytest.mark.parametrize("bad", [np.zeros(2, np.int32), 3, "x"])
def test_arguments_it_cannot_pass(bad):
    with pytest.raises(TypeError):
        pack_arguments((bad,))
