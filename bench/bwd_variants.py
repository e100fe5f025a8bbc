"""Where the wgmma backward's time goes: the dK/dV kernel's dQ reductions (maskc.kernel_ir.DQ_REDUCTIONS,
``Options.dq_reduction``) timed side by side on the same inputs, and the deterministic mode (its dK/dV
kernel adds no dQ at all; a separate kernel computes it: its dK/dV time is the cost without dQ reductions,
which the retired timing-only `none` reduction used to measure).

B=1, H=16, D=128, bf16, the masks of bench_fwd.py (bench/workloads.py). Median of triton.testing.do_bench of
``runtime.attention_backward``; the other kernels of the backward are the same in every variant, so the
differences are the dK/dV kernel's. Each variant's dQ is checked against red2's. ``--once``: one backward
call of the first mask and length with the environment's dQ reduction (MASKC_BWD_DQ_REDUCTION), for a
profiler (ncu -k regex:dkdv).

    python bench/bwd_variants.py [--lengths 8192,32768] [--masks causal,document] [--reductions ...] [--once]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import B, D, H, bench_ms, count_pairs, real_bound  # noqa: E402

from maskc import Options  # noqa: E402  (workloads put the checkout first on sys.path)
from maskc.runtime import kernels as runtime  # noqa: E402
from maskc.kernel_ir import DQ_REDUCTIONS  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="8192,32768")
    ap.add_argument("--masks", default="causal,document,hstu")
    ap.add_argument("--reductions", default=",".join(DQ_REDUCTIONS))
    ap.add_argument("--once", action="store_true")
    args = ap.parse_args()
    wgmma = Options.from_environment().replace(backward_engine="wgmma")
    gen = torch.Generator(device="cuda").manual_seed(0)
    rows = []
    for S in (int(x) for x in args.lengths.split(",")):
        q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
        for name in args.masks.split(","):
            bound = real_bound(name, S)
            o, lse = runtime.attention(q, k, v, bound, return_lse=True)
            if args.once:
                runtime.attention_backward(dout, q, k, v, o, lse, bound, options=wgmma)
                torch.cuda.synchronize()
                return
            flops = 2.5 * 4 * D * count_pairs(bound) * B * H
            reference = None
            for mode in args.reductions.split(",") + ["det"]:
                det = mode == "det"
                options = wgmma.replace(dq_reduction="red2" if det else mode)
                call = lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound,  # noqa: E731
                                                          deterministic=det, options=options)
                dq = call()[0]
                torch.cuda.synchronize()
                if mode == "red2":
                    reference = dq.double()
                err = "-" if reference is None else f"{(dq.double() - reference).norm() / reference.norm():.1e}"
                ms = bench_ms(call, warmup=10, rep=60)
                rows.append((name, S, mode, ms, flops / ms / 1e9, err))
                print(rows[-1], flush=True)
    print("\n| mask | S | variant | ms | TF/s | dQ rel. err vs red2 |\n|---|---|---|---|---|---|")
    for name, S, mode, ms, tf, err in rows:
        print(f"| {name} | {S} | {mode} | {ms:.3f} | {tf:.0f} | {err} |")


if __name__ == "__main__":
    main()
