"""exp2 on the FMA pipe (templates/exp2_fma.cu.j2, Options.exp2_emulation): the function under g++ against float64
over the softmax's whole range, and the forward kernels that use it for 1 column tile in N: each compiles and
moves that share of the softmax's exponentials off the SFU (counted in the PTX), the default kernel none."""
from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest

import maskc
from maskc.codegen.emit import compile_with_log, template_dir
from maskc.kernel_ir import EXP2_EMULATION, KernelSource
from conftest import EXAMPLES
from host_cxx import build_library

HOST_PRELUDE = """#include <cmath>
#include <cstring>
#define __host__
#define __device__
#define __forceinline__ inline
using std::fmaf;
using std::fmaxf;
"""
HOST_LOOP = """
extern "C" void exp2_fma_all(const float* x, float* y, int n) {
    for (int i = 0; i < n; ++i) y[i] = exp2_fma(x[i]);
}
"""


@pytest.fixture(scope="module")
def exp2_fma():
    """The template's exp2_fma compiled by g++, as a numpy function."""
    body = re.sub(r"\{#-.*?-#\}\n", "", (Path(template_dir()) / "exp2_fma.cu.j2").read_text(), flags=re.S)
    lib = build_library(HOST_PRELUDE + body + HOST_LOOP, "exp2_fma", ("-O2", "-Wall"))

    def run(x: np.ndarray) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        y = np.empty_like(x)
        lib.exp2_fma_all(x.ctypes.data_as(ctypes.c_void_p), y.ctypes.data_as(ctypes.c_void_p), len(x))
        return y
    return run


def test_relative_error_within_bf16s_rounding_over_the_softmax_range(exp2_fma):
    # the softmax's range down to 2^-126 (below it: test_exact_where_the_softmax_needs_it) and up to 2^8 (the lazy
    # rescale's RESCALE_THRESHOLD: a row's P reach 2^8 while its maximum stays): 2^22 points in [-1, 0], every
    # 2^-10 further out, every exact half-integer (the rounding's ties) and random ones
    x = np.concatenate([np.linspace(-1, 0, 1 << 22, dtype=np.float32), np.arange(-126, 8.5, 2.0 ** -10),
                        np.arange(-125, 9) - 0.5, np.random.default_rng(0).uniform(-126, 8.25, 1 << 20)])
    got, want = exp2_fma(x).astype(np.float64), np.exp2(x.astype(np.float32).astype(np.float64))
    assert np.max(np.abs(got / want - 1)) < 1.1e-4 < 2.0 ** -8       # bf16 keeps 8 bits: P's own rounding is 2^-9
    assert np.all(np.diff(exp2_fma(np.linspace(-2, 0, 100001, dtype=np.float32))) >= 0), "monotone"


def test_exact_where_the_softmax_needs_it(exp2_fma):
    zero_to_one = exp2_fma(np.array([-np.inf, -1e30, -200, -127, 0], dtype=np.float32))
    assert zero_to_one.tolist() == [0.0, 0.0, 0.0, 0.0, 1.0]          # a hidden key adds nothing; the row max 1
    tail = exp2_fma(np.linspace(-127, -126, 1001, dtype=np.float32))   # ex2.approx.ftz gives +0 there
    assert np.all(tail >= 0) and np.all(tail < 2.0 ** -125)


def _ptx(name: str, emulation: int) -> tuple[str, object]:
    src = maskc.load(EXAMPLES / f"{name}.mask").kernel_source(maskc.Options(exp2_emulation=emulation), head_dim=128,
                                                              dtype="bf16", engine="wgmma_tma")
    options = tuple("--gpu-architecture=compute_90a" if o.startswith("--gpu-architecture") else o for o in src.options)
    return compile_with_log(KernelSource(None, src.source, src.entry, options))[0].decode(), src.plan


@pytest.mark.parametrize("name", ["softcap", "causal", "clear"])
def test_one_column_tile_in_n_leaves_the_sfu(name):
    """ex2.approx in the PTX: the softmax's per-score ones fall to (N - 1) / N of the default's; the rescaling
    factors (one per row and tile) stay on the SFU; the modifier's tanh is untouched."""
    counts = {}
    for n in EXP2_EMULATION:
        ptx, plan = _ptx(name, n)
        assert plan.exp2_emulation == n
        counts[n] = (len(re.findall(r"\bex2\.approx", ptx)), len(re.findall(r"\btanh\.approx", ptx)))
    per_score = counts[0][0] - counts[1][0]             # N = 1: every per-score exponential on the FMA pipe
    assert per_score > 0 and per_score % 16 == 0        # 16 column tiles of 2 columns x 2 rows per thread, per site
    for n in EXP2_EMULATION[1:]:
        assert counts[0][0] - counts[n][0] == per_score // n, n
        assert counts[n][1] == counts[0][1]


def test_the_mma_forward_ignores_it():
    src = maskc.load(EXAMPLES / "softcap.mask").kernel_source(maskc.Options(exp2_emulation=2), head_dim=128,
                                                              dtype="bf16", engine="mma")
    default = maskc.load(EXAMPLES / "softcap.mask").kernel_source(head_dim=128, dtype="bf16", engine="mma")
    assert src.plan.exp2_emulation == 0 and src.source == default.source
