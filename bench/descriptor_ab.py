"""Descriptors of two (or more) checkouts compared bit for bit: the check that a host-path change kept them.

    python bench/descriptor_ab.py --trees /tmp/base,. [--lengths 1000,4096,32761,32768,65536]

Each tree's ``maskc`` is imported under its own name (bind_ab.py's ``package_of``). For every bench mask
(workloads.py's parameters) and every other example (tests/conftest.py's ``example_params``, seeded per
example and length), at each length and tile shape (128x128, 64x128, 128x64, 64x96), every tree binds and
builds the descriptor; the arrays (run offsets, runs, work order, the transposed view's offsets, runs and work
order, mask data and offsets) must be equal in shape, dtype and bytes to the first tree's. A bind the first
tree refuses must be refused by the others with the same error type. Prints one line per difference and a
count; exits 1 on any difference. Not a test (it needs two checkouts); nothing is written.
"""
from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "tests"))
import workloads as W  # noqa: E402
from bind_ab import package_of  # noqa: E402

TILES = ((128, 128), (64, 128), (128, 64), (64, 96))
ARRAYS = ("run_offsets", "runs", "work_order", "col_offsets", "col_runs", "col_work_order", "mask_data",
          "mask_offsets")


def cases(lengths):
    """(label, example, seq_len, params) for the bench masks and the other examples."""
    from conftest import EXAMPLE_NAMES, example_params
    bench_examples = set()
    for S in lengths:
        for name in W.ALL_MASKS:
            w = W.workload(name, S, device="cpu")
            bench_examples.add(w.example)
            yield f"{name}", w.example, S, w.params
    for example in EXAMPLE_NAMES:
        if example in bench_examples:
            continue
        for S in lengths:
            rng = np.random.default_rng([S, sum(map(ord, example))])
            try:
                params = example_params(example, S, rng, 4)
            except BaseException as e:      # pytest.skip (tree_verify's table past MAX_TABLE) is a BaseException
                print(f"skip {example} {S}: {e}")
                continue
            yield example, example, S, params


def outcome(package, example: str, S: int, params: dict, block_m: int, block_n: int):
    """The descriptor's arrays, or the error's type name."""
    mask = package.load(W.ROOT / "examples" / f"{example}.mask")
    try:
        desc = mask.bind(seq_len=S, **params).descriptor(block_m, block_n)
    except Exception as e:  # noqa: BLE001 - compared across trees
        return type(e).__name__
    return {a: np.asarray(getattr(desc, a)) for a in ARRAYS}


def differ(a, b) -> str | None:
    if isinstance(a, str) or isinstance(b, str):
        return None if a == b else f"{a!r} != {b!r}"
    for name in ARRAYS:
        x, y = a[name], b[name]
        if x.dtype != y.dtype or x.shape != y.shape or x.tobytes() != y.tobytes():
            return f"{name} differs ({x.dtype}{x.shape} vs {y.dtype}{y.shape})"
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trees", required=True, help="checkouts, comma-separated (the first is the reference)")
    ap.add_argument("--lengths", default="1000,4096,32761,32768,65536")
    args = ap.parse_args()
    trees = [Path(t).resolve() for t in args.trees.split(",")]
    lengths = [int(s) for s in args.lengths.split(",")]
    checked = bad = refused = 0
    with tempfile.TemporaryDirectory() as tmp:
        packages = [package_of(tree, f"maskc_da{i}", Path(tmp)) for i, tree in enumerate(trees)]
        for label, example, S, params in cases(lengths):
            for block_m, block_n in TILES:
                ref = outcome(packages[0], example, S, params, block_m, block_n)
                refused += isinstance(ref, str)
                for tree, package in zip(trees[1:], packages[1:]):
                    why = differ(ref, outcome(package, example, S, params, block_m, block_n))
                    checked += 1
                    if why:
                        bad += 1
                        print(f"DIFF {label} S={S} {block_m}x{block_n} {tree}: {why}", flush=True)
    print(f"{checked} descriptors compared ({refused} binds refused by the reference), {bad} differ")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
