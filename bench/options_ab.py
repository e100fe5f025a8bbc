"""Two or more values of one Options field against each other, forward, backward and forward + backward through
autograd, alternated in one process: the stored path of PARTIAL tiles against the tile path (``--option
partial_tiles=bits,stored``, the default: bench/NOTES.md, session 13; this script was bench/stored_ab.py), the long
rows first or not (``--option long_rows_first=0,1``, session 14). B=1, H=16, D=128 bf16; the workloads' bindings in
maskc's default token order; do_bench medians over ``--rounds`` alternations; effective TF/s over visible pairs
(3.5x the forward's work for forward + backward, 2.5x for the backward). ``fwd_bwd_calls``: forward + backward as two
runtime calls, each moving its arrays into the token order (q, k and v twice), beside autograd's ``fwd_bwd``, whose
backward reuses the forward's moved q, k, v.

    python bench/options_ab.py [--option FIELD=V1,V2] [--lengths 32768,4096] [--masks clear,neighborhood,video]
                               [--rounds 2] [--out F]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402  (puts the checkout first on sys.path)

import maskc  # noqa: E402
from maskc import Options  # noqa: E402
from maskc.runtime import kernels as runtime  # noqa: E402

WORK = {"fwd": 1.0, "bwd": 2.5, "fwd_bwd": 3.5, "fwd_bwd_calls": 3.5}


def steps(bound, q, k, v, dout, options: Options) -> dict:
    """The three timed steps for ``options``."""
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    out = maskc.attention(qg, kg, vg, bound, options=options)
    def calls():
        o, lse = runtime.attention(q, k, v, bound, return_lse=True, options=options)
        return runtime.attention_backward(dout, q, k, v, o, lse, bound, options=options)

    return {"fwd": lambda: maskc.attention(q, k, v, bound, options=options),
            "fwd_bwd_calls": calls,
            "bwd": lambda: torch.autograd.grad(out, (qg, kg, vg), dout, retain_graph=True),
            "fwd_bwd": lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=options),
                                                   (qg, kg, vg), dout)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--option", default="partial_tiles=bits,stored",
                    help="an Options field and the values to alternate (switches as 0/1)")
    ap.add_argument("--lengths", default="32768")
    ap.add_argument("--masks", default="clear,neighborhood,video")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    field, _, values = args.option.partition("=")
    default = getattr(Options(), field)
    choices = [bool(int(x)) if isinstance(default, bool) else type(default)(x) if default is not None else x
               for x in values.split(",")]
    records = []
    gpu = torch.cuda.get_device_name()
    for S in map(int, args.lengths.split(",")):
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, dout = (torch.randn(1, 16, S, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                         for _ in range(4))
        for name in args.masks.split(","):
            bound = W.workload(name, S).bound()
            pairs = int(bound.visible_pairs())
            by = {c: steps(bound, q, k, v, dout, Options.from_environment().replace(**{field: c})) for c in choices}
            times: dict = {}
            for _ in range(args.rounds):
                for choice, timed in by.items():
                    for step, fn in timed.items():
                        times.setdefault((choice, step), []).append(W.bench_ms(fn, warmup=10, rep=100))
            for (choice, step), ms in times.items():
                best = min(ms)
                rec = dict(mask=name, seq_len=S, step=step, ms=best, samples=ms, gpu=gpu,
                           tflops=WORK[step] * 4 * 128 * pairs * 16 / (best * 1e-3) / 1e12, **{field: choice})
                records.append(rec)
                print(json.dumps(rec), flush=True)
            for step in WORK:
                first = min(times[(choices[0], step)])
                print(f"S={S} {name:13s} {step:13s} " + "  ".join(
                    f"{field}={c} {min(times[(c, step)]):.3f} ms ({first / min(times[(c, step)]):.2f}x)"
                    for c in choices))
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
