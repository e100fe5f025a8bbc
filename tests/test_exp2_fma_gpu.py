"""exp2 on the FMA pipe in the wgmma_tma forward (Options.exp2_emulation) on the GPU: O and LSE with 1 column tile
in N emulated equal, within the dtype's tolerance, a float64 reference (the score modifier from its definition)
and the default kernel's, ragged lengths and rows without a visible key included."""
from __future__ import annotations

import math

import pytest
import torch

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from gpu_support import TOL, bind, randn, rel  # noqa: E402
from test_backward_gpu import reference_grads  # noqa: E402


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("S", [127, 1000, 4097])
@pytest.mark.parametrize("name", ["softcap", "causal", "document", "clear"])
def test_emulated_exponentials_against_float64(name, S, dtype):
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("the wgmma_tma forward needs sm_90a")
    bound = bind(name, S, seed=S, heads=4)
    B, Hq, Hkv, D = 1, 4, 2, 128
    q, k, v = randn(B, Hq, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype), randn(B, Hkv, S, D, dtype=dtype)
    ref = reference_grads(q, k, v, randn(B, Hq, S, D, dtype=dtype), bound, 1 / math.sqrt(D), with_out=True)[0]
    default = maskc.attention(q, k, v, bound, enable_gqa=True, options=Options(engine="wgmma_tma"))
    for n in (1, 2, 4):
        o, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True,
                                 options=Options(engine="wgmma_tma", exp2_emulation=n))
        torch.cuda.synchronize()
        assert not torch.isnan(o).any() and not torch.isnan(lse).any(), n
        assert rel(o.double(), ref) <= TOL[dtype], f"N={n}: O vs float64"
        assert rel(o.double(), default.double()) <= TOL[dtype], f"N={n}: O vs the SFU's exponentials"
