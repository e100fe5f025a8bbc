"""Backward attention benchmark on the GPU: maskc vs FlexAttention's compiled backward vs SDPA cuDNN (causal).

B=1, H=16, D=128, bf16, the masks of bench_fwd.py (bench/workloads.py), the environment's options (for
instance MASKC_BWD_DQ_REDUCTION) but the dK/dV engine, which is the schedule's, then each of --engines.
Median of triton.testing.do_bench of
- `bwd`: the backward alone. maskc: ``runtime.attention_backward`` from a stored O and LSE (the fast mode,
  impl `maskc`, and the deterministic one, `maskc_det`); Flex and cuDNN: ``torch.autograd.grad`` of a stored
  forward output with ``retain_graph``;
- `fwd_bwd`: forward and backward through autograd (``maskc.attention`` on torch tensors).
Effective TF/s counts visible pairs only: 2.5 × the forward's 4·D per pair for `bwd`, 3.5 × for `fwd_bwd`.
maskc's gradients are checked against Flex's in the same run (`correct`: every gradient within 3e-2).
`maskc` records time the schedule's dK/dV engine; `maskc_<engine>` records (`bwd`, fast mode) the other
engines of --engines (maskc.kernel_ir.BACKWARD_ENGINES), checked the same way.
Writes its records (same keys as bench_fwd.py) to --out and prints a markdown table last.

    python bench/bench_bwd.py [--lengths 4096,32768] [--masks causal,...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import (ALL_MASKS, B, D, H, ROOT, bench_ms, compiled_flex, count_pairs, workload,  # noqa: E402
                       write_records)

import maskc  # noqa: E402  (workloads put the checkout first on sys.path)
from maskc import runtime  # noqa: E402
from maskc.kernel_ir import BACKWARD_ENGINES  # noqa: E402
from maskc.schedule import choose_backward_tiles  # noqa: E402

WORK = {"bwd": 2.5, "fwd_bwd": 3.5}   # work relative to the forward's 4·D FLOPs per visible pair


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--masks", default=",".join(ALL_MASKS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "latest_bwd.json"))
    ap.add_argument("--engines", default=",".join(BACKWARD_ENGINES),
                    help="the other dK/dV engines to time beside the schedule's")
    args = ap.parse_args()
    default = maskc.Options.from_environment().replace(backward_engine=None)   # the schedule's engine first
    engine = choose_backward_tiles(D, "bf16", runtime._capability(torch.cuda.current_device(), default)).engine
    others = [e for e in args.engines.split(",") if e and e != engine]

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    flex, gpu, date = compiled_flex()
    records = []

    def record(mask, S, impl, pass_, ms, pairs, correct=None, **extra):
        tf = WORK[pass_] * 4 * D * pairs * B * H / (ms * 1e-3) / 1e12
        rec = {"mask": mask, "seq_len": S, "impl": impl, "pass": pass_, "ms": ms, "tflops": tf,
               "correct": correct, "gpu": gpu, "date": date, **extra}
        records.append(rec)
        print(json.dumps(rec), flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    for S in (int(x) for x in args.lengths.split(",") if x):
        q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen)
                         for _ in range(4))
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        reps = dict(warmup=10, rep=30) if S <= 4096 else dict(warmup=10, rep=100)
        for name in (m for m in args.masks.split(",") if m):
            w = workload(name, S)
            bound = w.bound()
            pairs = count_pairs(bound)

            o, lse = runtime.attention(q, k, v, bound, return_lse=True, options=default)
            grads = runtime.attention_backward(dout, q, k, v, o, lse, bound, options=default)
            grads_det = runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True, options=default)
            torch.cuda.synchronize()
            ms = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, options=default), **reps)
            ms_det = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True,
                                                                 options=default), **reps)
            ms_fb = bench_ms(lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=default),
                                                         (qg, kg, vg), dout), **reps)

            bm = create_block_mask(bound.flex_mask_mod("cuda"), None, None, S, S, device="cuda")
            o_flex = flex(qg, kg, vg, block_mask=bm)
            flex_grads = torch.autograd.grad(o_flex, (qg, kg, vg), dout, retain_graph=True)
            errs = [rel(a, b) for a, b in zip(grads, flex_grads)]
            errs_det = [rel(a, b) for a, b in zip(grads_det, flex_grads)]
            ok = all(e <= 3e-2 for e in errs) and not any(torch.isnan(g).any().item() for g in grads)
            ok_det = all(e <= 3e-2 for e in errs_det)
            ms_flex = bench_ms(lambda: torch.autograd.grad(o_flex, (qg, kg, vg), dout, retain_graph=True), **reps)
            ms_flex_fb = bench_ms(lambda: torch.autograd.grad(flex(qg, kg, vg, block_mask=bm), (qg, kg, vg), dout),
                                  **reps)
            extra = {"params": w.short_params()}
            record(name, S, "maskc", "bwd", ms, pairs, ok, rel_err_vs_flex=errs, **extra)
            record(name, S, "maskc_det", "bwd", ms_det, pairs, ok_det, rel_err_vs_flex=errs_det)
            record(name, S, "flex", "bwd", ms_flex, pairs)
            record(name, S, "maskc", "fwd_bwd", ms_fb, pairs, ok)
            record(name, S, "flex", "fwd_bwd", ms_flex_fb, pairs)
            for other in others:
                options = default.replace(backward_engine=other)
                try:
                    got = runtime.attention_backward(dout, q, k, v, o, lse, bound, options=options)
                    errs_o = [rel(a, b) for a, b in zip(got, flex_grads)]
                    ok_o = all(e <= 3e-2 for e in errs_o) and not any(torch.isnan(g).any().item() for g in got)
                    ms_o = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, options=options),
                                    **reps)
                    record(name, S, f"maskc_{other}", "bwd", ms_o, pairs, ok_o, rel_err_vs_flex=errs_o)
                    del got
                except Exception as exc:   # an engine that fails is reported, the others still run
                    print(f"# {name} S={S} engine {other}: {type(exc).__name__}: {exc}", flush=True)
            del o_flex, flex_grads

            if name == "causal":
                sdpa = torch.nn.functional.scaled_dot_product_attention
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    try:
                        o_c = sdpa(qg, kg, vg, is_causal=True)
                        ms_c = bench_ms(lambda: torch.autograd.grad(o_c, (qg, kg, vg), dout, retain_graph=True),
                                        **reps)
                        ms_cfb = bench_ms(lambda: torch.autograd.grad(sdpa(qg, kg, vg, is_causal=True), (qg, kg, vg),
                                                                      dout), **reps)
                        record(name, S, "cudnn", "bwd", ms_c, pairs)
                        record(name, S, "cudnn", "fwd_bwd", ms_cfb, pairs)
                        del o_c
                    except RuntimeError as exc:
                        print(f"# cuDNN failed: {exc}", flush=True)
            del bound, o, lse, grads, grads_det
        del q, k, v, dout, qg, kg, vg
        torch.cuda.empty_cache()

    write_records(args.out, records)
    print_table(records)


def print_table(records):
    by = {(r["mask"], r["seq_len"], r["impl"], r["pass"]): r for r in records}
    fmt = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print("\n| mask | S | pass | maskc ms | TF/s | det ms | flex ms | TF/s | maskc/flex | cuDNN causal TF/s | correct "
          "| other engines TF/s (correct) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mask, S, impl, pass_), r in by.items():
        if impl != "maskc":
            continue
        f = by.get((mask, S, "flex", pass_))
        d = by.get((mask, S, "maskc_det", pass_))
        c = by.get(("causal", S, "cudnn", pass_))
        print(f"| {mask} | {S} | {pass_} | {fmt(r['ms'])} | {fmt(r['tflops'], 0)} | {fmt(d and d['ms'])} | "
              f"{fmt(f and f['ms'])} | {fmt(f and f['tflops'], 0)} | {fmt(f and r['tflops'] / f['tflops'], 2)} | "
              f"{fmt(c and c['tflops'], 0)} | {r['correct']} | {', '.join(alternatives(records, mask, S, pass_))} |")


def alternatives(records, mask, S, pass_):
    """'engine TF/s (correct)' for each maskc_<engine> record of this row."""
    return [f"{r['impl'][len('maskc_'):]} {r['tflops']:.0f} ({r['correct']})" for r in records
            if (r["mask"], r["seq_len"], r["pass"]) == (mask, S, pass_) and r["impl"].startswith("maskc_")
            and r["impl"] != "maskc_det"]


if __name__ == "__main__":
    main()
