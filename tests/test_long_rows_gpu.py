"""The long rows first (Options.long_rows_first, maskc.runs.front_rows): CLEAR's text rows and columns, which see
every key and query, launched for every head before the L2 sections change where and when work runs, not what it
computes. The launch with them is compared with the launch that keeps every row in its section (the order every
other GPU test checks against float32 references)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from conftest import gpu_available

pytestmark = pytest.mark.gpu

if not gpu_available(with_torch=True):
    pytest.skip("no NVIDIA GPU here", allow_module_level=True)

from maskc import Options  # noqa: E402
from maskc.ordered import token_order  # noqa: E402
from maskc.runtime import kernels as runtime  # noqa: E402
from gpu_support import load, randn, rel  # noqa: E402


@pytest.mark.parametrize("engine", ["wgmma_tma", "wgmma", "mma"])
def test_long_rows_first_changes_only_the_launch_order(engine):
    """CLEAR at 32K in its 8 x 16 order, B=1, H=16, D=128 (the benchmark's binding; the runtime's own sections and
    SM count give both views a front of 4): the forward's O and LSE, dK and dV (every dK/dV engine) are bit for bit
    those of the launch with every row in its section; dQ, added by atomics in another order, within rounding."""
    S, H, D = 32768, 16, 128
    inner = token_order(load("clear").bind(seq_len=S, text=512, width=128, radius=16)).inner
    on, off = Options(backward_engine=engine), Options(backward_engine=engine, long_rows_first=False)
    shape = SimpleNamespace(shape=(1, H, S, D))
    forward_sections = runtime._l2_heads(shape, 1, H, 0)
    backward_sections = runtime._l2_section_heads(H, S * (D * (2 + 2 + 4) + 8), 0)
    assert runtime._front(inner.descriptor(128, 128), H, forward_sections, 0, on) == 4
    assert runtime._front(inner.descriptor(64, 128), H, backward_sections, 0, on, transposed=True) == 4
    assert runtime._front(inner.descriptor(128, 128), H, forward_sections, 0, off) == 0
    q, k, v, dout = (randn(1, H, S, D, dtype="bf16") for _ in range(4))
    out_on, lse_on = runtime.attention(q, k, v, inner, return_lse=True, options=on)
    out_off, lse_off = runtime.attention(q, k, v, inner, return_lse=True, options=off)
    assert torch.equal(out_on, out_off) and torch.equal(lse_on, lse_off)
    dq_on, dk_on, dv_on = runtime.attention_backward(dout, q, k, v, out_on, lse_on, inner, options=on)
    dq_off, dk_off, dv_off = runtime.attention_backward(dout, q, k, v, out_on, lse_on, inner, options=off)
    assert torch.equal(dk_on, dk_off) and torch.equal(dv_on, dv_off)
    assert rel(dq_on.float(), dq_off.float()) < 2e-3
