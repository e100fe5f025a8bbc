"""Which machine instructions the forward kernels became: for each engine (causal, D=128, bf16) the rendered
source is compiled by nvcc to a cubin and disassembled with cuobjdump, and the instruction classes that tell
the engines apart are counted (HGMMA: wgmma; HMMA: mma.sync; UTMALDG: copy-engine loads; LDGSTS: cp.async;
SYNCS: mbarrier operations). Needs nvcc and cuobjdump on the PATH (the GPU machine has them).

    python bench/sass_census.py [OUTDIR]
"""
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.emit import emit_kernel  # noqa: E402
from maskc.kernel_ir import ENGINES  # noqa: E402
from maskc.schedule import choose_tiles  # noqa: E402

CLASSES = ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "SYNCS", "BAR", "MUFU.EX2")
out_dir = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp())
mask = maskc.load(ROOT / "examples" / "causal.mask")
for engine in ENGINES:
    t = choose_tiles(128, "bf16", engine=engine)
    src = emit_kernel(mask.kernel_spec(head_dim=128, dtype="bf16", block_m=t.block_m, block_n=t.block_n,
                                       num_warps=t.num_warps, engine=engine))
    cu, cubin = out_dir / f"{engine}.cu", out_dir / f"{engine}.cubin"
    cu.write_text(src.source)
    build = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", "-o", str(cubin), str(cu)],
                           capture_output=True, text=True)
    if build.returncode:
        print(f"{engine:10s}: nvcc failed: {build.stderr[-300:]}")
        continue
    sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
    (out_dir / f"{engine}.sass").write_text(sass)
    ops = Counter(m.group(1) for m in re.finditer(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass))
    counts = {c: sum(n for op, n in ops.items() if op == c or op.startswith(c + ".")) for c in CLASSES}
    print(f"{engine:10s}: {sum(ops.values()):6d} instructions; " + ", ".join(f"{c} {n}" for c, n in counts.items()))
