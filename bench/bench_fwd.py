"""Forward attention benchmark on the GPU: maskc vs FlexAttention vs SDPA cuDNN (causal), side by side.

B=1, H=16, D=128, bf16, forward. Median of triton.testing.do_bench. Effective TF/s = 4·D·(visible pairs)·B·H
/ time, with visible pairs from the bound mask (``bound.visible_pairs()``). maskc's output is checked against
Flex's in the same run (`correct`). Writes bench/results/latest.json and prints a markdown table last.

Masks come from the real mask compiler (``maskc.load(examples/<name>.mask).bind(...)``) when it exists, else
from tests/mock_masks.py (causal, sliding_window, document only); each record says which (`source`).

    python bench/bench_fwd.py [--lengths 1024,4096,16384,32768] [--masks causal,...] [--variants]
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import maskc  # noqa: E402
from maskc.runtime import attention  # noqa: E402

B, H, D = 1, 16, 128
ALL_MASKS = ["causal", "sliding_window", "document", "shared_prompt", "hstu", "hstu_ctx32", "clear"]


def real_bound(name: str, S: int):
    """The bound mask from the real compiler, or None where it is not there yet."""
    if not hasattr(maskc, "load"):
        return None
    params = {
        "causal": ("causal", {}),
        "sliding_window": ("sliding_window", {"window": 1024}),
        "document": None,   # the mock's random documents, so that Flex's mask_mod sees the same ones
        "shared_prompt": ("shared_prompt", {"prompt": S // 4, "responses": 4}),
        "hstu": ("hstu", {"users": 4, "target_frac": 0.10, "context": 0}),
        "hstu_ctx32": ("hstu", {"users": 4, "target_frac": 0.10, "context": 32}),
        "clear": ("clear", {"text": 512, "width": 128, "radius": 16}),
    }[name]
    if params is None:
        return None
    return maskc.load(ROOT / "examples" / f"{params[0]}.mask").bind(seq_len=S, **params[1])


def mock_bound(name: str, S: int):
    import mock_masks as mm

    if name == "causal":
        b = mm.causal(S)
        mod = lambda bb, hh, q, k: q >= k  # noqa: E731
    elif name == "sliding_window":
        b = mm.sliding_window(S, 1024)
        mod = lambda bb, hh, q, k: (q >= k) & (q - k < 1024)  # noqa: E731
    elif name == "document":
        b = mm.document(S, 12, seed=0)
        doc = torch.as_tensor(b.tables[0], device="cuda")
        mod = lambda bb, hh, q, k: (q >= k) & (doc[q] == doc[k])  # noqa: E731
    else:
        return None, None
    return b, mod


def bench_ms(fn, warmup=25, rep=100):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def host_ms(fn, n=5):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,4096,16384,32768")
    ap.add_argument("--masks", default=",".join(ALL_MASKS))
    ap.add_argument("--variants", default="", help="tile variants for causal at the largest length, e.g. 128x64x8,64x64x4")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "latest.json"))
    args = ap.parse_args()

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch._dynamo.config.cache_size_limit = 1000
    torch._dynamo.config.accumulated_cache_size_limit = 1000
    flex = torch.compile(flex_attention, dynamic=False)
    gpu = torch.cuda.get_device_name()
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    records = []

    def record(mask, S, impl, ms, pairs=None, correct=None, **extra):
        tf = 4 * D * pairs * B * H / (ms * 1e-3) / 1e12 if pairs else None
        rec = dict(mask=mask, seq_len=S, impl=impl, pass_="fwd", ms=ms, tflops=tf, correct=correct, gpu=gpu,
                   date=date, **extra)
        rec["pass"] = rec.pop("pass_")
        records.append(rec)
        print(json.dumps(rec), flush=True)

    lengths = [int(x) for x in args.lengths.split(",") if x]
    masks = [m for m in args.masks.split(",") if m]
    gen = torch.Generator(device="cuda").manual_seed(0)
    for S in lengths:
        q, k, v = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(3))
        for name in masks:
            source = "maskc"
            t_bind = None
            bound = None
            try:
                t = time.perf_counter()
                bound = real_bound(name, S)
                if bound is not None:
                    bound.descriptor(128, 64)
                    t_bind = (time.perf_counter() - t) * 1e3
            except Exception as exc:  # the real compiler is still being written
                print(f"# real bind of {name} failed: {exc!r}; using the mock", flush=True)
                bound = None
            mod = None
            if bound is None:
                bound, mod = mock_bound(name, S)
                source = "mock"
                if bound is None:
                    print(f"# skip {name}: no real compiler and no mock", flush=True)
                    continue
            pairs = bound.visible_pairs()

            # maskc (first call compiles and uploads: kept outside the timing)
            o = attention(q, k, v, bound)
            torch.cuda.synchronize()
            ms = bench_ms(lambda: attention(q, k, v, bound))

            # Flex, BlockMask built once outside the timing
            if mod is None:   # a real bound: the mock's torch mask_mod where there is one (to_flex_block_mask
                _, mod = mock_bound(name, S)   # captures a dense CPU mask at present)
            if mod is None and hasattr(bound, "to_flex_block_mask"):
                make_bm = bound.to_flex_block_mask
            else:
                make_bm = lambda: create_block_mask(mod, None, None, S, S, device="cuda")  # noqa: E731
            bm = make_bm().to("cuda")
            o_flex = flex(q, k, v, block_mask=bm)
            torch.cuda.synchronize()
            err = ((o.double() - o_flex.double()).norm() / o_flex.double().norm()).item()
            correct = bool(err <= 2e-2 and not torch.isnan(o).any().item())
            ms_flex = bench_ms(lambda: flex(q, k, v, block_mask=bm))
            record(name, S, "maskc", ms, pairs, correct, rel_err_vs_flex=err, source=source)
            record(name, S, "flex", ms_flex, pairs, None, source=source)
            if t_bind is not None:
                record(name, S, "maskc_bind", t_bind, source=source)
            if source == "mock":
                d_ms = host_ms(lambda: bound.descriptor(128, 64), n=1)
                record(name, S, "maskc_bind", d_ms, source="mock descriptor (numpy, not the real bind)")
            record(name, S, "flex_create_block_mask", host_ms(make_bm), source=source)

            if name == "causal":
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    try:
                        ms_cudnn = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
                        record(name, S, "cudnn", ms_cudnn, pairs)
                    except RuntimeError as exc:
                        print(f"# cuDNN failed: {exc}", flush=True)
            if args.variants and S == max(lengths):
                for var in args.variants.split(","):
                    tiles = tuple(int(x) for x in var.split("x"))
                    try:
                        ov = attention(q, k, v, bound, tiles=tiles)
                        torch.cuda.synchronize()
                        e = ((ov.double() - o_flex.double()).norm() / o_flex.double().norm()).item()
                        msv = bench_ms(lambda: attention(q, k, v, bound, tiles=tiles))
                        record(name, S, f"maskc[{var}]", msv, pairs, bool(e <= 2e-2), rel_err_vs_flex=e)
                    except Exception as exc:
                        print(f"# variant {var} failed: {exc!r}", flush=True)
            del bound
        del q, k, v
        torch.cuda.empty_cache()

    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
    print_table(records)


def print_table(records):
    by = {}
    for r in records:
        by[(r["mask"], r["seq_len"], r["impl"])] = r
    print("\n| mask | S | maskc ms | maskc TF/s | flex ms | flex TF/s | maskc/flex | vs cuDNN causal TF/s | correct | bind ms (maskc / flex) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (mask, S, impl), r in by.items():
        if impl != "maskc":
            continue
        f = by.get((mask, S, "flex"))
        c = by.get(("causal", S, "cudnn"))
        bnd = by.get((mask, S, "maskc_bind"))
        fb = by.get((mask, S, "flex_create_block_mask"))
        fmt = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
        print(f"| {mask} | {S} | {fmt(r['ms'])} | {fmt(r['tflops'], 0)} | {fmt(f and f['ms'])} | "
              f"{fmt(f and f['tflops'], 0)} | {fmt(f and r['tflops'] / f['tflops'], 2)} | "
              f"{fmt(c and r['tflops'] / c['tflops'], 2)} ({fmt(c and c['tflops'], 0)}) | {r['correct']} | "
              f"{fmt(bnd and bnd['ms'], 1)} / {fmt(fb and fb['ms'], 1)} |")
    for (mask, S, impl), r in by.items():
        if impl.startswith("maskc["):
            print(f"| {mask} {impl} | {S} | {r['ms']:.3f} | {r['tflops']:.0f} | | | | | {r['correct']} | |")


if __name__ == "__main__":
    main()
