"""A small case for compute-sanitizer (memcheck, racecheck) with the default kernels: real example masks,
ragged lengths, PARTIAL + FULL + ragged tiles, empty row blocks, GQA, batch 2 with different parameters, a score
modifier;
then the backward kernels (both modes) on the same cases (``--forward``: the forward only). Exits non-zero if
an output is wrong. The options are the environment's (MASKC_*).

    compute-sanitizer --tool memcheck python bench/sanitize_case.py [--forward]
"""
import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.runtime import attention, attention_backward  # noqa: E402

def main() -> int:
    ap = argparse.ArgumentParser(description="A small case for compute-sanitizer (see the module docstring).")
    ap.add_argument("--forward", action="store_true", help="the forward kernels only")
    args = ap.parse_args()
    torch.manual_seed(0)
    ex = lambda n: maskc.load(ROOT / "examples" / f"{n}.mask")  # noqa: E731
    cases = [
        (ex("sliding_window").bind(seq_len=300, kv_len=130, window=40), 128),
        (ex("document").bind(seq_len=257, docs=[[100, 57, 100], [200, 57]]), 64),
        (ex("hstu").bind(seq_len=300, users=[120, 180], targets=[12, 18], context=3), 128),
        (ex("clear").bind(seq_len=200, text=64, width=16, radius=3), 128),
        (ex("alibi").bind(seq_len=300, num_heads=4, slope=[0.5, 0.25, 0.125, 0.0625]), 128),   # a score modifier
    ]
    ok = True
    for bound, D in cases:
        B = bound.batch
        q = torch.randn(B, 4, bound.seq_len, D, device="cuda", dtype=torch.bfloat16)
        k = torch.randn(B, 2, bound.kv_len, D, device="cuda", dtype=torch.bfloat16)
        v = torch.randn(B, 2, bound.kv_len, D, device="cuda", dtype=torch.bfloat16)
        o, lse = attention(q, k, v, bound, return_lse=True)
        torch.cuda.synchronize()
        ref = maskc.reference_attention(q.double().cpu().numpy(), k.double().cpu().numpy(),
                                        v.double().cpu().numpy(), bound)
        ref = torch.as_tensor(np.asarray(ref[0] if isinstance(ref, tuple) else ref), device="cuda")
        err = ((o.double() - ref).norm() / ref.norm()).item()
        print(f"{bound.mask.name}: rel err {err:.2e}, nan {torch.isnan(o).any().item()}")
        ok &= err < 1e-2 and not torch.isnan(o).any().item()
        if args.forward:
            continue
        dout = torch.randn_like(q)
        fast = attention_backward(dout, q, k, v, o, lse, bound)
        det = attention_backward(dout, q, k, v, o, lse, bound, deterministic=True)
        torch.cuda.synchronize()
        gerr = max(((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()
                   for a, b in zip(fast, det))
        print(f"{bound.mask.name}: backward fast vs deterministic rel err {gerr:.2e}")
        ok &= gerr < 1e-2 and not any(torch.isnan(g).any().item() for g in fast + det)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
