"""Bind + classify + pack time on the CPU, per mask and length (a benchmark, not a test).

    python bench/bench_bind.py [--lengths 32768 131072] [--block 128] [--repeat 50] [--clock process]

Times the run-time path a user pays when lengths or parameters change: ``mask.bind(...)``
(validation and `require` checks), tile classification and descriptor packing, from a fresh
BoundMask each time. The compiled mask keeps its specializations to int values (regions that cannot
hold for them dropped); the "cold" column forgets them first, as a first bind with new int values.
Prints medians in ms and writes bench/results/bind_cpu.json. ``--clock process`` times with this process's
CPU time instead of the wall clock: on a shared machine, time other processes take is then not counted.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import maskc  # noqa: E402


def workloads(seq_len: int):
    """The benchmark masks of issue 3, scaled with the length."""
    rng = np.random.default_rng(0)
    cuts = np.sort(rng.choice(np.arange(1, seq_len), 11, replace=False))
    docs = np.diff(np.concatenate([[0], cuts, [seq_len]])).tolist()
    prompt = seq_len // 4
    responses = [(seq_len - prompt) // 4] * 3
    responses.append(seq_len - prompt - sum(responses))
    users = [seq_len // 4] * 4
    return [
        ("causal", {}),
        ("sliding_window", {"window": 1024}),
        ("document", {"docs": docs}),
        ("shared_prompt", {"prompt": prompt, "responses": responses}),
        ("hstu", {"users": users, "context": 0, "targets": [u // 10 for u in users]}),
        ("hstu", {"users": users, "context": 32, "targets": [u // 10 for u in users]}),
        ("clear", {"text": 512, "width": 128, "radius": 16}),
        ("neighborhood", {"width": 181, "window": 13}),
        ("video", {"width": 32, "height": 32, "radius": 3, "past": 1}),
    ]


CLOCK = time.perf_counter


def time_once(mask, seq_len, params, block, cold=False):
    """One bind + classify + pack through the API, from a fresh BoundMask; ``cold`` also forgets the
    compiled mask's specializations (what the first bind with new int values pays)."""
    if cold:
        mask.__dict__.pop("_specialized", None)
    t0 = CLOCK()
    mask.bind(seq_len=seq_len, **params).descriptor(block, block)
    return (CLOCK() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[32768, 131072])
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--clock", choices=["wall", "process"], default="wall",
                    help="process: this process's CPU time (other processes' time on a shared machine not counted)")
    args = ap.parse_args()
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    records = []
    print(f"| mask | seq_len | tiles | bind+classify+pack ms (median of {args.repeat}) | cold: new int values |")
    print("|---|---|---|---|---|")
    for seq_len in args.lengths:
        for name, params in workloads(seq_len):
            mask = maskc.load(ROOT / "examples" / f"{name}.mask")
            time_once(mask, seq_len, params, args.block)          # warm caches and imports
            times = [time_once(mask, seq_len, params, args.block) for _ in range(args.repeat)]
            cold = [time_once(mask, seq_len, params, args.block, cold=True) for _ in range(max(3, args.repeat // 5))]
            label = name + (f" (context {params['context']})" if name == "hstu" else "")
            ms, cold_ms = statistics.median(times), statistics.median(cold)
            tiles = (-(-seq_len // args.block)) ** 2
            print(f"| {label} | {seq_len} | {tiles} | {ms:.3f} | {cold_ms:.3f} |")
            records.append({"mask": label, "seq_len": seq_len, "impl": "maskc_bind_cpu", "ms": ms,
                            "cold_ms": cold_ms, "block": args.block, "clock": args.clock,
                            "machine": platform.processor() or platform.machine(), "date": date.today().isoformat()})
    out = ROOT / "bench" / "results" / "bind_cpu.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
