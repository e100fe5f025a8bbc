"""Backward attention benchmark on the GPU: maskc vs FlexAttention's compiled backward (Triton and FA4
backends, hand-written mask_mods), FA4 where it has the mask (causal, sliding window; varlen for documents)
and SDPA cuDNN (causal).

B=1, H=16, D=128 (--head-dim: 64 or 256 too), bf16, the masks of bench_fwd.py (bench/workloads.py), the
environment's options (for instance MASKC_BWD_DQ_REDUCTION) but the dK/dV engine, which is the schedule's, then
each of --engines.
Median of triton.testing.do_bench of
- `bwd`: the backward alone. maskc: ``runtime.attention_backward`` from a stored O and LSE (the fast mode,
  impl `maskc`, and the deterministic one, `maskc_det`, and `maskc_det_wave` in its other launch order,
  ``Options(dq_turn_order="wave")``, and `maskc_det_kernel` with dQ by its own kernel,
  ``Options(deterministic_dq="kernel")``); Flex and cuDNN: ``torch.autograd.grad`` of a stored
  forward output with ``retain_graph``;
- `fwd_bwd`: forward and backward through autograd (``maskc.attention`` on torch tensors; Flex-FA4 and FA4
  only here).
Effective TF/s counts visible pairs only: 2.5 × the forward's 4·D per pair for `bwd`, 3.5 × for `fwd_bwd`.
maskc's gradients are checked against Flex's in the same run (`correct`: every gradient within 3e-2).
`maskc` records time the schedule's dK/dV engine; `maskc_<engine>` records (`bwd`, fast mode) the other
engines of --engines (maskc.kernel_ir.BACKWARD_ENGINES), checked the same way.
`fwd_bwd` records also carry `extra_bytes`: the peak device memory a step allocates beyond Q, K, V, O, dO and
the gradients (torch's allocator counters around one call), and maskc's its `token_order` (maskc.ordered: the
environment's MASKC_TOKEN_ORDER, default auto, gathers included); `maskc_raster` is forward + backward in the
raster order, `maskc_preordered` on inputs already in the auto order (no gathers), both checked against Flex.
Writes its records (same keys as bench_fwd.py) to --out and prints a markdown table last.

    python bench/bench_bwd.py [--lengths 4096,16384,32768] [--masks causal,...] [--engines wgmma,...]
                              [--head-dim 256]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from workloads import (ALL_MASKS, B, D, H, ROOT, bench_ms, compiled_flex, count_pairs, fa4_module, first,  # noqa: E402
                       flex_functions, workload, write_records)

import maskc  # noqa: E402  (workloads put the checkout first on sys.path)
from maskc.runtime import kernels as runtime  # noqa: E402
from maskc.runtime import state  # noqa: E402
from maskc.kernel_ir import BACKWARD_ENGINES  # noqa: E402
from maskc.codegen.schedule import choose_backward_tiles  # noqa: E402
from maskc.ordered import token_order  # noqa: E402

WORK = {"bwd": 2.5, "fwd_bwd": 3.5}   # work relative to the forward's 4·D FLOPs per visible pair


def rel(a, b) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _against(grads, reference):
    """(relative error per gradient, whether all are within 3e-2 and free of NaN) against Flex's gradients; (None,
    None) without them."""
    if reference is None:
        return None, None
    errs = [rel(a, b) for a, b in zip(grads, reference)]
    return errs, all(e <= 3e-2 for e in errs) and not any(torch.isnan(g).any().item() for g in grads)


def extra_bytes(step, kept_bytes: int) -> int:
    """Peak device bytes one call of ``step`` (a forward + backward) allocates beyond ``kept_bytes`` (O and the
    gradients, which the caller keeps): the memory it needs besides Q, K, V, O, dO and the gradients."""
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del result
    return peak - base - kept_bytes


def _fa4_peers(w, flex_fa4, fa4, block_mask, qg, kg, vg, dout) -> dict:
    """Forward+backward steps of the FA4-based peers that have this workload: Flex on its FA4 backend (the
    hand-written mask_mod's block mask), FA4 natively (causal, sliding window) or varlen (documents)."""
    steps = {}
    if flex_fa4 is not None:
        steps["flex_fa4"] = lambda: torch.autograd.grad(flex_fa4(qg, kg, vg, block_mask=block_mask), (qg, kg, vg), dout)
    if fa4 is None:
        return steps
    S, D = qg.shape[2], qg.shape[3]
    q4, k4, v4 = (x.detach().transpose(1, 2).contiguous().requires_grad_() for x in (qg, kg, vg))   # (B, S, H, D)
    dout4 = dout.transpose(1, 2).contiguous()
    kw = w.fa4_native()
    if kw is not None:
        steps["fa4"] = lambda: torch.autograd.grad(first(fa4.flash_attn_func(q4, k4, v4, **kw)), (q4, k4, v4), dout4)
    if w.name == "document":
        cu = w.tables["cu_seqlens"]
        maxlen = int((cu[1:] - cu[:-1]).max())
        qv, kv, vv = (x.view(S, H, D) for x in (q4, k4, v4))
        steps["fa4_varlen"] = lambda: torch.autograd.grad(first(fa4.flash_attn_varlen_func(
            qv, kv, vv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen, causal=True)),
            (q4, k4, v4), dout4.view(S, H, D))
    return steps


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="4096,16384,32768")
    ap.add_argument("--masks", default=",".join(ALL_MASKS))
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "latest_bwd.json"))
    ap.add_argument("--engines", default=",".join(BACKWARD_ENGINES),
                    help="the other dK/dV engines to time beside the schedule's")
    ap.add_argument("--head-dim", type=int, default=D)
    args = ap.parse_args()
    head_dim = args.head_dim
    default = maskc.Options.from_environment().replace(backward_engine=None)   # the schedule's engine first
    engine = choose_backward_tiles(head_dim, "bf16", state.capability(torch.cuda.current_device(), default)).engine
    others = [e for e in args.engines.split(",") if e and e != engine]

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    flex, gpu, date = compiled_flex()
    _, flex_fa4 = flex_functions()
    fa4 = fa4_module()
    records = []

    def record(mask, S, impl, pass_, ms, pairs, correct=None, **extra):
        tf = WORK[pass_] * 4 * head_dim * pairs * B * H / (ms * 1e-3) / 1e12
        rec = {"mask": mask, "seq_len": S, "impl": impl, "pass": pass_, "ms": ms, "tflops": tf,
               "correct": correct, "gpu": gpu, "date": date, "head_dim": head_dim, **extra}
        records.append(rec)
        print(json.dumps(rec), flush=True)

    gen = torch.Generator(device="cuda").manual_seed(0)
    for S in (int(x) for x in args.lengths.split(",") if x):
        q, k, v, dout = (torch.randn(B, H, S, head_dim, device="cuda", dtype=torch.bfloat16, generator=gen)
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
            waves = default.replace(dq_turn_order="wave")      # the deterministic mode's other launch order
            grads_wave = runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True, options=waves)
            own_dq = default.replace(deterministic_dq="kernel")   # the deterministic mode with dQ's own kernel
            grads_own = runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True, options=own_dq)
            torch.cuda.synchronize()
            ms = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, options=default), **reps)
            ms_det = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True,
                                                                 options=default), **reps)
            ms_wave = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True,
                                                                  options=waves), **reps)
            ms_own = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, deterministic=True,
                                                                 options=own_dq), **reps)
            ms_fb = bench_ms(lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=default),
                                                         (qg, kg, vg), dout), **reps)

            bm = create_block_mask(w.mask_mod(), None, None, S, S, device="cuda")     # the hand-written mask_mod
            try:
                o_flex = flex(qg, kg, vg, block_mask=bm)
                flex_grads = torch.autograd.grad(o_flex, (qg, kg, vg), dout, retain_graph=True)
            except Exception as exc:   # noqa: BLE001 - Flex-Triton without a config for this head dim: no oracle
                print(f"# flex {name} S={S} D={head_dim}: {exc!r}"[:400], flush=True)
                o_flex = flex_grads = None
            errs, ok = _against(grads, flex_grads)
            errs_det, ok_det = _against(grads_det, flex_grads)
            errs_wave, ok_wave = _against(grads_wave, flex_grads)
            errs_own, ok_own = _against(grads_own, flex_grads)
            extra = {"params": w.short_params()}
            record(name, S, "maskc", "bwd", ms, pairs, ok, rel_err_vs_flex=errs, **extra)
            record(name, S, "maskc_det", "bwd", ms_det, pairs, ok_det, rel_err_vs_flex=errs_det)
            record(name, S, "maskc_det_wave", "bwd", ms_wave, pairs, ok_wave, rel_err_vs_flex=errs_wave)
            record(name, S, "maskc_det_kernel", "bwd", ms_own, pairs, ok_own, rel_err_vs_flex=errs_own)
            if o_flex is not None:
                ms_flex = bench_ms(lambda: torch.autograd.grad(o_flex, (qg, kg, vg), dout, retain_graph=True), **reps)
                ms_flex_fb = bench_ms(lambda: torch.autograd.grad(flex(qg, kg, vg, block_mask=bm), (qg, kg, vg), dout),
                                      **reps)
                record(name, S, "flex", "bwd", ms_flex, pairs)
                record(name, S, "flex", "fwd_bwd", ms_flex_fb, pairs)
            kept = 4 * q.numel() * q.element_size()          # O and the three gradients
            fwd_bwd = lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=default),   # noqa: E731
                                                  (qg, kg, vg), dout)
            record(name, S, "maskc", "fwd_bwd", ms_fb, pairs, ok, extra_bytes=extra_bytes(fwd_bwd, kept),
                   token_order=_order_name(bound, default))
            for impl, step, back in _order_variants(bound, default, q, k, v, dout):
                got = [g.index_select(2, back) if back is not None else g for g in step()]
                errs_v, ok_v = _against(got, flex_grads)
                record(name, S, impl, "fwd_bwd", bench_ms(step, **reps), pairs, ok_v, rel_err_vs_flex=errs_v)
                del got
            for other in others:
                options = default.replace(backward_engine=other)
                try:
                    got = runtime.attention_backward(dout, q, k, v, o, lse, bound, options=options)
                    errs_o, ok_o = _against(got, flex_grads)
                    ms_o = bench_ms(lambda: runtime.attention_backward(dout, q, k, v, o, lse, bound, options=options),
                                    **reps)
                    record(name, S, f"maskc_{other}", "bwd", ms_o, pairs, ok_o, rel_err_vs_flex=errs_o)
                    ms_ofb = bench_ms(lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=options),
                                                                  (qg, kg, vg), dout), **reps)
                    record(name, S, f"maskc_{other}", "fwd_bwd", ms_ofb, pairs, ok_o)
                    del got
                except Exception as exc:   # an engine that fails is reported, the others still run
                    print(f"# {name} S={S} engine {other}: {type(exc).__name__}: {exc}", flush=True)
            del o_flex, flex_grads
            for impl, step in _fa4_peers(w, flex_fa4, fa4, bm, qg, kg, vg, dout).items():
                try:
                    step()
                    record(name, S, impl, "fwd_bwd", bench_ms(step, **reps), pairs,
                           extra_bytes=extra_bytes(step, 4 * q.numel() * q.element_size()))
                except Exception as exc:   # noqa: BLE001 - a peer that cannot run this case is reported, not fatal
                    print(f"# {impl} {name} S={S}: {exc!r}"[:400], flush=True)

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
            del bound, o, lse, grads, grads_det, grads_wave, grads_own
        del q, k, v, dout, qg, kg, vg
        torch.cuda.empty_cache()

    write_records(args.out, records)
    print_table(records)


