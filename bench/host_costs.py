"""Where a training step's host time goes, without a profiler's distortion: maskc.attention forward + backward
through autograd, back to back at a size where the kernels take microseconds (the host sets the pace), with the
runtime's own steps wrapped in timers (perf_counter, cumulative per step), and beside it the floors that bound
what maskc could reach: an autograd.Function that launches nothing, and the primitives a call is made of.

    python bench/host_costs.py [--seq-len 256] [--mask causal] [--steps 300] [--out host_costs.json]

cProfile (bench/profile_autograd.py) adds a fixed cost to every Python call, which inflates code made of many small
calls; these timers add one wrapper per timed call (about 0.3 us each on the H200's host) and nothing elsewhere.
"""
from __future__ import annotations

import argparse
import collections
import functools
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_overhead import host_us  # noqa: E402  (wall us per call, back to back, one synchronize at the end)
from workloads import B, D, H, real_bound, write_records  # noqa: E402

import maskc  # noqa: E402
from maskc.runtime import kernels, launch, operands, torch_ops  # noqa: E402

spent: dict[str, float] = collections.defaultdict(float)
calls: dict[str, int] = collections.defaultdict(int)


def timed(owner, name: str, label: str) -> None:
    """Wrap ``owner.name`` so that each call adds its wall time to ``spent[label]``."""
    fn = getattr(owner, name)

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[label] += time.perf_counter() - t
            calls[label] += 1

    setattr(owner, name, wrapper)


class _Floor(torch.autograd.Function):
    """What autograd costs a Python Function with maskc's signature: outputs allocated, nothing launched."""

    @staticmethod
    def forward(ctx, q, k, v):
        out, lse = torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.set_materialize_grads(False)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse):
        q, k, v, _, _ = ctx.saved_tensors
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seq-len", type=int, default=256)
    ap.add_argument("--mask", default="causal")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--out", default="host_costs.json")
    args = ap.parse_args()
    S, n = args.seq_len, args.steps
    bound = real_bound(args.mask, S)
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(4))
    qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
    step = lambda: torch.autograd.grad(maskc.attention(qg, kg, vg, bound), (qg, kg, vg), dout)   # noqa: E731
    floor = lambda: torch.autograd.grad(_Floor.apply(qg, kg, vg)[0], (qg, kg, vg), dout)       # noqa: E731
    o, lse = kernels.attention(q, k, v, bound, return_lse=True)
    options = maskc.Options.from_environment()

    primitives = {
        "step: maskc.attention fwd+bwd (autograd)": step,
        "floor: autograd.Function, no launches": floor,
        "runtime.attention": lambda: kernels.attention(q, k, v, bound),
        "runtime.attention_backward": lambda: kernels.attention_backward(dout, q, k, v, o, lse, bound),
        "Options.from_environment": maskc.Options.from_environment,
        "operand(q)": lambda: operands.operand(q, "q"),
        "Outputs(q)": lambda: operands.Outputs(operands.operand(q, "q")),
        "torch.empty (B,H,S,D) bf16": lambda: torch.empty((B, H, S, D), dtype=torch.bfloat16, device="cuda"),
        "torch.zeros (B,H,S,D) fp32": lambda: torch.zeros((B, H, S, D), dtype=torch.float32, device="cuda"),
        "ordered_for": lambda: kernels.ordered_for(bound, options, q, k),
        "hash(forward key)": lambda: hash(("forward", kernels.operand_key(*(operands.operand(x, "x") for x in (q, k, v))),
                                           0.1, True, options)),
    }
    records, table = [], []
    for name, fn in primitives.items():
        us = host_us(fn, n)
        records.append({"what": name, "us": us})
        table.append((name, us))

    # the step again, its parts timed: cumulative wall time per step of each wrapped call (nested ones overlap)
    for owner, name, label in ((kernels, "attention", "runtime.attention"),
                               (kernels, "attention_backward", "runtime.attention_backward"),
                               (kernels, "resolved_options", "resolved_options"),
                               (kernels, "operand", "operand"),
                               (kernels, "ordered_for", "ordered_for"),
                               (kernels, "refresh", "refresh"),
                               (kernels, "tile_map", "tile_map"),
                               (kernels, "float32_rows", "float32_rows"),
                               (operands.Outputs, "__init__", "Outputs.__init__"),
                               (operands.Outputs, "empty", "Outputs.empty"),
                               (launch.PackedLaunch, "__call__", "PackedLaunch.__call__"),
                               (torch_ops, "_kernel_layout", "_kernel_layout")):
        timed(owner, name, label)
    step()
    torch.cuda.synchronize()
    spent.clear()
    calls.clear()
    t = time.perf_counter()
    for _ in range(n):
        step()
    torch.cuda.synchronize()
    total = (time.perf_counter() - t) / n * 1e6
    parts = {label: (spent[label] / n * 1e6, calls[label] / n) for label in spent}
    records.append({"what": "timed step", "us": total, "parts": parts, "seq_len": S, "mask": args.mask,
                    "gpu": torch.cuda.get_device_name()})
    write_records(args.out, records)

    print(f"| primitive (S={S}, {args.mask}) | us per call |\n|---|---|")
    for name, us in table:
        print(f"| {name} | {us:.1f} |")
    print(f"\n| step with timers: {total:.0f} us | us per step | calls per step |\n|---|---|---|")
    for label, (us, c) in sorted(parts.items(), key=lambda kv: -kv[1][0]):
        print(f"| {label} | {us:.1f} | {c:g} |")


if __name__ == "__main__":
    main()
