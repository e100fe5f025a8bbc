"""Forward attention benchmark on the GPU: maskc vs FlexAttention vs SDPA cuDNN (causal), side by side.

B=1, H=16, D=128, bf16, forward. Median of triton.testing.do_bench. Effective TF/s = 4·D·(visible pairs)·B·H
/ time, with visible pairs from the bound mask (``bound.visible_pairs()``). maskc's output is checked against
Flex's in the same run (`correct`). Writes bench/results/latest.json and prints a markdown table last.

Masks come from the real mask compiler (``maskc.load(examples/<name>.mask).bind(...)``); Flex is fed
``create_block_mask(bound.flex_mask_mod())`` (Flex's own block mask); `flex_create_block_mask` times that call,
`maskc_bind` times ``mask.bind(...)`` + ``bound.descriptor(128, 64)`` on a fresh mask object (host ms).

`maskc` records time the schedule's engine; `maskc_<engine>` records the other engines (maskc.kernel_ir.ENGINES)
on the same inputs (``--no-fallback`` skips them).

    python bench/bench_fwd.py [--lengths 1024,4096,16384,32768] [--masks causal,...] [--variants 128x64x4:mma,...]
"""
from __future__ import annotations

import argparse
import datetime
import json
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
from maskc.kernel_ir import ENGINES  # noqa: E402
from maskc.schedule import Tiles, choose_tiles  # noqa: E402

B, H, D = 1, 16, 128
ALL_MASKS = ["causal", "sliding_window", "document", "shared_prompt", "hstu", "hstu_ctx32", "clear"]


def make_params(name: str, S: int) -> tuple[str, dict]:
    """(example file, bind parameters) of the six issue masks at length S."""
    if name == "causal":
        return "causal", {}
    if name == "sliding_window":
        return "sliding_window", {"window": 1024}
    if name == "document":
        rng = np.random.default_rng(0)
        cuts = np.sort(rng.choice(np.arange(1, S), 11, replace=False))
        return "document", {"docs": [int(x) for x in np.diff(np.concatenate([[0], cuts, [S]]))]}
    if name == "shared_prompt":
        prompt = S // 4
        r = (S - prompt) // 4
        return "shared_prompt", {"prompt": prompt, "responses": [r, r, r, S - prompt - 3 * r]}
    if name in ("hstu", "hstu_ctx32"):
        u = S // 4
        users = [u, u, u, S - 3 * u]
        return "hstu", {"users": users, "targets": [x // 10 for x in users],
                        "context": 32 if name == "hstu_ctx32" else 0}
    if name == "clear":
        return "clear", {"text": 512, "width": 128, "radius": 16}
    raise KeyError(name)


_loaded = {}


def real_bound(name: str, S: int):
    file, params = make_params(name, S)
    if file not in _loaded:
        _loaded[file] = maskc.load(ROOT / "examples" / f"{file}.mask")
    return _loaded[file].bind(seq_len=S, **params)


def bind_ms(name: str, S: int, n: int = 3) -> float:
    """Host ms of mask.bind(...) + bound.descriptor(128, 64) on a fresh mask object each time."""
    file, params = make_params(name, S)
    times = []
    for _ in range(n):
        mask = maskc.load(ROOT / "examples" / f"{file}.mask")
        t = time.perf_counter()
        mask.bind(seq_len=S, **params).descriptor(128, 64)
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def count_pairs(bound) -> int:
    """Visible pairs: the formula for exact masks, else the mask_mod on the GPU in row chunks."""
    try:
        return int(bound.visible_pairs())
    except NotImplementedError:
        mod = bound.flex_mask_mod("cuda")
        S, K = bound.seq_len, bound.kv_len
        kk = torch.arange(K, device="cuda")[None, :]
        zero = torch.zeros((), dtype=torch.int64, device="cuda")
        total = 0
        for r0 in range(0, S, 1024):
            qq = torch.arange(r0, min(S, r0 + 1024), device="cuda")[:, None]
            total += int(mod(zero, zero, qq, kk).sum().item())
        return total


def bench_ms(fn, warmup=25, rep=100):
    import triton.testing

    return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))


def _short(fp):
    file, params = fp
    return {k: (v if not isinstance(v, list) or len(v) <= 4 else f"{len(v)} items") for k, v in params.items()}


