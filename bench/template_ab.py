"""Kernel template variants side by side in one process, each checked against the first and timed in turns.

Each variant is a directory of templates (a copy of ``templates/`` with a change), optionally with the wgmma_tma
forward's register split overridden; each loads its
own compiled mask (so its own kernels, built while ``maskc.codegen.emit.template_dir`` points at its directory),
checks its outputs and gradients against the first variant's, and is timed in alternating rounds (the order
reversed every other round). B=1, H=16, D=128 (``--head-dim``), bf16, the masks of bench/workloads.py.

A template change can then be measured against the code it changes on the same GPU minutes apart, instead of two
processes or two runs (bench/NOTES.md session 16: this machine's timings drift ~5% over a minute, so read medians
over rounds, and prefer ncu's cycles for effects below that).

    python bench/template_ab.py base=templates new=/tmp/tpl_new [new2=DIR:24-240] [--masks causal,document]
        [--seq-len 32768] [--head-dim 128] [--rounds 5] [--forward-only] [--out results.json]

A variant is NAME=DIR or NAME=DIR:P-C (P producer and C consumer registers for the wgmma_tma forward).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

import maskc  # noqa: E402  (workloads put the checkout first on sys.path)
import maskc.codegen.descriptor_build as descriptor_build  # noqa: E402
import maskc.codegen.emit as emit  # noqa: E402
import maskc.codegen.moves as moves  # noqa: E402
import maskc.codegen.plan as plan  # noqa: E402
from maskc.runtime import kernels as runtime  # noqa: E402

REGISTERS = plan.tma_registers


def use_variant(spec: str) -> None:
    """Point the renderers (attention, descriptor builder, token moves) at DIR, and the register split at P-C,
    for kernels built from now on."""
    directory, _, registers = spec.partition(":")
    path = Path(directory).resolve()
    for renderer in (emit, descriptor_build, moves):
        renderer.template_dir = lambda: path
    emit._environment.cache_clear()
    if registers:
        split = tuple(int(x) for x in registers.split("-"))
        plan.tma_registers = lambda spec, split=split: split
    else:
        plan.tma_registers = REGISTERS


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("variants", nargs="+", help="NAME=DIR[:P-C]; the first is the reference")
    ap.add_argument("--masks", default="causal,sliding_window,document")
    ap.add_argument("--seq-len", type=int, default=32768)
    ap.add_argument("--head-dim", type=int, default=W.D)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--forward-only", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.variants)
    S = args.seq_len
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(W.B, W.H, S, args.head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
                     for _ in range(4))
    records = []
    for name in args.masks.split(","):
        w = W.workload(name, S)
        calls, results = {}, {}
        for var, spec in variants.items():
            use_variant(spec)
            bound = maskc.load(W.ROOT / "examples" / f"{w.example}.mask").bind(seq_len=S, **w.params)
            o, lse = runtime.attention(q, k, v, bound, return_lse=True)
            grads = () if args.forward_only else runtime.attention_backward(dout, q, k, v, o, lse, bound)
            torch.cuda.synchronize()
            results[var] = (o, *grads)
            calls[var] = (lambda b=bound: runtime.attention(q, k, v, b),
                          lambda b=bound, o=o, lse=lse: runtime.attention_backward(dout, q, k, v, o, lse, b))
        use_variant(next(iter(variants.values())))
        first = next(iter(results.values()))
        for var, got in results.items():
            same = [bool(torch.equal(a, b)) for a, b in zip(first, got)]
            # Reductions by atomics (dQ) differ in their last bits run to run: how far, relative to the largest value.
            apart = [float((a.float() - b.float()).abs().max() / a.float().abs().max().clamp_min(1e-30))
                     for a, b in zip(first, got)]
            print(f"{name} {var}: bit for bit the first variant's (O, dQ, dK, dV): {same}; largest difference "
                  f"over the largest value: {', '.join(f'{x:.1e}' for x in apart)}", flush=True)
        times: dict[str, tuple[list[float], list[float]]] = {var: ([], []) for var in variants}
        order = list(variants)
        for r in range(args.rounds):
            for var in order if r % 2 == 0 else order[::-1]:
                times[var][0].append(W.bench_ms(calls[var][0], warmup=5, rep=40))
                if not args.forward_only:
                    times[var][1].append(W.bench_ms(calls[var][1], warmup=3, rep=60))
        for var in variants:
            fwd, bwd = sorted(times[var][0]), sorted(times[var][1])
            rec = {"mask": name, "seq_len": S, "head_dim": args.head_dim, "variant": var, "templates": variants[var],
                   "fwd_ms": fwd[len(fwd) // 2], "fwd_all": fwd, "gpu": torch.cuda.get_device_name()}
            line = f"{name} {var}: forward {rec['fwd_ms']:.3f} ms (lowest {fwd[0]:.3f})"
            if bwd:
                rec.update(bwd_ms=bwd[len(bwd) // 2], bwd_all=bwd)
                line += f", backward {rec['bwd_ms']:.3f} ms (lowest {bwd[0]:.3f})"
            records.append(rec)
            print(line, flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
