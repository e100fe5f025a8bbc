"""One case for a profiler (ncu): maskc's default kernels or FA4's, causal, B=1 H=16 D=128 bf16 at 32K unless
told otherwise; a few launches, so that ``ncu --launch-skip`` can pass the warm-up ones. ``--backward``: the
backward from a stored forward (maskc: ``attention_backward``; FA4: ``torch.autograd.grad`` of its output).

    ncu ... python bench/profile_case.py maskc|fa4 [--seq-len 32768] [--head-dim 128] [--mask causal] [--backward]
        [--token-order raster|auto|8x16] [--partial-tiles auto|bits|elements] [--templates DIR[:P-C]]

``--token-order``: maskc's kernels in that order on inputs already in it (the order's kernel alone, no gathers).
``--templates``: maskc's kernels rendered from a variant's templates (bench/template_ab.py's NAME=DIR[:P-C] form
without the name), so that ncu can count a variant's cycles against main's in two processes.
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
ap.add_argument("--backward", action="store_true", help="profile the backward (the forward runs once before)")
ap.add_argument("--token-order", default="raster", help="maskc: run in this order, inputs already in it")
ap.add_argument("--partial-tiles", default="auto", choices=("auto", "bits", "elements"),
                help="maskc: how PARTIAL tiles of exact chunked masks are masked (Options.partial_tiles)")
ap.add_argument("--templates", default=None, help="maskc: a template variant's directory (DIR or DIR:P-C)")
args = ap.parse_args()
if args.templates:
    from template_ab import use_variant

    use_variant(args.templates)
w = W.workload(args.mask, args.seq_len)
q, k, v = (torch.randn(1, 16, args.seq_len, args.head_dim, device="cuda", dtype=torch.bfloat16) for _ in range(3))
if args.who == "maskc":
    from maskc import Options
    from maskc.runtime import attention

    options = Options.from_environment().replace(partial_tiles=args.partial_tiles)

    bound = w.bound()
    if args.token_order != "raster":
        from maskc.ordered import token_order

        ordered = token_order(bound, args.token_order)
        if ordered is not None:
            bound = ordered.inner      # q, k, v are random: their order does not matter to a profile
    run = lambda: attention(q, k, v, bound, options=options)   # noqa: E731
    if args.backward:
        from maskc.runtime import attention_backward

        out, lse = attention(q, k, v, bound, return_lse=True, options=options)
        dout = torch.randn_like(out)
        run = lambda: attention_backward(dout, q, k, v, out, lse, bound, options=options)   # noqa: E731
else:
    fa4 = W.fa4_module()
    qs, ks, vs = (x.transpose(1, 2).contiguous().requires_grad_(args.backward) for x in (q, k, v))
    run = lambda: fa4.flash_attn_func(qs, ks, vs, **w.fa4_native())   # noqa: E731
    if args.backward:
        out = W.first(run())
        dout = torch.randn_like(out)
        run = lambda: torch.autograd.grad(out, (qs, ks, vs), dout, retain_graph=True)   # noqa: E731
for _ in range(args.launches):
    run()
torch.cuda.synchronize()
