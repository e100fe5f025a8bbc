"""The per-tile cost of a mask's visibility words on the CPU (a proxy for the kernels' integer work): the generated
predicate compiled with g++ -O2, ``mask_bits`` over every row and 32-key word of every PARTIAL 128 x 128 tile (the
words the forward's quad and the backward compute), for a mask in raster order and in its token order.

    python bench/mask_bits_cost.py [--mask clear] [--seq-len 32768] [--order 8x16]
"""
from __future__ import annotations

import argparse
import ctypes
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import maskc  # noqa: E402
from maskc.codegen.predicate import emit_predicate, pack_mask_data  # noqa: E402
from maskc.ordered import token_order  # noqa: E402

SHIM = "#include <algorithm>\n#include <cmath>\n#define __device__\n#define __forceinline__ inline\n" \
       "#define __restrict__\nusing std::min; using std::max;\n"
LOOP = """
extern "C" unsigned long long run(const int* mask, const int* tiles, int n, int seq_len) {
    unsigned long long acc = 0;
    for (int t = 0; t < n; ++t)
        for (int r = 0; r < 128; ++r) {
            const int q = std::min(tiles[2 * t] + r, seq_len - 1);
            const MaskRow row = mask_row(mask, 0, 0, q);
            for (int w = 0; w < 4; ++w) {
                unsigned bits[1];
                mask_bits(row, mask, 0, 0, q, tiles[2 * t + 1] + 32 * w, bits);
                acc += bits[0];
            }
        }
    return acc;
}
"""


def _library(source: str):
    folder = Path(tempfile.mkdtemp())
    (folder / "p.cpp").write_text(SHIM + source + LOOP)
    subprocess.run(["g++", "-O2", "-shared", "-fPIC", "-std=c++17", "-w", str(folder / "p.cpp"), "-o",
                    str(folder / "p.so")], check=True)
    lib = ctypes.CDLL(str(folder / "p.so"))
    lib.run.restype = ctypes.c_ulonglong
    return lib


def _partial_tiles(bound) -> np.ndarray:
    desc = bound.descriptor(128, 128)
    out = [(r * 128, k * 128) for r in range(desc.run_offsets.size - 1)
           for b, e, kind in desc.runs[desc.run_offsets[r]:desc.run_offsets[r + 1]] if kind == 1 for k in range(b, e)]
    return np.asarray(out, np.int32).reshape(-1, 2)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mask", default="clear")
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--order", default="8x16")
    args = ap.parse_args()
    bound = maskc.load(ROOT / "examples" / f"{args.mask}.mask").bind(seq_len=args.seq_len)
    for name, b in (("raster", bound), (args.order, token_order(bound, args.order).inner)):
        lib = _library(emit_predicate(b.mask.ranges, tuple(b.constants), narrow=b.narrow))
        data = np.ascontiguousarray(pack_mask_data(b.mask.ranges, b.params)[0], np.int32)
        tiles = np.ascontiguousarray(_partial_tiles(b))
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            lib.run(data.ctypes.data_as(ctypes.POINTER(ctypes.c_int)), tiles.ctypes.data_as(ctypes.POINTER(ctypes.c_int)),
                    len(tiles), args.seq_len)
            best = min(best, time.perf_counter() - start)
        print(f"{args.mask} {name}: {len(tiles)} PARTIAL tiles, {best:.3f} s, {best / len(tiles) * 1e6:.1f} us a tile")


if __name__ == "__main__":
    main()
