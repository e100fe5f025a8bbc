"""Context-parallel attention on gloo processes (torch.multiprocessing spawn) against single-process maskc
attention on the CPU, in float64: every example mask, forward (O and LSE) and gradients (dQ, dK, dV, with a
gradient on LSE too), 2 and 4 ranks; jagged batches and GQA; torch.compile. GPU runs are marked ``gpu``."""
from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

import maskc  # noqa: E402
import maskc.distributed as cp  # noqa: E402

from conftest import CROSS_EXAMPLES, EXAMPLE_NAMES, EXAMPLES, batch_params, example_params  # noqa: E402

CP_EXAMPLES = [n for n in EXAMPLE_NAMES if n not in CROSS_EXAMPLES]      # one sequence: kv_len = seq_len

if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)


def bind_case(case):
    mask = maskc.load(EXAMPLES / f"{case['name']}.mask")
    rng = np.random.default_rng(case["seed"])
    S, B = case["S"], case["B"]
    if not mask.params or case.get("broadcast"):
        return mask.bind(S, **example_params(case["name"], S, rng, case["Hq"]))
    return mask.bind(S, **batch_params(mask, case["name"], S, rng, B, case["Hq"]))


def case_tensors(case, device="cpu"):
    """q, k, v, dout, dlse for the whole sequence (the same on every rank: a seeded generator)."""
    g = torch.Generator().manual_seed(case["seed"])
    B, S, Hq, Hkv, D = case["B"], case["S"], case["Hq"], case["Hkv"], case["D"]
    dtype = case.get("dtype", torch.float64)
    make = lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64).to(device, dtype)  # noqa: E731
    return make(B, Hq, S, D), make(B, Hkv, S, D), make(B, Hkv, S, D), make(B, Hq, S, D), make(B, Hq, S)


def loss_of(out, lse, dout, dlse):
    """A scalar whose gradient is dout on O and dlse on the finite LSE entries."""
    return (out * dout).sum() + (torch.where(torch.isinf(lse), 0, lse) * dlse).sum()


def _worker(rank, world_size, store, cases, out_dir, compiled):
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world_size)
    torch.set_num_threads(1)
    try:
        results = []
        for case in cases:
            bound = bind_case(case)
            plan = cp.plan(bound, world_size, block=case["block"], prefetch_tokens=case.get("prefetch"))
            q, k, v, dout, dlse = case_tensors(case)
            q_r, k_r, v_r = (plan.shard(x, rank).requires_grad_() for x in (q, k, v))
            attend = cp.attention
            if compiled:
                attend = torch.compile(cp.attention, backend="aot_eager", fullgraph=True)
            out_r, lse_r = attend(q_r, k_r, v_r, plan, return_lse=True)
            loss_of(out_r, lse_r, plan.shard(dout, rank), plan.shard(dlse, rank)).backward()
            results.append({key: t.detach() for key, t in
                            (("out", out_r), ("lse", lse_r), ("dq", q_r.grad), ("dk", k_r.grad), ("dv", v_r.grad))})
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def run_ranks(world_size, cases, tmp_path, compiled=False):
    """Every case on ``world_size`` gloo processes; per case, the unsharded outputs and gradients."""
    mp.spawn(_worker, args=(world_size, str(tmp_path / "store"), cases, str(tmp_path), compiled),
             nprocs=world_size, join=True)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    merged = []
    for i, case in enumerate(cases):
        plan = cp.plan(bind_case(case), world_size, block=case["block"], prefetch_tokens=case.get("prefetch"))
        merged.append({key: plan.unshard([per_rank[r][i][key] for r in range(world_size)])
                       for key in per_rank[0][i]})
    return merged


def single_process(case):
    bound = bind_case(case)
    q, k, v, dout, dlse = (x.requires_grad_() if i < 3 else x for i, x in enumerate(case_tensors(case)))
    out, lse = maskc.attention(q, k, v, bound, return_lse=True, enable_gqa=True)
    loss_of(out, lse, dout, dlse).backward()
    return {"out": out.detach(), "lse": lse.detach(), "dq": q.grad, "dk": k.grad, "dv": v.grad}


