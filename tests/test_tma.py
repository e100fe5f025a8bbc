"""Tensor-map geometry for the copy engine (maskc.runtime.tma): what the driver is asked for, checked without a GPU."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available
from maskc.codegen.emit import compile_to_cubin, emit_tma_check
from maskc.runtime.tma import TensorMapError, check_copy_engine, expected_box, map_geometry


def test_contiguous_bhsd():
    dims, step, box = map_geometry((2, 16, 4096, 128), (16 * 4096 * 128, 4096 * 128, 128, 1), 128)
    assert dims == (128, 4096, 16, 2)                       # innermost first
    assert step == (256, 4096 * 256, 16 * 4096 * 256)       # bytes, for S, H, B
    assert box == (64, 128, 1, 1)                           # 128-byte rows: the 128B swizzle's width


def test_bshd_view_and_unit_dims():
    """A (B, S, H, D) buffer viewed as (B, H, S, D): heads step by D, rows by H * D. A dim of extent 1 is
    never stepped over, so its stride (here not a 16-byte multiple) is replaced."""
    dims, step, _ = map_geometry((1, 8, 1000, 64), (3, 64, 8 * 64, 1), 64)
    assert dims == (64, 1000, 8, 1) and step == (8 * 64 * 2, 128, 8 * 128)   # B: H * 128 bytes


@pytest.mark.parametrize("shape,strides,match", [
    ((1, 2, 10, 128), (2560, 1280, 129, 1), "stride 129"),   # rows not 16-byte aligned
    ((1, 2, 10, 96), (1920, 960, 96, 1), "multiple of 64"),   # head dim the box cannot tile
    ((1, 2, 10, 128), (2560, 1280, 128, 2), "contiguous"),
])
def test_layouts_the_copy_engine_cannot_describe(shape, strides, match):
    with pytest.raises(TensorMapError, match=match):
        map_geometry(shape, strides, 128)


def test_expected_box_is_the_128_byte_swizzle():
    """Element (r, c) of a box lands at row r, 16-byte chunk (c // 8) ^ (r % 8), slot c % 8; rows past S are 0."""
    x = np.arange(1 * 1 * 10 * 128, dtype=np.uint16).reshape(1, 1, 10, 128)
    box = expected_box(x, 64, 2, 0, 0, 16).reshape(16, 64)
    for r in range(16):
        for c in range(64):
            want = x[0, 0, 2 + r, 64 + c] if 2 + r < 10 else 0
            assert box[r, ((c // 8) ^ (r % 8)) * 8 + c % 8] == want


def test_check_kernel_compiles_with_reporting_waits():
    """The copy-engine check goes through NVRTC here, and its waits are the reporting (non-hanging) kind."""
    pytest.importorskip("cupy")
    src = emit_tma_check()
    assert "maskc: stuck block" in src.source and "%globaltimer" in src.source
    assert len(compile_to_cubin(src)) > 0


@pytest.mark.gpu
def test_copy_engine_on_the_gpu():
    """Tensor maps, their passing by value through CuPy, the mbarrier and the swizzle, on the GPU."""
    if not gpu_available():
        pytest.skip("no NVIDIA GPU here")
    import cupy
    if cupy.cuda.Device(0).compute_capability < "90":
        pytest.skip("the copy engine needs sm_90")
    assert check_copy_engine() == []
