"""Tensor-map geometry for the copy engine (maskc.tma): what the driver is asked for, checked without a GPU."""
from __future__ import annotations

import pytest

from maskc.tma import TensorMapError, map_geometry


def test_contiguous_bhsd():
    dims, step, box = map_geometry((2, 16, 4096, 128), (16 * 4096 * 128, 4096 * 128, 128, 1), 128)
    assert dims == (128, 4096, 16, 2)                       # innermost first
    assert step == (256, 4096 * 256, 16 * 4096 * 256)       # bytes, for S, H, B
    assert box == (64, 128, 1, 1)                           # 128-byte rows: the 128B swizzle's width


def test_bshd_view_and_unit_dims():
    """A (B, S, H, D) buffer viewed as (B, H, S, D): heads step by D, rows by H * D. A dim of extent 1 is
    never stepped over, so its stride (here not a 16-byte multiple) is replaced."""
    dims, step, _ = map_geometry((1, 8, 1000, 64), (3, 64, 8 * 64, 1), 64)
    assert dims == (64, 1000, 8, 1) and step == (8 * 64 * 2, 128, 16)


@pytest.mark.parametrize("shape,strides,match", [
    ((1, 2, 10, 128), (2560, 1280, 129, 1), "stride 129"),   # rows not 16-byte aligned
    ((1, 2, 10, 96), (1920, 960, 96, 1), "multiple of 64"),   # head dim the box cannot tile
    ((1, 2, 10, 128), (2560, 1280, 128, 2), "contiguous"),
])
def test_layouts_the_copy_engine_cannot_describe(shape, strides, match):
    with pytest.raises(TensorMapError, match=match):
        map_geometry(shape, strides, 128)
