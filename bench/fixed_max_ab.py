"""Softcap's forward against a fixed maximum beside the online softmax and causal, in one process.

The same softcap kernel runs against a fixed maximum for caps up to ``maskc.codegen.plan.FIXED_MAX_CAP`` (50.6) and
with the online softmax past it, so cap 50 against cap 60 is the A/B (equal work: the cap changes no tile); cap 30
is the fixed kernel again, a second sample of it. B=1, H=16, D=128, bf16; do_bench medians; effective TF/s over
visible pairs.

    python bench/fixed_max_ab.py [--lengths 32768,16384] [--reversed]

``--reversed`` measures the softcap cases in the opposite order: in session 12 (bench/NOTES.md, run 72) the case
measured right after causal ran slow at 16K whichever it was.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import bench_ms  # noqa: E402  (puts the checkout first on sys.path)

import maskc  # noqa: E402
from maskc.runtime import attention  # noqa: E402

EX = Path(__file__).resolve().parent.parent / "examples"
CASES = (("causal", "causal", {}), ("softcap50_fixed", "softcap", {"cap": 50.0}),
         ("softcap60_online", "softcap", {"cap": 60.0}), ("softcap30_fixed", "softcap", {"cap": 30.0}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="32768,16384")
    ap.add_argument("--reversed", action="store_true", help="the softcap cases in the opposite order")
    args = ap.parse_args()
    cases = (CASES[0], *CASES[:0:-1]) if args.reversed else CASES
    for S in map(int, args.lengths.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(1, 16, S, 128, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
        rows = []
        for label, name, params in cases:
            bound = maskc.load(EX / f"{name}.mask").bind(seq_len=S, **params)
            pairs = int(bound.visible_pairs())
            ms = bench_ms(lambda: attention(q, k, v, bound), warmup=10, rep=100)
            rows.append((label, bound.fixed_max, ms, 4 * 128 * pairs * 16 / (ms * 1e-3) / 1e12))
        causal = rows[0][3]
        for label, fixed, ms, tf in rows:
            print(f"S={S} {label:18s} fixed_max={fixed!s:5s} {ms:.3f} ms {tf:.0f} TF/s  {tf / causal:.3f}x causal")


if __name__ == "__main__":
    main()
