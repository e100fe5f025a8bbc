"""Which machine instructions maskc's kernels became, without a GPU: each example's kernel (forward, or with
``--backward`` the backward's kernels) is rendered, compiled for sm_90a, disassembled, and per entry the
instruction classes that tell the engines apart are counted (HGMMA: wgmma; HMMA: mma.sync; UTMALDG: copy-engine
loads; LDGSTS: cp.async; SYNCS: mbarrier operations), with ptxas's registers and spills.

It also reads where ptxas put each wait for every outstanding product (``WARPGROUP.DEPBAR.LE gsb0, 0x0``): the
exponentials (MUFU.EX2) that come after one before the next product is issued are softmax work that waits for
the tensor cores instead of running beside them (bench/NOTES.md, session 16: the forward's overlapped pipeline
lost its overlap that way until ``softmax_before_wait``).

Toolchains: ``nvrtc`` (default; the CPU machine's): maskc's own build (NVRTC, ptxas's report in its log), then
``nvdisasm`` from the PATH or the ``nvidia-cuda-nvdisasm`` wheel (the test extra's); ``nvcc``: nvcc and cuobjdump
(the GPU machine has them).

    python bench/sass_census.py [causal softcap ...] [--head-dim 128] [--backward] [--engines ...]
        [--toolchain nvrtc|nvcc] [--out DIR]
"""
from __future__ import annotations

import argparse
import re
import struct
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc.codegen.emit import compile_with_log  # noqa: E402
from maskc.kernel_ir import BACKWARD_ENGINES, ENGINES  # noqa: E402

CLASSES = ("HGMMA", "HMMA", "UTMALDG", "LDGSTS", "SYNCS", "BAR", "MUFU.EX2")
LINE = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*)")   # opcode, operands
ENTRY = re.compile(r"(?:Function : |\.text\.)(\w+)")
PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)'")
PTXAS_USE = re.compile(r"Used (\d+) registers")
PTXAS_SPILL = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")


def tool(name: str) -> str | None:
    """``name`` on the PATH, else from the pip wheels (``nvidia/cu13/bin``)."""
    found = shutil.which(name)
    if found:
        return found
    try:
        import nvidia

        for root in nvidia.__path__:
            candidate = Path(root) / "cu13" / "bin" / name
            if candidate.exists():
                return str(candidate)
    except ImportError:
        pass
    return None


def build(src, base: Path, toolchain: str) -> tuple[str, str]:
    """(SASS text, ptxas's report) of a KernelSource, its files written next to ``base``."""
    base.with_suffix(".cu").write_text(src.source)
    cubin = base.with_suffix(".cubin")
    if toolchain == "nvcc":
        run = subprocess.run(["nvcc", "-arch=sm_90a", "-std=c++17", "-cubin", "-Xptxas", "-v", "-o", str(cubin),
                              str(base.with_suffix(".cu"))], capture_output=True, text=True)
        report = run.stderr
        if run.returncode:
            raise RuntimeError(report[-500:])
        sass = subprocess.run(["cuobjdump", "-sass", str(cubin)], capture_output=True, text=True).stdout
    else:
        binary, report = compile_with_log(src, ("--ptxas-options=-v",))
        cubin.write_bytes(whole_elf(binary))
        run = subprocess.run([tool("nvdisasm") or "nvdisasm", "-c", str(cubin)], capture_output=True, text=True)
        if run.returncode:
            raise RuntimeError(run.stderr[-500:])
        sass = run.stdout
    base.with_suffix(".sass").write_text(sass)
    return sass, report


def whole_elf(binary: bytes) -> bytes:
    """The cubin padded to the end its ELF header declares: CuPy's NVRTC binding returns it one byte short (as if
    it dropped a string's trailing NUL), which the driver loads but nvdisasm refuses as an invalid ELF file."""
    ph_offset, sh_offset = struct.unpack_from("<QQ", binary, 0x20)
    ph_size, ph_count, sh_size, sh_count = struct.unpack_from("<HHHH", binary, 0x36)
    end = max(ph_offset + ph_size * ph_count, sh_offset + sh_size * sh_count)
    return binary + bytes(max(0, end - len(binary)))


