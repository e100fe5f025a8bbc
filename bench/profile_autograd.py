"""cProfile of maskc.attention forward + backward through autograd at S=256 (host-bound) unless told otherwise:
where the host time goes, by own time and by cumulative time."""
import argparse
import cProfile
import pstats
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import B, D, H, real_bound  # noqa: E402

import maskc  # noqa: E402

ap = argparse.ArgumentParser(description=__doc__)
ap.add_argument("--seq-len", type=int, default=256)
ap.add_argument("--iters", type=int, default=100)
ap.add_argument("--mask", default="document")
args = ap.parse_args()
S = args.seq_len
bound = real_bound(args.mask, S)
q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
qg, kg, vg = (x.requires_grad_() for x in (q, k, v))
step = lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound), (qg, kg, vg), dout)  # noqa: E731
for _ in range(5):
    step()
torch.cuda.synchronize()
prof = cProfile.Profile()
prof.enable()
for _ in range(args.iters):
    step()
torch.cuda.synchronize()
prof.disable()
stats = pstats.Stats(prof)
stats.sort_stats("tottime").print_stats(30)
stats.sort_stats("cumulative").print_stats(40)
