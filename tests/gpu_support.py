"""Helpers shared by the GPU test modules: seeded random inputs, real bound masks of the examples, output
poisoning, relative error. Import it only after ``conftest.gpu_available(with_torch=True)``: it needs CUDA."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

import maskc
from conftest import batch_params, example_params, example_score_mod

TOL = {"bf16": 1e-2, "fp16": 5e-3}
TORCH_DTYPE = {"bf16": torch.bfloat16, "fp16": torch.float16}
EX = Path(__file__).resolve().parent.parent / "examples"
_gen = torch.Generator(device="cuda")
_gen.manual_seed(1234)
_masks = {}


def randn(*shape, dtype):
    return torch.randn(*shape, generator=_gen, device="cuda", dtype=torch.float32).to(TORCH_DTYPE[dtype])


def rel(a, b):
    return (torch.linalg.vector_norm(a - b) / torch.linalg.vector_norm(b).clamp_min(1e-30)).item()


def load(name):
    if name not in _masks:
        _masks[name] = maskc.load(EX / f"{name}.mask")
    return _masks[name]


def bind(name, S, seed=0, batch=None, heads=4, **kw):
    """A real bound mask with example_params; batch=n: n elements with different parameters (lists). A mask
    that reads h is bound to ``heads`` query heads."""
    rng = np.random.default_rng(seed)
    if batch is None:
        return load(name).bind(seq_len=S, **example_params(name, S, rng, heads), **kw)
    return load(name).bind(seq_len=S, **batch_params(load(name), name, S, rng, batch, heads, **kw), **kw)


def poison(shape, dtype):
    """Fill a block of this size with NaN and free it: the runtime's next torch.empty of it gets the memory."""
    x = torch.full(shape, float("nan"), dtype=TORCH_DTYPE[dtype], device="cuda")
    del x


def modify(s: torch.Tensor, bound, b: int, h: int, rows=None) -> torch.Tensor:
    """Scaled scores ``s`` (rows x kv_len of batch element b, head h) through the example's score modifier as
    its definition says (conftest.example_score_mod, not maskc's); ``s`` itself for masks without one."""
    mod = example_score_mod(bound.mask.name, dict(bound.params.batch[b if bound.batch > 1 else 0].floats))
    if mod is None:
        return s
    q = torch.as_tensor(np.arange(bound.seq_len) if rows is None else rows, dtype=s.dtype, device=s.device)
    return mod(s, h, q[:, None], torch.arange(bound.kv_len, dtype=s.dtype, device=s.device)[None, :])


def modify_all(s: torch.Tensor, bound) -> torch.Tensor:
    """:func:`modify` on scores (B, Hq, S, Skv), every batch element and head."""
    return torch.stack([torch.stack([modify(s[b, h], bound, b, h) for h in range(s.shape[1])])
                        for b in range(s.shape[0])])


def visibility(bound, B, Hq) -> torch.Tensor:
    """bool (B, Hq, S, Skv) on the GPU, from the bound mask's dense form (brute force)."""
    out = torch.empty(B, Hq, bound.seq_len, bound.kv_len, dtype=torch.bool, device="cuda")
    for b in range(B):
        mb = b if bound.batch > 1 else 0
        for h in range(Hq):
            if h == 0 or bound.num_heads:
                plane = torch.as_tensor(bound.dense(mb, h if bound.num_heads else 0), device="cuda")
            out[b, h] = plane
    return out
