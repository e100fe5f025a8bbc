"""A first look at the Hopper forward kernels on the GPU, before the test suite: for every engine and head dims
64/128, the relative error of LSE (which depends on S = Q K^T alone) and of O (which also needs P V) against
torch float64, on causal and document masks with ragged lengths. A wrong LSE points at the Q/K operands, a
right LSE with a wrong O at the V operand. Prints one line per case; exits non-zero on a failure.

    python bench/wgmma_probe.py [ENGINE ...]      (default: every engine; wgmma_tma with and without ping-pong)

The probe's options are the product's (Options()) but for the tiles and the ping-pong switch, whatever the
environment says.

Each case runs three times: the persistent kernel resets its work counter at the end of a launch, and a
second launch that found it wrong would skip work items (outputs differing between calls).
"""
import argparse
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]
import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from maskc.kernel_ir import ENGINES  # noqa: E402
from maskc.runtime import attention  # noqa: E402
from maskc.codegen.schedule import choose_tiles  # noqa: E402


def reference(q, k, v, bound, scale):
    """(O, LSE) in float64, head by head: (H, S, D), (H, S)."""
    vis = torch.as_tensor(bound.dense(0, 0), device="cuda")
    outs, lses = [], []
    for h in range(q.shape[1]):
        s = (q[0, h].double() @ k[0, h].double().T) * scale
        s = s.masked_fill(~vis, -math.inf)
        lse = torch.logsumexp(s, dim=-1)
        outs.append(torch.exp(s - lse[:, None]).nan_to_num(0.0) @ v[0, h].double())
        lses.append(lse)
    return torch.stack(outs), torch.stack(lses)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser(description="A first look at the forward kernels on the GPU (see the module "
                                 "docstring); exits 1 on a wrong or failed case.")
    ap.add_argument("engines", nargs="*", metavar="ENGINE",
                    help=f"forward engines to probe ({', '.join(ENGINES)}; default: all)")
    engines = ap.parse_args().engines or list(ENGINES)
    if set(engines) - set(ENGINES):
        ap.error(f"unknown engine(s) {sorted(set(engines) - set(ENGINES))}; engines: {', '.join(ENGINES)}")
    # (engine, ping-pong): wgmma_tma with and without its consumer warpgroups taking turns
    runs = [(e, pp) for e in engines for pp in ((False, True) if e == "wgmma_tma" else (False,))]
    ok = True
    torch.manual_seed(0)
    # (mask, parameters, S, heads): the last has more work items than SMs, in several L2 sections
    for name, params, S, H in [("causal", {}, 1000, 1), ("document", {"docs": [300, 400, 300]}, 1000, 1),
                               ("causal", {}, 4096, 16)]:
        bound = maskc.load(ROOT / "examples" / f"{name}.mask").bind(seq_len=S, **params)
        for D in (64, 128, 256):
            q, k, v = (torch.randn(1, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
            ref_o, ref_lse = reference(q, k, v, bound, D ** -0.5)
            for engine, pingpong in runs:
                label = engine + ("/pingpong" if pingpong else "")
                try:
                    options = Options(tiles=choose_tiles(D, "bf16", engine=engine), pingpong=pingpong)
                    o, lse = attention(q, k, v, bound, return_lse=True, options=options)
                    again = [attention(q, k, v, bound, return_lse=True, options=options) for _ in range(2)]
                    torch.cuda.synchronize()
                except Exception as exc:   # a launch failure: report it and go on to the next engine
                    ok = False
                    print(f"{name:9s} S={S:5d} D={D:3d} {label:20s}: FAILED {exc!r}"[:400], flush=True)
                    continue
                e_lse, e_o = rel(lse[0].double(), ref_lse), rel(o[0].double(), ref_o)
                same = all(torch.equal(o, o2) and torch.equal(lse, l2) for o2, l2 in again)
                good = e_lse < 1e-2 and e_o < 1e-2 and same
                ok &= good
                print(f"{name:9s} S={S:5d} D={D:3d} {label:20s}: LSE rel err {e_lse:.2e}, O rel err {e_o:.2e} "
                      f"{'' if same else 'REPEAT DIFFERS '}{'ok' if good else 'WRONG'}", flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
