"""Forward attention on the GPU: maskc against FlexAttention (Triton and FA4 backends), FA4 and cuDNN, side by
side in one process.

B=1, H=16, bf16; D=128 unless ``--head-dims`` says otherwise. Median of
``triton.testing.do_bench``. Effective TF/s = 4 * D * (visible pairs) * B * H / time. The peers run what their
users write by hand (bench/workloads.py): Flex a hand-written mask_mod with its own create_block_mask (built
outside the timing), FA4 its built-in causal and sliding-window masks, FA4 varlen the documents' cu_seqlens.
Every output is checked: against a float32 reference of the hand-written mask at S <= 4096, else against an
independent peer's (Flex-Triton, else FA4; ``err``, ``err_against``, ``correct`` = err <= 2e-2). Records (mask, seq_len, impl, pass, ms, tflops, correct,
err, gpu, date, params; maskc's with their ``token_order``) go to ``--out``; a table of ratios is printed last.

maskc's token orders (maskc.ordered): ``maskc`` runs the environment's (``MASKC_TOKEN_ORDER``, default ``auto``:
patches where they save work, the gathers of q, k, v and the output included in the time); where that is not
the raster order, ``maskc_raster`` runs the raster order and ``maskc_preordered`` maskc's order on q, k, v that
are already in it (a model that keeps its
image tokens in patch order between layers; the output checked after it is put back in raster order).
``moves`` times the order's moves alone, both ways side by side (pass ``moves_fwd``: q, k, v in and O back;
``moves_bwd``: dO, q, k, v, O, LSE in and dQ, dK, dV back): impl ``moves_torch`` one strided torch copy per array
(maskc.runtime.permute.to_order / from_order), ``moves_kernel`` one launch per direction
(maskc.runtime.moves); ``gbps`` = bytes read and written / time, ``correct`` = the same bytes.

``--partial-tiles bits,elements`` times maskc again with PARTIAL tiles masked each way (``Options.partial_tiles``:
``maskc[partial=...]``, and where the order is another, ``maskc_raster[partial=...]`` and
``maskc_preordered[partial=...]``), in the same process. ``--exp2-emulation 2,4`` likewise times maskc with 1
column tile in N of the wgmma_tma forward's softmax exponentials on the FMA pipe (``Options.exp2_emulation``:
``maskc[exp2_emulation=N]``).

    python bench/bench_fwd.py [--lengths 4096,32768] [--masks causal,...] [--impls maskc,flex,flex_fa4,fa4,moves,...]
        [--partial-tiles bits,elements] [--exp2-emulation 2,4]
"""
from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

from maskc import Options  # noqa: E402
from maskc.ordered import token_order  # noqa: E402
from maskc.runtime import attention  # noqa: E402
from maskc.runtime.permute import from_order, from_order_all, to_order, to_order_all  # noqa: E402
from maskc.codegen.schedule import Tiles  # noqa: E402

IMPLS = ("maskc", "maskc_raster", "maskc_preordered", "flex", "flex_fa4", "fa4", "fa4_varlen", "cudnn", "moves")


def bench_ms(fn, long: bool) -> float:
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=10, rep=100 if long else 40, return_mode="median"))