def host_ms(fn, n=5):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def compiled_flex():
    """(torch.compile(flex_attention), GPU name, UTC date) with dynamo's caches raised: a sweep over shapes
    and mask_mods otherwise falls back to Flex's unfused path after a few recompiles."""
    from torch.nn.attention.flex_attention import flex_attention

    torch._dynamo.config.cache_size_limit = 1000
    torch._dynamo.config.accumulated_cache_size_limit = 1000
    date = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    return torch.compile(flex_attention, dynamic=False), torch.cuda.get_device_name(), date


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="1024,4096,16384,32768")
    ap.add_argument("--masks", default=",".join(ALL_MASKS))
    ap.add_argument("--variants", default="",
                    help="tile variants at the largest length, BMxBNxWARPS[:engine], e.g. 128x64x8:mma,128x64x8:wgmma")
    ap.add_argument("--no-fallback", action="store_true", help="time the schedule's engine only")
    ap.add_argument("--engines", default=",".join(ENGINES), help="the other engines to time beside the schedule's")
    ap.add_argument("--out", default=str(ROOT / "bench" / "results" / "latest.json"))
    args = ap.parse_args()

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.attention.flex_attention import create_block_mask

    flex, gpu, date = compiled_flex()
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
        small = S <= 4096
        reps = dict(warmup=10, rep=30) if small else dict(warmup=10, rep=100)
        for name in masks:
            bound = real_bound(name, S)
            pairs = count_pairs(bound)

            # maskc (first call compiles and uploads: kept outside the timing)
            o = attention(q, k, v, bound)
            torch.cuda.synchronize()
            ms = bench_ms(lambda: attention(q, k, v, bound), **reps)

            # Flex as its users run it: its own create_block_mask on the same mask_mod, built once outside
            # the timing (maskc's exported BlockMask is checked in the GPU tests instead).
            mod = bound.flex_mask_mod("cuda")
            bm = create_block_mask(mod, None, None, S, S, device="cuda")
            o_flex = flex(q, k, v, block_mask=bm)
            torch.cuda.synchronize()
            err = ((o.double() - o_flex.double()).norm() / o_flex.double().norm()).item()
            correct = bool(err <= 2e-2 and not torch.isnan(o).any().item())
            ms_flex = bench_ms(lambda: flex(q, k, v, block_mask=bm), **reps)
            engine = choose_tiles(D, "bf16").engine
            record(name, S, "maskc", ms, pairs, correct, rel_err_vs_flex=err, params=_short(make_params(name, S)),
                   engine=engine)
            record(name, S, "flex", ms_flex, pairs, None)
            others = [] if args.no_fallback else [e for e in args.engines.split(",") if e and e != engine]
            for other in others:
                tiles = choose_tiles(D, "bf16", engine=other)
                oe = attention(q, k, v, bound, tiles=tiles)
                torch.cuda.synchronize()
                e = ((oe.double() - o_flex.double()).norm() / o_flex.double().norm()).item()
                record(name, S, f"maskc_{other}", bench_ms(lambda: attention(q, k, v, bound, tiles=tiles), **reps),
                       pairs, bool(e <= 2e-2 and not torch.isnan(oe).any().item()), rel_err_vs_flex=e, engine=other)
            record(name, S, "maskc_bind", bind_ms(name, S), host=True)
            record(name, S, "flex_create_block_mask",
                   host_ms(lambda: create_block_mask(mod, None, None, S, S, device="cuda"), n=3 if small else 1),
                   host=True)

            if name == "causal":
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    try:
                        ms_cudnn = bench_ms(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True), **reps)
                        record(name, S, "cudnn", ms_cudnn, pairs)
                    except RuntimeError as exc:
                        print(f"# cuDNN failed: {exc}", flush=True)
            if args.variants and S == max(lengths):
                for var in args.variants.split(","):
                    shape, _, eng = var.partition(":")
                    tiles = Tiles(*(int(x) for x in shape.split("x")), eng or "mma")
                    try:
                        ov = attention(q, k, v, bound, tiles=tiles)
                        torch.cuda.synchronize()
                        e = ((ov.double() - o_flex.double()).norm() / o_flex.double().norm()).item()
                        msv = bench_ms(lambda: attention(q, k, v, bound, tiles=tiles), **reps)
                        record(name, S, f"maskc[{var}]", msv, pairs, bool(e <= 2e-2), rel_err_vs_flex=e)
                    except Exception as exc:
                        print(f"# variant {var} failed: {exc!r}", flush=True)
            del bound
        del q, k, v
        torch.cuda.empty_cache()

    write_records(args.out, records)
    print_table(records)


def write_records(path, records) -> None:
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))


def print_table(records):
    by = {}
    for r in records:
        by[(r["mask"], r["seq_len"], r["impl"])] = r
    print("\n| mask | S | maskc ms | maskc TF/s | flex ms | flex TF/s | maskc/flex | vs cuDNN causal TF/s | correct "
          "| bind ms (maskc / flex) | other engines TF/s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for (mask, S, impl), r in by.items():
        if impl != "maskc":
            continue
        f = by.get((mask, S, "flex"))
        c = by.get(("causal", S, "cudnn"))
        bnd = by.get((mask, S, "maskc_bind"))
        fb = by.get((mask, S, "flex_create_block_mask"))
        others = " / ".join(f"{o['impl'][6:]} {o['tflops']:.0f}{'' if o['correct'] else ' (WRONG)'}"
                            for (m2, s2, i2), o in by.items() if (m2, s2) == (mask, S) and i2.startswith("maskc_")
                            and o.get("engine"))
        fmt = lambda x, p=3: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
        print(f"| {mask} | {S} | {fmt(r['ms'])} | {fmt(r['tflops'], 0)} | {fmt(f and f['ms'])} | "
              f"{fmt(f and f['tflops'], 0)} | {fmt(f and r['tflops'] / f['tflops'], 2)} | "
              f"{fmt(c and r['tflops'] / c['tflops'], 2)} ({fmt(c and c['tflops'], 0)}) | {r['correct']} | "
              f"{fmt(bnd and bnd['ms'], 1)} / {fmt(fb and fb['ms'], 1)} | {others} |")
    for (mask, S, impl), r in by.items():
        if impl.startswith("maskc["):
            print(f"| {mask} {impl} | {S} | {r['ms']:.3f} | {r['tflops']:.0f} | | | | | {r['correct']} | | |")


if __name__ == "__main__":
    main()
