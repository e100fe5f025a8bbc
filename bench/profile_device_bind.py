"""Where a device bind's time goes (issue 16): per kernel on the GPU (torch.profiler's CUDA times of one
``update`` + both views, median over the repeats) and per function on the host (cProfile over the eager calls).

    python bench/profile_device_bind.py [--masks causal,hstu] [--lengths 32768] [--repeat 50] [--out prof.txt]
        [--templates base=DIR,new=templates]

Each step is what bench_bind.py's ``maskc_device`` times: ``dm.update(**values)`` with the workload's values as
tensors on the GPU, then ``dm.build_views(((128, 128, True),), stream)`` (the row and the column view). Prints a
table per mask: kernel, launches per step, median GPU microseconds per launch; then the host's top functions by
cumulative time per step. ``--templates``: each mask profiled once per template variant (bench/template_ab.py's
NAME=DIR form), in turn, its descriptors checked against the first variant's. Not a test; nothing is written but
``--out``.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402
from template_ab import use_variant  # noqa: E402

import maskc  # noqa: E402


def profile(name: str, seq_len: int, repeat: int, block: int, label: str = "",
            reference: dict | None = None) -> tuple[str, dict]:
    """The report of one mask and length, and its descriptor's arrays (checked against ``reference``'s)."""
    mask = maskc.load(W.ROOT / "examples" / f"{name}.mask")
    w = W.workload(name, seq_len, device="cuda")
    dm = mask.bind_on_device(w.seq_len, **w.params)
    values = {k: torch.as_tensor(v, device="cuda") for k, v in w.params.items()
              if k not in ("num_heads", "kv_len") and not mask.resolved.param(k).const}
    stream = torch.cuda.current_stream().cuda_stream

    def step() -> None:
        dm.update(**values)
        dm.build_views(((block, block, True),), stream)

    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(repeat):
            step()
        torch.cuda.synchronize()
    per_kernel: dict[str, list[float]] = defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            per_kernel[event.name].append(event.device_time)
    arrays = dm.descriptor_arrays(block, block)
    same = "" if reference is None else (
        "; descriptor equal to the first variant's" if all(np.array_equal(arrays[k], reference[k]) for k in arrays)
        else "; DESCRIPTOR DIFFERS from the first variant's")
    lines = [f"## {name} at {seq_len} ({block} x {block} tiles, {repeat} steps){label}{same}",
             "| kernel | launches per step | median us | total us per step |", "|---|---|---|---|"]
    total = 0.0
    for kernel, times in sorted(per_kernel.items(), key=lambda kv: -sum(kv[1])):
        total += sum(times) / repeat
        lines.append(f"| {kernel[:60]} | {len(times) / repeat:g} | {statistics.median(times):.1f} | "
                     f"{sum(times) / repeat:.1f} |")
    lines.append(f"GPU busy per step: {total:.1f} us")
    host = cProfile.Profile()
    host.enable()
    for _ in range(repeat):
        step()
    host.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    pstats.Stats(host, stream=text).sort_stats("cumulative").print_stats(25)
    lines += ["", f"host, cProfile over {repeat} steps (divide by {repeat} for a step):", text.getvalue()]
    return "\n".join(lines), arrays


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--masks", default="causal,hstu")
    ap.add_argument("--lengths", default="32768")
    ap.add_argument("--repeat", type=int, default=50)
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--out", default=None)
    ap.add_argument("--templates", default=None, help="NAME=DIR,NAME=DIR: template variants, the first the reference")
    args = ap.parse_args()
    variants = dict(v.split("=", 1) for v in args.templates.split(",")) if args.templates else {"": None}
    reports = []
    for name in args.masks.split(","):
        for n in args.lengths.split(","):
            reference = None
            for var, directory in variants.items():
                if directory is not None:
                    use_variant(directory)
                report, arrays = profile(name, int(n), args.repeat, args.block,
                                         f", templates {var} ({directory})" if directory else "", reference)
                reference = arrays if reference is None else reference
                reports.append(report)
    report = "\n\n".join(reports)
    if args.out:
        Path(args.out).write_text(report + "\n")
    print(report)


if __name__ == "__main__":
    main()
