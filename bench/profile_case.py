"""One forward case for a profiler (ncu): maskc's default kernel or FA4's, causal, B=1 H=16 D=128 bf16 at 32K
unless told otherwise; a few launches, so that ``ncu --launch-skip`` can pass the warm-up ones.

    ncu ... python bench/profile_case.py maskc|fa4 [--seq-len 32768] [--head-dim 128] [--mask causal]
"""
import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

ap = argparse.ArgumentParser()
ap.add_argument("who", choices=("maskc", "fa4"))
ap.add_argument("--seq-len", type=int, default=32768)
ap.add_argument("--head-dim", type=int, default=128)
ap.add_argument("--mask", default="causal")
ap.add_argument("--launches", type=int, default=5)
args = ap.parse_args()
w = W.workload(args.mask, args.seq_len)
q, k, v = (torch.randn(1, 16, args.seq_len, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if args.who == "maskc":
    from maskc.runtime import attention

    bound = w.bound()
    run = lambda: attention(q, k, v, bound)   # noqa: E731
else:
    fa4 = W.fa4_module()
    qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
    run = lambda: fa4.flash_attn_func(qs, ks, vs, **w.fa4_native())   # noqa: E731
for _ in range(args.launches):
    run()
torch.cuda.synchronize()