def run(args) -> list[dict]:
    impls = [i for i in args.impls.split(",") if i]
    flex, flex_fa4 = W.flex_functions()
    fa4 = W.fa4_module()
    gpu = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    records = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    B, H = 1, 16
    cases = [(m, S, d) for S in map(int, args.lengths.split(",")) for m in args.masks.split(",") if m
             for d in map(int, args.head_dims.split(","))]
    for name, S, D in cases:
        w = W.workload(name, S)
        bound = w.bound()
        pairs = int(bound.visible_pairs())
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        # FA4 wants (B, S, H, D): its own contiguous copies
        qs, ks, vs = (x.transpose(1, 2).contiguous() for x in (q, k, v))
        runners = {}
        after = {}          # impl -> what turns its output back into raster order (a pre-ordered run's)
        if "maskc" in impls:
            runners["maskc"] = lambda: attention(q, k, v, bound)
        ordered = token_order(bound, Options.from_environment())
        if "maskc_raster" in impls and ordered is not None:     # the raster order, where maskc's is another
            raster = Options.from_environment().replace(token_order="raster")
            runners["maskc_raster"] = lambda: attention(q, k, v, bound, options=raster)
        if "maskc_preordered" in impls and ordered is not None:     # q, k, v kept in the order: no gathers
            perm = torch.from_numpy(ordered.permutation).cuda()
            qp, kp, vp = (x.index_select(2, perm) for x in (q, k, v))
            runners["maskc_preordered"] = lambda: attention(qp, kp, vp, ordered.inner)
            after["maskc_preordered"] = torch.from_numpy(ordered.inverse).cuda()
            for variant in filter(None, args.variants.split(",")):
                shape, _, engine = variant.partition(":")
                options = Options.from_environment().replace(tiles=Tiles(*map(int, shape.split("x")),
                                                                           engine or "wgmma_tma"), autotune=False)
                runners[f"maskc[{variant}]"] = lambda options=options: attention(q, k, v, bound, options=options)
        for partial in filter(None, args.partial_tiles.split(",")):   # PARTIAL tiles' masking (Options.partial_tiles)
            env = Options.from_environment().replace(partial_tiles=partial)
            runners[f"maskc[partial={partial}]"] = lambda o=env: attention(q, k, v, bound, options=o)
            if ordered is not None:
                raster = env.replace(token_order="raster")
                runners[f"maskc_raster[partial={partial}]"] = lambda o=raster: attention(q, k, v, bound, options=o)
            if ordered is not None and "maskc_preordered" in impls:
                runners[f"maskc_preordered[partial={partial}]"] = lambda o=env: attention(qp, kp, vp, ordered.inner,
                                                                                          options=o)
                after[f"maskc_preordered[partial={partial}]"] = torch.from_numpy(ordered.inverse).cuda()
        for n in filter(None, args.exp2_emulation.split(",")):   # exponentials on the FMA pipe (Options.exp2_emulation)
            env = Options.from_environment().replace(exp2_emulation=int(n))
            runners[f"maskc[exp2_emulation={n}]"] = lambda o=env: attention(q, k, v, bound, options=o)
        if {"flex", "flex_fa4"} & set(impls):
            from torch.nn.attention.flex_attention import create_block_mask

            block_mask = create_block_mask(w.mask_mod(), None, None, S, S, device="cuda")
            score_mod = w.score_mod()
            if "flex" in impls:
                runners["flex"] = lambda: flex(q, k, v, score_mod=score_mod, block_mask=block_mask)
            if "flex_fa4" in impls and flex_fa4 is not None:
                runners["flex_fa4"] = lambda: flex_fa4(q, k, v, score_mod=score_mod, block_mask=block_mask)
        if fa4 is not None and "fa4" in impls and w.fa4_native() is not None:
            kw = w.fa4_native()
            runners["fa4"] = lambda: W.first(fa4.flash_attn_func(qs, ks, vs, **kw)).transpose(1, 2)
        if fa4 is not None and "fa4_varlen" in impls and name == "document":
            cu = w.tables["cu_seqlens"]
            qv, kv, vv = (x.view(S, H, D) for x in (qs, ks, vs))
            maxlen = int((cu[1:] - cu[:-1]).max())
            runners["fa4_varlen"] = lambda: W.first(fa4.flash_attn_varlen_func(
                qv, kv, vv, cu_seqlens_q=cu, cu_seqlens_k=cu, max_seqlen_q=maxlen, max_seqlen_k=maxlen,
                causal=True)).view(B, S, H, D).transpose(1, 2)
        if "cudnn" in impls and name == "causal":
            from torch.nn.attention import SDPBackend, sdpa_kernel

            def cudnn():
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            runners["cudnn"] = cudnn

        outputs = {}
        for impl, fn in runners.items():
            try:
                outputs[impl] = fn() if impl not in after else fn().index_select(2, after[impl])
                torch.cuda.synchronize()
            except Exception as exc:   # noqa: BLE001 - a peer that cannot run this case is reported, not fatal
                print(f"# {impl} {name} S={S} D={D}: {exc!r}"[:400], flush=True)
        if S <= 4096:
            ref, against = W.reference(q, k, v, W.dense_mask(w), score_mod=w.score_mod()), "float32"
        else:   # an independent peer's output: Flex-Triton's, else FA4's, else Flex-FA4's
            against = next((i for i in ("flex", "fa4", "fa4_varlen", "flex_fa4") if i in outputs), None)
            ref = outputs.get(against)
        for impl, out in outputs.items():
            err = W.rel_err(out, ref) if ref is not None else None
            ms = bench_ms(runners[impl], long=S >= 16384)
            rec = dict(mask=name, seq_len=S, head_dim=D, impl=impl, ms=ms,
                       tflops=4 * D * pairs * B * H / (ms * 1e-3) / 1e12, correct=None if err is None else err <= 2e-2,
                       err=err, err_against=against, gpu=gpu, date=date, params=w.short_params())
            rec["pass"] = "fwd"
            if impl.startswith("maskc"):
                rec["token_order"] = _order_name(bound) if impl != "maskc_raster" else "raster"
            records.append(rec)
            print(json.dumps(rec), flush=True)
        if "moves" in impls and ordered is not None:
            base = dict(mask=name, seq_len=S, head_dim=D, gpu=gpu, date=date, params=w.short_params(),
                        token_order=ordered.order.name)
            records += moves_records(q, k, v, ordered, base, long=S >= 16384)
        del q, k, v, qs, ks, vs, outputs, runners, bound, ordered, after
        torch.cuda.empty_cache()
    return records


