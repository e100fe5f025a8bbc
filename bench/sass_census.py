"""Which machine instructions the forward kernels became: for each engine (causal, D=128, bf16) the rendered
source is compiled by nvcc to a cubin and disassembled with cuobjdump, and the instruction classes that tell
the engines apart are counted (HGMMA: wgmma; HMMA: mma.sync; UTMALDG: copy-engine loads; LDGSTS: cp.async;
SYNCS: mbarrier operations), each with the schedule's tiles for it and the product's options. Needs nvcc
and cuobjdump on the PATH (the GPU machine has them).

    python bench/sass_census.py [OUTDIR]
"""
import argparse
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.kernel_ir import ENGINES  # noqa: E402

CLASSES = ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "SYNCS", "BAR", "MUFU.EX2")
INSTRUCTION = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)")   # its opcode, after a predicate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("outdir", nargs="?", help="where the .cu, .cubin and .sass files go (default: a temporary folder)")
    args = ap.parse_args()
    out_dir = Path(args.outdir) if args.outdir else Path(tempfile.mkdtemp())
    out_dir.mkdir(parents=True, exist_ok=True)
    mask = maskc.load(ROOT / "examples" / "causal.mask")
    for engine in ENGINES:
        src = mask.kernel_source(head_dim=128, dtype="bf16", engine=engine)
        cu, cubin = out_dir / f"{engine}.cu", out_dir / f"{engine}.cubin"
        cu.write_text(src.source)
        build = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", "-o", str(cubin), str(cu)],
                               capture_output=True, text=True)
        if build.returncode:
            print(f"{engine:10s}: nvcc failed: {build.stderr[-300:]}")
            continue
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
        (out_dir / f"{engine}.sass").write_text(sass)
        ops = Counter(m.group(1) for m in INSTRUCTION.finditer(sass))
        counts = {c: sum(n for op, n in ops.items() if op == c or op.startswith(c + ".")) for c in CLASSES}
        print(f"{engine:10s}: {sum(ops.values()):6d} instructions; " + ", ".join(f"{c} {n}" for c, n in counts.items()))


if __name__ == "__main__":
    main()
