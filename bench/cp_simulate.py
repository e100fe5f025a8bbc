"""Context parallelism on paper: per-rank balance, bytes moved and predicted step time for 2-64 GPUs.

    python bench/cp_simulate.py [--masks causal document ...] [--tokens-per-gpu 131072] [--gpus 2 4 8 ...]
                                [--nvlink-gbs 450 --ib-gbs 50 --gpus-per-node 8 --fwd-tflops 507 ...]

For each mask, the sequence is tokens-per-gpu x GPUs long (weak scaling) and bound to the parameters of
``workloads`` (packed documents of random lengths around --doc-mean). It plans with maskc.distributed
(mask-aware sharding and traffic) and with the mask-blind baseline of load-balanced ring attention
(PyTorch context_parallel's zig-zag layout, every rank's K/V to every rank), and predicts both with
maskc.distributed.simulate (its docstring has the model; Hardware's, which defaults were measured on one
H200 and which are data-sheet assumptions). Nothing here ran on more than one GPU: no multi-GPU machine has
been available. Prints a markdown table and writes bench/results/cp_sim.json.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import maskc  # noqa: E402
import maskc.distributed as cp  # noqa: E402
from maskc.distributed.shard import zigzag  # noqa: E402
from maskc.distributed.simulate import Hardware, Shape, predict, seen_kv_tokens  # noqa: E402

MASKS = ("causal", "sliding_window", "prefix_lm", "document", "bidirectional_document", "shared_prompt",
         "hstu", "global_local", "clear")


def random_lengths(total: int, mean: int, rng, least: int = 1) -> list[int]:
    """Lengths summing to ``total``, drawn from an exponential distribution of mean ``mean``, each at least
    ``least`` (a short last one is merged into the one before)."""
    out: list[int] = []
    while sum(out) < total:
        out.append(max(least, int(rng.exponential(mean))))
    out[-1] -= sum(out) - total
    if out[-1] < least and len(out) > 1:
        out[-2] += out.pop()
    return out


def workloads(seq_len: int, doc_mean: int) -> dict[str, dict]:
    rng = np.random.default_rng(0)
    docs = random_lengths(seq_len, doc_mean, rng)
    users = random_lengths(seq_len, doc_mean, rng, least=64)
    prompt = seq_len // 8
    return {"causal": {}, "sliding_window": {"window": 4096}, "prefix_lm": {"prefix": seq_len // 8},
            "document": {"docs": docs}, "bidirectional_document": {"docs": docs},
            "shared_prompt": {"prompt": prompt, "responses": random_lengths(seq_len - prompt, doc_mean, rng)},
            "hstu": {"users": users, "context": 32, "targets": [u // 10 for u in users]},
            "global_local": {"globals": 64, "window": 4096},
            "clear": {"text": 512, "width": 128, "radius": 16}}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--masks", nargs="+", default=list(MASKS))
    ap.add_argument("--tokens-per-gpu", type=int, default=131072)
    ap.add_argument("--gpus", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--prefetch-shards", type=float, default=4.0, help="K/V in flight per rank, in shards")
    ap.add_argument("--doc-mean", type=int, default=16384, help="mean document / user / response length")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--kv-heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--max-counted", type=int, default=262144,
                    help="longest sequence for masks whose pairs are counted pair by pair (clear)")
    ap.add_argument("--flat", action="store_true", help="shard over all ranks at once, not nodes first")
    ap.add_argument("--seen", action="store_true", help="also count the K/V positions queries see (slow at 64)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "cp_sim.json")
    for field, value in asdict(Hardware()).items():
        ap.add_argument("--" + field.replace("_", "-"), type=type(value), default=value)
    args = ap.parse_args()
    hw = Hardware(**{f: getattr(args, f) for f in asdict(Hardware())})
    shape = Shape(args.batch, args.heads, args.kv_heads, args.head_dim)
    print(f"{args.tokens_per_gpu} tokens per GPU; B={shape.batch} H={shape.heads} Hkv={shape.kv_heads} "
          f"D={shape.head_dim} bf16; {hw}")
    print("| mask | GPUs | imbalance (ring) | depth | calls/rank | K/V in GB (ring) | moved / seen | "
          "fwd ms | bwd ms | efficiency | ring step ms | speed-up |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    records = []
    for name in args.masks:
        mask = maskc.load(ROOT / "examples" / f"{name}.mask")
        for gpus in args.gpus:
            S = args.tokens_per_gpu * gpus
            if not mask.exact and S > args.max_counted:
                print(f"| {name} | {gpus} | skipped: a non-exact mask's pairs are counted pair by pair "
                      f"(--max-counted {args.max_counted}) |")
                continue
            t0 = time.perf_counter()
            bound = mask.bind(S, **workloads(S, args.doc_mean)[name])
            plan = cp.plan(bound, gpus, block=args.block, ranks_per_node=None if args.flat else hw.gpus_per_node,
                           prefetch_tokens=int(args.prefetch_shards * args.tokens_per_gpu))
            ring = cp.make_plan(bound, zigzag(cp.block_pairs(bound, args.block), gpus, S, args.block), fetch="all")
            p, pr = predict(plan, shape, hw), predict(ring, shape, hw)
            seen = None
            if args.seen and mask.exact:
                seen = float(shape.kv_bytes(seen_kv_tokens(plan).sum()))
            rec = {"mask": name, "gpus": gpus, "seq_len": S, "imbalance": p.imbalance, "ring_imbalance": pr.imbalance,
                   "depth": plan.depth, "block": plan.block, "calls_per_rank": float(p.calls.mean()),
                   "bytes_fwd": p.bytes_fwd, "bytes_bwd": p.bytes_bwd, "ring_bytes_fwd": pr.bytes_fwd,
                   "seen_bytes_fwd": seen, "fwd_ms": p.fwd_ms, "bwd_ms": p.bwd_ms, "step_ms": p.step_ms,
                   "efficiency": p.efficiency, "ring_step_ms": pr.step_ms, "ring_efficiency": pr.efficiency,
                   "plan_s": time.perf_counter() - t0}
            records.append(rec)
            moved = f"{p.bytes_fwd / seen:.3f}" if seen else "-"
            print(f"| {name} | {gpus} | {p.imbalance:.3f} ({pr.imbalance:.3f}) | {plan.depth} | {p.calls.mean():.1f} | "
                  f"{p.bytes_fwd / 1e9:.1f} ({pr.bytes_fwd / 1e9:.1f}) | {moved} | {p.fwd_ms:.1f} | {p.bwd_ms:.1f} | "
                  f"{p.efficiency:.3f} | {pr.step_ms:.1f} | {pr.step_ms / p.step_ms:.2f} |", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"hardware": asdict(hw), "shape": asdict(shape), "tokens_per_gpu":
                                    args.tokens_per_gpu, "doc_mean": args.doc_mean, "records": records}, indent=1))


if __name__ == "__main__":
    main()