def by_entry(sass: str) -> dict[str, list[tuple[str, str]]]:
    """Each entry's instructions in program order, as (opcode, operands)."""
    entries: dict[str, list[tuple[str, str]]] = {}
    current = None
    for line in sass.splitlines():
        head = ENTRY.search(line)
        if head and ("Function :" in line or line.lstrip().startswith("//")):
            current = entries.setdefault(head.group(1), [])
            continue
        m = LINE.search(line)
        if m and current is not None:
            current.append((m.group(1), m.group(2)))
    return entries


def exponentials_after_waits(code: list[tuple[str, str]]) -> list[int]:
    """For each wait for every product (DEPBAR.LE gsb0, 0x0), the exponentials after it before the next product."""
    counts = []
    for i, (op, operands) in enumerate(code):
        if op.startswith("WARPGROUP.DEPBAR") and "gsb0, 0x0" in operands:
            n = 0
            for later, _ in code[i + 1:]:
                if later.startswith("HGMMA"):
                    break
                n += later.startswith("MUFU.EX2")
            counts.append(n)
    return counts


def ptxas_resources(report: str) -> dict[str, str]:
    """entry -> "R registers, S/L bytes spilled" from ptxas -v."""
    out, entry = {}, None
    for line in report.splitlines():
        if m := PTXAS_ENTRY.search(line):
            entry = m.group(1)
        elif entry and (m := PTXAS_SPILL.search(line)):
            out[entry] = f"spills {m.group(1)}/{m.group(2)} B"
        elif entry and (m := PTXAS_USE.search(line)):
            out[entry] = f"{m.group(1)} registers, " + out.get(entry, "")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("masks", nargs="*", default=["causal"], help="examples/<name>.mask")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--backward", action="store_true", help="the backward's kernels instead of the forward")
    ap.add_argument("--engines", default=None, help="comma-separated (default: every forward, or backward, engine)")
    ap.add_argument("--toolchain", choices=("nvrtc", "nvcc"), default="nvrtc")
    ap.add_argument("--out", help="where the .cu, .ptx, .cubin and .sass files go (default: a temporary folder)")
    args = ap.parse_args()
    out_dir = Path(args.out) if args.out else Path(tempfile.mkdtemp())
    out_dir.mkdir(parents=True, exist_ok=True)
    engines = args.engines.split(",") if args.engines else (BACKWARD_ENGINES if args.backward else ENGINES)
    options = maskc.Options.from_environment().replace(arch="sm_90a")
    for name in args.masks:
        mask = maskc.load(ROOT / "examples" / f"{name}.mask")
        for engine in engines:
            try:
                if args.backward:
                    src = mask.backward_source(options.replace(backward_engine=engine), head_dim=args.head_dim)
                else:
                    src = mask.kernel_source(options.replace(engine=engine), head_dim=args.head_dim)
                sass, report = build(src, out_dir / f"{name}_{'bwd' if args.backward else 'fwd'}_{engine}", args.toolchain)
            except (RuntimeError, ValueError) as exc:
                print(f"{name} {engine}: {exc}")
                continue
            resources = ptxas_resources(report)
            for entry, code in by_entry(sass).items():
                ops = Counter(op for op, _ in code)
                counts = {c: sum(n for op, n in ops.items() if op == c or op.startswith(c + ".")) for c in CLASSES}
                waits = exponentials_after_waits(code)
                print(f"{entry} ({engine}): {len(code)} instructions, {resources.get(entry, '?')}; "
                      + ", ".join(f"{c} {n}" for c, n in counts.items())
                      + f"; full waits {len(waits)}, exponentials after them {waits}")
    print(f"files in {out_dir}")


if __name__ == "__main__":
    main()
