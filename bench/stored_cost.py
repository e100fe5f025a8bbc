"""What the stored path of PARTIAL tiles costs once per binding (issue 15; ForwardPlan.stored): a new binding's
first forward against its second, with the stored path and with the tile path ("bits"), and the builder kernel
alone (CUDA events around a fresh build); the words' bytes beside the descriptor's.

    python bench/stored_cost.py --lengths 32768 --masks clear,neighborhood,video [--out stored_cost.json]
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

import torch  # noqa: E402

import workloads as W  # noqa: E402
from maskc import Options, attention  # noqa: E402
from maskc.ordered import token_order  # noqa: E402
from maskc.codegen.plan import stored_bytes  # noqa: E402
from maskc.runtime import state  # noqa: E402


def first_and_second(w, q, options: Options) -> tuple[float, float]:
    """ms of a new binding's first forward and of its second."""
    bound = w.bound()
    times = []
    for _ in range(2):
        torch.cuda.synchronize()
        start = time.perf_counter()
        attention(q, q, q, bound, options=options)
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return times[0], times[1]


def builder_ms(w, q, options: Options, reps: int = 5) -> tuple[float, int, int]:
    """(median ms of the builder alone, words bytes, descriptor bytes) for the workload's binding in its order."""
    bound = w.bound()
    attention(q, q, q, bound, options=options)
    ordered = token_order(bound, options)
    inner = ordered.inner if ordered is not None else bound
    key = next(key for key in state.state_for(inner) if key[0] == "tile_words" and not key[4])
    kernel = next(v for k, v in state.state_for(inner.mask).items() if k[0] == "kernel" and getattr(
        v.source.plan, "stored", False))
    times = []
    for _ in range(reps):
        del state.state_for(inner)[key]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        state.stored_words(inner, kernel, key[1], key[2], key[3], options,    # the forward's (row view)
                           torch.cuda.current_stream().cuda_stream)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    desc = inner.descriptor(key[1], key[2])
    return sorted(times)[len(times) // 2], stored_bytes(desc), desc.nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", default="32768")
    ap.add_argument("--masks", default="clear,neighborhood,video")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    records = []
    for S in map(int, args.lengths.split(",")):
        q = torch.randn(1, 16, S, 128, device="cuda", dtype=torch.bfloat16)
        for name in args.masks.split(","):
            w = W.workload(name, S)
            rec = {"mask": name, "seq_len": S, "gpu": torch.cuda.get_device_name()}
            for partial in ("bits", "stored"):
                first, second = first_and_second(w, q, Options.from_environment().replace(partial_tiles=partial))
                rec[f"{partial}_first_ms"], rec[f"{partial}_second_ms"] = first, second
            rec["builder_ms"], rec["words_bytes"], rec["descriptor_bytes"] = builder_ms(
                w, q, Options.from_environment().replace(partial_tiles="stored"))
            records.append(rec)
            print(json.dumps(rec), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(records, indent=1))


if __name__ == "__main__":
    main()
