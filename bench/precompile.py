"""Compile, in parallel, the forward and backward kernels the GPU tests and benchmarks ask for first, into the
disk cache (NVRTC needs no GPU; a device call then spends its GPU time running, not compiling). Masks with
const parameters are compiled per value by their own callers and are skipped here. The kernels are those the
environment's options (MASKC_*) ask for on an H100/H200 (sm_90a, unless MASKC_ARCH says otherwise), in the
cache directory they name.

    python bench/precompile.py [--head-dims 64,128] [--dtypes bf16,fp16] [--backward] [--all-engines]
                               [--backward-engines wgmma_tma,...]
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
    path, head_dim, dtype, backward, engine = job
    import maskc
    from maskc.codegen.emit import compile_to_cubin
    from maskc.runtime import binary_name, disk_cache

    options = maskc.Options.from_environment()
    mask = maskc.load(path)
    if mask.const_params:
        return 0
    try:
        if backward:
            src = mask.backward_source(options, head_dim=head_dim, dtype=dtype, engine=engine)
        else:
            src = mask.kernel_source(options, head_dim=head_dim, dtype=dtype, engine=engine)
    except ValueError:   # a combination maskc has no kernel for (the backward at head dim 256, ...)
        return 0
    _, compiled = disk_cache(options).artifact(binary_name(src), lambda: compile_to_cubin(src))
    return int(compiled)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--dtypes", default="bf16,fp16")
    ap.add_argument("--backward", action="store_true", help="the backward kernels too")
    ap.add_argument("--all-engines", action="store_true",
                    help="every engine's kernels (the GPU tests run them all), not only the schedule's")
    ap.add_argument("--backward-engines", default="",
                    help="only the backward kernels, of these dK/dV engines (comma-separated)")
    args = ap.parse_args()
    from maskc.kernel_ir import BACKWARD_ENGINES, ENGINES
    engines = {False: ENGINES if args.all_engines else (None,), True: BACKWARD_ENGINES if args.all_engines else (None,)}
    directions = (False, True) if args.backward else (False,)
    if args.backward_engines:
        engines[True], directions = tuple(args.backward_engines.split(",")), (True,)
    jobs = [(p, int(d), dt, bwd, e) for p in sorted(glob.glob(str(ROOT / "examples" / "*.mask")))
            for d in args.head_dims.split(",") for dt in args.dtypes.split(",")
            for bwd in directions for e in engines[bwd]]
    with ProcessPoolExecutor(min(32, os.cpu_count() or 1)) as pool:
        print("compiled", sum(pool.map(compile_one, jobs)), "of", len(jobs), "kernels")


if __name__ == "__main__":
    main()
