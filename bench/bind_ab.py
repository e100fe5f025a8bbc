"""Two (or more) checkouts' host bind + descriptor side by side in one process, alternated bind by bind.

    python bench/bind_ab.py --trees /work/main,. [--masks hstu,clear] [--lengths 32768] [--repeat 40]

On a shared machine a process's CPU time swings by 1.5x from one minute to the next, so two runs of
bench_bind.py minutes apart cannot tell a 10 % change. Here each tree's ``maskc`` package is copied under a
new name (its imports rewritten), every example is compiled once per tree, and the trees take turns, one fresh
``bind(...).descriptor(block, block)`` each (order reversed every other turn), timed with this process's CPU
time: both see the same load and the same allocator. Prints, per mask and tree, the lowest and the median
time in ms. Parameters are bench/workloads.py's (this checkout's). ``--allocator warm`` first puts glibc's
allocator in the state of a process that has freed a large array (bench_bind.py's ``warm_allocator``): without
it the figures depend on which masks ran before (video 2.4 ms first in the list, 1.4 after neighborhood).
Not a test; nothing is written.
"""
from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402


def package_of(tree: Path, name: str, root: Path):
    """The tree's maskc imported as ``name`` (a copy under ``root`` with ``maskc`` renamed in its imports)."""
    dst = root / name / name
    shutil.copytree(tree / "maskc", dst, ignore=shutil.ignore_patterns("__pycache__"))
    for path in dst.rglob("*.py"):
        path.write_text(re.sub(r"\bmaskc\b", name, path.read_text()))
    for data in ("grammars", "templates", "examples"):
        os.symlink(tree / data, dst / data)
    sys.path.insert(0, str(root / name))
    return importlib.import_module(name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", required=True, help="checkouts, comma-separated (the first is the baseline)")
    ap.add_argument("--masks", default=",".join(W.ALL_MASKS))
    ap.add_argument("--lengths", default="32768")
    ap.add_argument("--repeat", type=int, default=40)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--allocator", choices=["as-is", "warm"], default="as-is")
    args = ap.parse_args()
    if args.allocator == "warm":
        from bench_bind import warm_allocator
        warm_allocator()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    with tempfile.TemporaryDirectory() as tmp:
        packages = [package_of(tree, f"maskc_ab{i}", Path(tmp)) for i, tree in enumerate(trees)]
        print(f"{'mask':16s} {'S':>7s} " + "".join(f"{str(t)[-28:]:>30s}" for t in trees) + "   (lowest / median ms)")
        for S in map(int, args.lengths.split(",")):
            for name in args.masks.split(","):
                w = W.workload(name, S, device="cpu")
                masks = [p.load(W.ROOT / "examples" / f"{w.example}.mask") for p in packages]
                times: list[list[float]] = [[] for _ in packages]
                for m in masks:                                  # specializations, caches, imports
                    m.bind(seq_len=S, **w.params).descriptor(args.block, args.block)
                for turn in range(args.repeat):
                    order = range(len(masks)) if turn % 2 == 0 else reversed(range(len(masks)))
                    for i in order:
                        t0 = time.process_time()
                        masks[i].bind(seq_len=S, **w.params).descriptor(args.block, args.block)
                        times[i].append((time.process_time() - t0) * 1e3)
                print(f"{name:16s} {S:7d} " + "".join(f"{min(t):18.3f} / {statistics.median(t):8.3f}  " for t in times),
                      flush=True)


if __name__ == "__main__":
    main()
