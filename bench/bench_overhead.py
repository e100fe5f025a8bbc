"""Host-side cost per call of maskc's entry points, where the kernels are too small to hide it.

At S=256 (B=1, H=16, D=128, bf16, document mask unless told otherwise) each kernel runs for microseconds, so
the time per call is the host's: Python, validation, allocation and launches. For each entry point: `host_us`,
the wall time per call of 200 calls issued back to back (one synchronize at the end), and `device_us`,
do_bench's median (CUDA events) for comparison. Flex's compiled fwd+bwd on the same mask is measured the same
way, and for causal FA4's and cuDNN's (SDPA) fwd+bwd, the peers whose 4K figures these host costs bound.

    python bench/bench_overhead.py [--seq-len 256] [--mask document] [--out overhead.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import B, D, H, bench_ms, compiled_flex, fa4_module, first, real_bound, write_records  # noqa: E402

import maskc  # noqa: E402  (workloads put the checkout first on sys.path)
from maskc.runtime import kernels as runtime  # noqa: E402


def host_us(fn, n: int = 200) -> float:
    fn()
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t) / n * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--mask", default="document")
    ap.add_argument("--out", default="overhead.json")
    args = ap.parse_args()
    S = args.seq_len
    from torch.nn.attention.flex_attention import create_block_mask

    flex, gpu, date = compiled_flex()
    bound = real_bound(args.mask, S)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    o, lse = runtime.attention(q, k, v, bound, return_lse=True)
    bm = create_block_mask(bound.flex_mask_mod("cuda"), None, None, S, S, device="cuda")

    calls = {
        "runtime.attention (fwd kernel)": lambda: runtime.attention(q, k, v, bound),
        "runtime.attention_backward (4 kernels)": lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound),
        "maskc.attention, no grad": lambda: maskc.attention(q, k, v, bound),
        "maskc.attention fwd+bwd (autograd)":
            lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound), (qg, kg, vg), dout),
        "flex fwd+bwd (compiled)":
            lambda: torch.autograd.grad(flex(qg, kg, vg, block_mask=bm), (qg, kg, vg), dout),
    }
    if args.mask == "causal":
        sdpa = torch.nn.functional.scaled_dot_product_attention
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn_step():
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return torch.autograd.grad(sdpa(qg, kg, vg, is_causal=True), (qg, kg, vg), dout)

        calls["cuDNN fwd+bwd (SDPA)"] = cudnn_step
        fa4 = fa4_module()
        if fa4 is not None:
            q4, k4, v4 = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (q, k, v))
            dout4 = dout.transpose(1, 2).contiguous()
            calls["FA4 fwd+bwd"] = lambda: torch.autograd.grad(first(fa4.flash_attn_func(q4, k4, v4, causal=True)),
                                                               (q4, k4, v4), dout4)
    records = []
    for name, fn in calls.items():
        rec = {"call": name, "seq_len": S, "mask": args.mask, "host_us": host_us(fn), "device_us": bench_ms(fn, warmup=10, rep=50) * 1e3,
               "gpu": gpu, "date": date}
        records.append(rec)
        print(json.dumps(rec), flush=True)
    write_records(args.out, records)
    print(f"\n| call (S={S}, {args.mask}) | host µs per call | do_bench µs |\n|---|---|---|")
    for r in records:
        print(f"| {r['call']} | {r['host_us']:.0f} | {r['device_us']:.0f} |")


if __name__ == "__main__":
    main()
