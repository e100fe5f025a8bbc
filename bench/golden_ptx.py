"""Whether a template or emitter change changed the compiled code: the PTX of every golden kernel
(tests/test_golden.py's cases), compiled on the CPU by NVRTC (compute_90a), fingerprinted and compared.

    python bench/golden_ptx.py --save /tmp/before.json          # on the tree before the change
    python bench/golden_ptx.py --compare /tmp/before.json       # after it: the kernels whose PTX changed

For refactors without a GPU: equal PTX (comments and line information left out) is the same kernel, so the GPU
tests and the timings of the tree before still hold. A kernel whose PTX differs only in the order of its lines
(independent instructions scheduled elsewhere, registers renamed the same way) is reported as "reordered";
anything else as "changed", with its first differing line. ptxas schedules and allocates registers again, so
"reordered" is very likely the same SASS, but only a GPU run (or the SASS) says so.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

from maskc.codegen.emit import compile_with_log, nvrtc_options  # noqa: E402
from maskc.kernel_ir import KernelSource  # noqa: E402
from test_golden import CASES, golden_path, render  # noqa: E402

_REGISTER = re.compile(r"%[a-z]+\d+")


def ptx_lines(source: str) -> list[str]:
    """The PTX of ``source`` for compute_90a, without comments, blank lines and debug line information."""
    options = tuple("--gpu-architecture=compute_90a" if o.startswith("--gpu-architecture") else o
                    for o in nvrtc_options("sm_90a"))
    ptx = compile_with_log(KernelSource(None, source, "golden", options))[0].decode()
    return [line for line in ptx.splitlines()
            if line.strip() and not line.lstrip().startswith(("//", ".loc", ".file"))]


def fingerprint(lines: list[str]) -> dict:
    """The PTX's hash, and the hash of its lines sorted with registers unnamed (equal when only the order of
    instructions and the names of registers differ)."""
    digest = lambda text: hashlib.sha256(text.encode()).hexdigest()[:16]   # noqa: E731
    return {"ptx": digest("\n".join(lines)), "unordered": digest("\n".join(sorted(_REGISTER.sub("%r", line)
                                                                                    for line in lines))),
            "lines": len(lines)}


def case_name(case) -> str:
    return str(golden_path(*case).relative_to(ROOT / "tests" / "golden"))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--save", type=Path, help="write the fingerprints of this tree's golden kernels")
    action.add_argument("--compare", type=Path, help="compare this tree's with fingerprints saved before")
    parser.add_argument("--only", default="", help="comma-separated substrings of the kernels' names to keep")
    args = parser.parse_args()
    keep = [s for s in args.only.split(",") if s]
    cases = [c for c in CASES if not keep or any(s in case_name(c) for s in keep)]
    prints = {case_name(c): fingerprint(ptx_lines(render(*c))) for c in cases}
    if args.save:
        args.save.write_text(json.dumps(prints, indent=1, sort_keys=True) + "\n")
        print(f"{len(prints)} kernels fingerprinted into {args.save}")
        return 0
    before = json.loads(args.compare.read_text())
    verdicts = {}
    for name, now in prints.items():
        old = before.get(name)
        verdicts[name] = ("new" if old is None else "same" if old["ptx"] == now["ptx"]
                          else "reordered" if old["unordered"] == now["unordered"] else "changed")
    for name, verdict in sorted(verdicts.items()):
        if verdict != "same":
            print(f"{verdict:9s} {name} ({before.get(name, {}).get('lines', '-')} -> {prints[name]['lines']} lines)")
    counts = {v: list(verdicts.values()).count(v) for v in ("same", "reordered", "changed", "new")}
    print(", ".join(f"{n} {v}" for v, n in counts.items() if n) + f" of {len(verdicts)} kernels")
    return 1 if counts["changed"] or counts["new"] else 0


if __name__ == "__main__":
    sys.exit(main())
