"""PTX instructions one thread spends masking one PARTIAL tile, per way of masking it (Options.partial_tiles): a
proxy for the cost of a PARTIAL tile, computed on the CPU (NVRTC, no GPU).

The forward kernel's source (wgmma_tma, 128 x 128 tiles, D=128, the forms in 32 bits as bind proves for the
benchmark's bindings) gets a probe kernel appended that loads a
thread's 16 x 4 scores, calls the kernel's own ``mask_scores`` once (do_mask a run-time argument, so that nothing
folds away) and stores them; the same probe with ``mask_scores`` left out is the baseline. The difference of their
PTX instruction counts is the masking code. For the element path that code is straight-line (fully unrolled):
its count is what a thread executes per tile, and a warp issues each instruction once; in a token order, for each
of its two kinds of tile (keys mapped to raster positions from the tile's first key, or one by one: the only way
for patches narrower than 8 columns), the other branch taken out of the source. The tile path's chunk nests
loop over image rows: its count is the static size of the code, a lower bound of what runs per tile (ncu counted
12.8 K instructions per PARTIAL tile and warp against 4.5 K for a FULL one for CLEAR in 8 x 16, run 54). PTX is
not SASS: ptxas fuses some integer operations (IMAD, LOP3, predicated compares), so SASS counts run lower.

    python bench/partial_tile_ptx.py [--masks clear:8x16,clear,neighborhood:8x1,...]
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import maskc  # noqa: E402
from maskc.codegen.emit import compile_with_log  # noqa: E402
from maskc.kernel_ir import KernelSource  # noqa: E402
from maskc.options import Options  # noqa: E402
from maskc.ordered import in_order  # noqa: E402

PROBE = """
extern "C" __global__ void maskc_probe(float* __restrict__ out, const int* __restrict__ mask, int q0, int k0,
                                       int seq_len, int kv_len, int mb, int h, const int* __restrict__ roots,
                                       int do_mask) {
    using namespace maskc;
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    float s[N_TILES][4];
    #pragma unroll
    for (int i = 0; i < N_TILES * 4; ++i) s[i / 4][i % 4] = out[threadIdx.x * N_TILES * 4 + i];
{CALL}
    #pragma unroll
    for (int i = 0; i < N_TILES * 4; ++i) out[threadIdx.x * N_TILES * 4 + i] = s[i / 4][i % 4];
}
"""
CALL = ("    mask_scores<true, false>(s, g, t, 16 * (threadIdx.x / 32), q0, k0, seq_len, kv_len, mask, mb, h, nullptr,"
        " roots, do_mask != 0, false);")
_INSTRUCTION = re.compile(r"^\s+(@!?%p\d+\s+)?[a-z][\w.]*\s")


def probe_body(ptx: str) -> list[str]:
    """The instruction lines of the probe kernel's body in ``ptx``."""
    start = ptx.index(".entry maskc_probe")
    body = ptx[ptx.index("{", start):]
    return [line for line in body.splitlines() if _INSTRUCTION.match(line) and not line.strip().startswith(".")]


def ptx_of(source: str, options: tuple[str, ...]) -> str:
    """PTX of ``source`` for compute_90a (the kernel's own options otherwise)."""
    src = KernelSource(None, source, "maskc_probe",
                                       tuple("--gpu-architecture=compute_90a" if o.startswith("--gpu-architecture")
                                             else o for o in options))
    return compile_with_log(src)[0].decode()


# The element path's choice per tile in a token order (templates/forward_tile.cu.j2): the tile's keys mapped from
# its first key's raster position (whole patches of a band), or each key mapped on its own. Both are in the
# kernel; the probe keeps one, to count what a tile of each kind runs.
BRANCH = "if (!MASK_RASTER_ORDER || base >= 0)"
WAYS = {"": None, "affine": "if (true)", "per key": "if (false)"}


def masking_instructions(mask, partial: str, way: str = "") -> tuple[int, str]:
    """(PTX instructions of one tile's masking per thread, the plan's path) for ``mask`` with ``partial``; ``way``:
    the element path's tiles of one kind (WAYS)."""
    kernel = mask.kernel_source(Options(partial_tiles=partial), narrow=True)   # the 32K bindings are narrow
    source = kernel.source
    if WAYS[way] is not None:
        assert BRANCH in source
        source = source.replace(BRANCH, WAYS[way])
    counts = []
    for call in (CALL, ""):
        counts.append(len(probe_body(ptx_of(source + PROBE.replace("{CALL}", call), kernel.options))))
    return counts[0] - counts[1], kernel.plan.partial_tiles


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--masks", default="clear:8x16,clear,neighborhood:8x1,neighborhood,video:8x16,video,sliding_tile",
                    help="MASK[:ORDER],...: examples/MASK.mask, in the token order ORDER (default raster)")
    args = ap.parse_args()
    root = Path(__file__).resolve().parent.parent
    print("| mask | order | bits (static PTX, lower bound) | elements: tile of whole patches | elements: keys mapped "
          "one by one |")
    print("|---|---|---|---|---|")
    for item in args.masks.split(","):
        name, _, order = item.partition(":")
        mask = maskc.load(root / "examples" / f"{name}.mask")
        if order:
            mask = in_order(mask, order)
        bits, path = masking_instructions(mask, "bits")
        assert path == "bits"
        ways = ("",) if not order else ("affine", "per key") if mask.order.cols % 8 == 0 else ("per key",)
        counts = {w: masking_instructions(mask, "elements", w) for w in ways}
        assert {p for _, p in counts.values()} == {"elements"}, counts
        whole = counts.get("affine", counts.get(""))       # tiles of whole patches (in raster: every tile)
        per_key = counts.get("per key")
        print(f"| {name} | {order or 'raster'} | {bits} | {whole[0] if whole else '-'} | "
              f"{per_key[0] if per_key else '-'} |")


if __name__ == "__main__":
    main()