def check_cases(cases, got):
    for case, result in zip(cases, got):
        want = single_process(case)
        for key in want:
            g, w = result[key].numpy(), want[key].numpy()
            np.testing.assert_array_equal(np.isinf(g), np.isinf(w), err_msg=f"{case['name']} {key}")
            fin = np.isfinite(w)
            np.testing.assert_allclose(g[fin], w[fin], rtol=1e-10, atol=1e-11, err_msg=f"{case['name']} {key}")


def example_cases(world_size):
    """Every example: a jagged batch of 2 (a broadcast mask when it takes no parameters), GQA 4/2; every
    other one with transfers posted as far ahead as there are steps (the plan's depth R - 1)."""
    S = 24 * world_size
    return [dict(name=name, seed=100 * world_size + i, S=S, B=2, Hq=4, Hkv=2, D=8, block=6,
                 prefetch=None if i % 2 else 10**9) for i, name in enumerate(CP_EXAMPLES)]


@pytest.mark.parametrize("world_size", [2, 4])
def test_every_example_matches_single_process(world_size, tmp_path):
    cases = example_cases(world_size)
    check_cases(cases, run_ranks(world_size, cases, tmp_path))


def test_torch_compile_traces_the_exchange(tmp_path):
    """fullgraph=True: the exchange is one custom op forward and one backward, no graph break."""
    cases = [dict(name="document", seed=5, S=64, B=1, Hq=2, Hkv=1, D=8, block=8, broadcast=True),
             dict(name="causal", seed=6, S=64, B=1, Hq=2, Hkv=2, D=8, block=8)]
    check_cases(cases, run_ranks(2, cases, tmp_path, compiled=True))


def _gpu_worker(rank, world_size, store, cases, out_dir):
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("nccl", init_method=f"file://{store}", rank=rank, world_size=world_size)
    try:
        results = []
        for case in cases:
            bound = bind_case(case)
            plan = cp.plan(bound, world_size, block=case["block"])
            q, k, v, dout, dlse = case_tensors(case, "cuda")
            q_r, k_r, v_r = (plan.shard(x, rank).requires_grad_() for x in (q, k, v))
            out_r, lse_r = cp.attention(q_r, k_r, v_r, plan, return_lse=True)
            (out_r.float() * plan.shard(dout, rank).float()).sum().backward()
            results.append({key: t.detach().cpu().double() for key, t in
                            (("out", out_r), ("lse", lse_r), ("dq", q_r.grad), ("dk", k_r.grad), ("dv", v_r.grad))})
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("world_size", [2, 4])
def test_gpu_ranks_match_float64(world_size, tmp_path):
    """NCCL ranks, one GPU each, bf16, against the float64 oracle (gradient of O only) at the kernels'
    tolerance."""
    if not torch.cuda.is_available() or torch.cuda.device_count() < world_size:
        pytest.skip(f"NCCL needs a GPU per rank: {world_size} GPUs")
    from maskc.runtime.reference import reference_attention, reference_attention_backward
    cases = [dict(name=name, seed=7, S=1024 * world_size, B=1, Hq=4, Hkv=2, D=128, block=128,
                  dtype=torch.bfloat16, broadcast=True) for name in CP_EXAMPLES]
    mp.spawn(_gpu_worker, args=(world_size, str(tmp_path / "store"), cases, str(tmp_path)), nprocs=world_size)
    per_rank = [torch.load(tmp_path / f"rank{r}.pt") for r in range(world_size)]
    for i, case in enumerate(cases):
        bound = bind_case(case)
        plan = cp.plan(bound, world_size, block=case["block"])
        got = {key: plan.unshard([per_rank[r][i][key] for r in range(world_size)]).numpy() for key in per_rank[0][i]}
        q, k, v, dout, _ = (x.double() for x in case_tensors(case))
        out, lse = reference_attention(q, k, v, bound, return_lse=True)
        dq, dk, dv = reference_attention_backward(q, k, v, dout.to(torch.bfloat16).double(), bound)
        np.testing.assert_allclose(got["out"], out, atol=2e-2)
        for key, want in (("dq", dq), ("dk", dk), ("dv", dv)):
            np.testing.assert_allclose(got[key], want, atol=5e-2, err_msg=f"{case['name']} {key}")