def _order_name(bound, options) -> str:
    """The token order maskc runs ``bound`` in under ``options`` (maskc.ordered)."""
    ordered = token_order(bound, options)
    return "raster" if ordered is None else ordered.order.name


def _order_variants(bound, options, q, k, v, dout):
    """Where ``options`` pick a token order for ``bound``: (impl, forward + backward step, index back to raster or
    None) of maskc in the raster order (``maskc_raster``) and on inputs already in maskc's order
    (``maskc_preordered``: a model that keeps its image tokens in patch order; no gathers per call)."""
    ordered = token_order(bound, options)
    if ordered is not None:
        raster = options.replace(token_order="raster")
        qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
        yield "maskc_raster", (lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound, options=raster),
                                                           (qg, kg, vg), dout)), None
        perm = torch.from_numpy(ordered.permutation).cuda()
        qp, kp, vp = (x.detach().index_select(2, perm).requires_grad_() for x in (q, k, v))
        dp = dout.index_select(2, perm)
        yield "maskc_preordered", (lambda: torch.autograd.grad(maskc.attention(qp, kp, vp, ordered.inner,
                                                                               options=options), (qp, kp, vp), dp)), \
            torch.from_numpy(ordered.inverse).cuda()


def print_table(records):
    by = {(r["mask"], r["seq_len"], r["impl"], r["pass"]): r for r in records}
    fmt = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print("\n| mask | S | pass | maskc ms | TF/s | det ms | flex ms | TF/s | maskc/flex | cuDNN causal TF/s | correct "
          "| other engines, token orders TF/s (correct) |")
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

    def mib(r):
        return fmt(None if r is None or r.get("extra_bytes") is None else r["extra_bytes"] / 2**20, 0)

    print("\n| mask | S | fwd+bwd TF/s: maskc | flex_fa4 | fa4 | fa4_varlen | maskc / flex_fa4 | maskc / fa4 "
          "| extra MiB: maskc | flex_fa4 | fa4 (varlen) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (mask, S, impl, pass_), r in by.items():
        if impl != "maskc" or pass_ != "fwd_bwd":
            continue
        peer = {name: by.get((mask, S, name, pass_)) for name in ("flex_fa4", "fa4", "fa4_varlen")}
        fa4 = peer["fa4"] or peer["fa4_varlen"]
        print(f"| {mask} | {S} | {r['tflops']:.0f} | " + " | ".join(fmt(p and p["tflops"], 0) for p in peer.values())
              + f" | {fmt(peer['flex_fa4'] and r['tflops'] / peer['flex_fa4']['tflops'], 2)} | "
              f"{fmt(fa4 and r['tflops'] / fa4['tflops'], 2)} | {mib(r)} | {mib(peer['flex_fa4'])} | {mib(fa4)} |")


def alternatives(records, mask, S, pass_):
    """'engine TF/s (correct)' for each maskc_<engine> record of this row."""
    return [f"{r['impl'][len('maskc_'):]} {r['tflops']:.0f} ({r['correct']})" for r in records
            if (r["mask"], r["seq_len"], r["pass"]) == (mask, S, pass_) and r["impl"].startswith("maskc_")
            and r["impl"] != "maskc_det"]


if __name__ == "__main__":
    main()