def moves_records(q, k, v, ordered, base: dict, long: bool) -> list[dict]:
    """The order's moves of a forward (q, k, v in, O back) and a backward (dO, q, k, v, O, LSE in; dQ, dK, dV back)
    timed both ways: one torch copy per array, and the moves kernel's one launch per direction."""
    o, dout = torch.randn_like(q), torch.randn_like(q)
    lse = torch.randn(q.shape[:3], device=q.device)
    sets = {"moves_fwd": ((q, k, v), (o,)), "moves_bwd": ((dout, q, k, v, o, lse), (q, k, v))}
    ways = {"moves_torch": (lambda xs: [to_order(x, ordered) for x in xs], lambda xs: [from_order(x, ordered) for x in xs]),
            "moves_kernel": (lambda xs: to_order_all(xs, ordered), lambda xs: from_order_all(xs, ordered))}
    records = []
    for kind, (into, back) in sets.items():
        moved = 2 * sum(x.numel() * x.element_size() for x in into + back)     # read and written once each
        found = {}
        for impl, (there, here) in ways.items():
            def run(there=there, here=here):
                return there(into), here(back)
            found[impl] = run()
            ms = bench_ms(run, long)
            records.append(dict(base, impl=impl, ms=ms, gbps=moved / (ms * 1e-3) / 1e9, bytes=moved, **{"pass": kind}))
        same = all(torch.equal(a, b) for a, b in zip(sum(map(list, found["moves_torch"]), []),
                                                      sum(map(list, found["moves_kernel"]), [])))
        for rec in records[-2:]:
            rec["correct"] = same
            print(json.dumps(rec), flush=True)
    return records


def _order_name(bound) -> str:
    """The token order maskc runs ``bound`` in under the environment's options (maskc.ordered)."""
    ordered = token_order(bound, Options.from_environment())
    return "raster" if ordered is None else ordered.order.name


def print_table(records: list[dict]) -> None:
    by = {(r["mask"], r["seq_len"], r["head_dim"], r["impl"]): r for r in records}
    print("\n| mask | S | D | maskc TF/s | flex | flex_fa4 | fa4 | fa4_varlen | cudnn | maskc / flex_fa4 | maskc / fa4 | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for (mask, S, D, impl), r in by.items():
        if impl != "maskc":
            continue
        peer = lambda i: by.get((mask, S, D, i))   # noqa: E731
        tf = lambda i: f"{peer(i)['tflops']:.0f}" if peer(i) else "-"   # noqa: E731
        ratio = lambda i: f"{r['tflops'] / peer(i)['tflops']:.2f}" if peer(i) else "-"   # noqa: E731
        fa4_peer = "fa4" if peer("fa4") else ("fa4_varlen" if peer("fa4_varlen") else "fa4")
        wrong = [i for (m2, s2, d2, i), o in by.items() if (m2, s2, d2) == (mask, S, D) and o["correct"] is False]
        print(f"| {mask} | {S} | {D} | {r['tflops']:.0f} | {tf('flex')} | {tf('flex_fa4')} | {tf('fa4')} | "
              f"{tf('fa4_varlen')} | {tf('cudnn')} | {ratio('flex_fa4')} | {ratio(fa4_peer)} | "
              f"{'WRONG: ' + ','.join(wrong) if wrong else 'ok'} |")
    for r in records:     # the order's moves, the torch copies against the kernel's launch
        if r["impl"] == "moves_kernel":
            torch_ = next(t for t in records if t["impl"] == "moves_torch" and
                          all(t[f] == r[f] for f in ("mask", "seq_len", "head_dim", "pass")))
            print(f"| {r['mask']} {r['pass']} ({r['token_order']}) | {r['seq_len']} | {r['head_dim']} | torch "
                  f"{torch_['ms']:.3f} ms ({torch_['gbps']:.0f} GB/s) | kernel {r['ms']:.3f} ms ({r['gbps']:.0f} GB/s) "
                  f"| {torch_['ms'] / r['ms']:.2f}x | same bytes: {r['correct']} |")
    for (mask, S, D, impl), r in by.items():   # tile variants and token orders against the default
        base = by.get((mask, S, D, "maskc"))
        if impl.startswith(("maskc[", "maskc_raster", "maskc_preordered")) and base:
            print(f"| {mask} {impl} | {S} | {D} | {r['tflops']:.0f} | {r['tflops'] / base['tflops']:.2f}x the default "
                  f"| correct: {r['correct']} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--masks", default=",".join(W.ALL_MASKS))
    ap.add_argument("--head-dims", default="128", help="head dims to run every mask at, e.g. 64,128,256")
    ap.add_argument("--impls", default=",".join(IMPLS))
    ap.add_argument("--variants", default="", help="maskc tiles to time beside the schedule's: BMxBNxWARPS[:engine],...")
    ap.add_argument("--partial-tiles", default="", help="maskc beside the default, PARTIAL tiles masked each way "
                    "asked for (Options.partial_tiles): bits,elements (in the default order, in raster and, where the "
                    "order is another, preordered)")
    ap.add_argument("--exp2-emulation", default="", help="maskc beside the default with 1 column tile in N of the "
                    "softmax's exponentials on the FMA pipe (Options.exp2_emulation): 2,4")
    ap.add_argument("--out", default=str(W.ROOT / "bench" / "results" / "fwd.json"))
    args = ap.parse_args()
    records = run(args)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
    print_table(records)


if __name__ == "__main__":
    main()
