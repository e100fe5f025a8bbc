"""64-bit safety on the GPU (issue 17, item 1): the kernel and its device predicate agree with dense() for
parameter values within 2**10 of the int32 boundaries, where 32-bit sums wrapped."""
from __future__ import annotations

import numpy as np
import pytest

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("needs an NVIDIA GPU with CuPy and torch", allow_module_level=True)

import maskc  # noqa: E402
from maskc.errors import BindError  # noqa: E402
from test_runtime_gpu import check  # noqa: E402
from test_widths import EDGE_MASKS, INT32_MAX, OVERFLOW  # noqa: E402

TABLE = r"""
extern "C" __global__ void table(const int* mask, unsigned char* out, int S, int K) {
    const int q = blockIdx.x;
    const MaskRow row = mask_row(mask, 0, 0, q);
    for (int k = threadIdx.x; k < K; k += blockDim.x) out[(long long)q * K + k] = mask_visible(row, mask, k) ? 1 : 0;
}
"""


def edge_values(rng, n):
    """n draws of (a, c, w), each within 2**10 of +-(2**31 - 1) or of 0."""
    def one():
        j = int(rng.integers(0, 2 ** 10 + 1))
        return int(rng.choice([INT32_MAX - j, -INT32_MAX + j, j - 2 ** 9]))
    return [(one(), one(), one()) for _ in range(n)]


def device_table(bound):
    import cupy

    spec = bound.kernel_spec(head_dim=64, dtype="bf16")
    fn = cupy.RawKernel(spec.predicate.source + TABLE, "table", options=("--std=c++17",))
    desc = bound.descriptor(128, 64)
    data = cupy.asarray(np.asarray(desc.mask_data, np.int32))
    off = int(np.asarray(desc.mask_offsets)[0])
    out = cupy.zeros((bound.seq_len, bound.kv_len), cupy.uint8)
    fn((bound.seq_len,), (128,), (data[off:], out, np.int32(bound.seq_len), np.int32(bound.kv_len)))
    return cupy.asnumpy(out).astype(bool)


def test_issue_reproducer_kernel_matches_dense():
    """The issue's case: outputs were 0.71 away from the dense() reference (PARTIAL tiles saw nothing)."""
    bound = maskc.compile_mask(OVERFLOW).bind(256, a=INT32_MAX, c=-100, w=100)
    assert np.array_equal(device_table(bound), bound.dense(0))
    check(bound, 1, 2, 2, 64, "bf16")


@pytest.mark.parametrize("text", EDGE_MASKS)
def test_device_predicate_and_kernel_at_int32_edges(text):
    compiled = maskc.compile_mask(text)
    rng = np.random.default_rng(sum(map(ord, text)))
    done = 0
    for a, c, w in edge_values(rng, 24):
        S, K = int(rng.integers(1, 300)), int(rng.integers(1, 300))
        try:
            bound = compiled.bind(S, K, a=a, c=c, w=w)
        except BindError:
            continue
        assert np.array_equal(device_table(bound), bound.dense(0)), f"a={a} c={c} w={w} S={S} K={K}"
        if done < 4:
            check(bound, 1, 2, 1, 64, "bf16")
        done += 1
    assert done >= 12
