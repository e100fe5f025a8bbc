"""Compile, in parallel, the forward and backward kernels the GPU tests and benchmarks ask for first, into the
disk cache (NVRTC needs no GPU; a device call then spends its GPU time running, not compiling). Masks with
const parameters are compiled per value by their own callers and are skipped here.

    python bench/precompile.py [--head-dims 64,128] [--dtypes bf16,fp16]
"""
from __future__ import annotations

import argparse
import glob
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def compile_one(job) -> int:
    path, head_dim, dtype, backward = job
    import maskc
    from maskc.emit import compile_to_cubin, emit_backward_kernel, emit_kernel
    from maskc.runtime import cache_dir, kernel_key

    mask = maskc.load(path)
    if mask.const_params:
        return 0
    try:
        if backward:
            src = emit_backward_kernel(mask.backward_spec(head_dim=head_dim, dtype=dtype))
        else:
            src = emit_kernel(mask.kernel_spec(head_dim=head_dim, dtype=dtype))
    except ValueError:   # a combination maskc has no kernel for (the backward at head dim 256)
        return 0
    out = cache_dir() / f"{src.entry}-{kernel_key(src)[:32]}.cubin"
    if out.is_file():
        return 0
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".tmp{os.getpid()}")
    tmp.write_bytes(compile_to_cubin(src))
    os.replace(tmp, out)
    return 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--backward", action="store_true")
    args = ap.parse_args()
    jobs = [(p, int(d), dt, bwd) for p in sorted(glob.glob(str(ROOT / "examples" / "*.mask")))
            for d in args.head_dims.split(",") for dt in args.dtypes.split(",")
            for bwd in ((False, True) if args.backward else (False,))]
    with ProcessPoolExecutor(min(32, os.cpu_count() or 1)) as pool:
        print("compiled", sum(pool.map(compile_one, jobs)), "of", len(jobs), "kernels")


if __name__ == "__main__":
    main()
