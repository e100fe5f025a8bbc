"""Binding a mask per batch: maskc's bind + descriptor on the host against FlexAttention's create_block_mask
(a benchmark, not a test).

    python bench/bench_bind.py [--lengths 4096,32768,131072] [--masks causal,...] [--device cpu|cuda]
                               [--impls maskc,maskc_device,flex,flex_compiled] [--repeat 20] [--allocator as-is|warm]
                               [--out PATH]

Every workload of bench/workloads.py (the same masks and parameters as the forward and backward benchmarks)
at every length, tiles of ``--block`` x ``--block`` (Flex's default, 128):

- ``maskc_host``: ``mask.bind(seq_len=S, **params).descriptor(block, block)`` from a fresh BoundMask each
  time (validation, ``require`` checks, tile classification, packing), on the host whatever ``--device``
  says; the compiled mask kept (a training loop loads it once). ``bind_ms`` and ``descriptor_ms`` split it;
  ``cold_ms`` also forgets the compiled mask's specializations to int values (the first bind with new ints).
- ``maskc_device`` (``--device cuda``, masks linear in k): a DeviceMask (``bind_on_device``) given the workload's
  values again as GPU tensors (``update``: the table written, checked, `require` rules in torch) and its descriptor
  rebuilt (``build_views``), timed with CUDA events: ``ms`` the row view and the column view (what a training
  step's forward and backward read; Flex's create_block_mask builds both too), ``rows_ms`` the row view alone
  (what ``maskc_host`` builds), ``wall_ms`` the host's wall clock for the eager calls (launches: the host
  waits for nothing), ``graph_ms`` the same work captured once in a CUDA graph and replayed from an idle GPU
  (the graph's launch latency included), ``in_step_ms`` ten binds captured back to back in one graph, per bind:
  what a bind adds to a captured training step, whose graph is launched once for all its kernels.
- ``flex``: ``create_block_mask(mask_mod, None, None, S, S, device, BLOCK_SIZE=block)`` with the hand-written
  mask_mod (bench/workloads.py), as Flex users call it per batch; it evaluates the mask_mod on the whole
  S x S grid, so on the CPU it is skipped past ``--flex-max-elements`` query-key pairs (default 2**26 on the
  CPU: 8K tokens; no limit on the GPU), recorded with ``skipped`` and the reason.
- ``flex_compiled``: the same through ``torch.compile(create_block_mask)`` (Flex's advice for long
  sequences: no S x S tensor), timed after one warm-up call that compiles it; off by default on the CPU
  (Inductor's CPU compile takes minutes).

maskc's records also carry ``faults_per_bind`` (minor page faults): glibc gives freed memory back to the system
unless the process has freed a large block before (its adaptive thresholds), so a process that only binds masks
takes page faults on its temporaries at every bind (about 3 us each on the dev machine), and one that has freed
a large array (a training loop; this benchmark after a Flex run) does not. ``--allocator warm`` puts the process
in the second state before measuring.

Medians of ``--repeat`` runs, wall clock (the GPU synchronised before and after each Flex call);
``--clock process`` times maskc with this process's CPU time instead (on a shared machine, what other
processes take is then not counted; Flex's threads would be summed, so Flex stays on the wall clock). Each
Flex record also says whether its block counts (FULL and PARTIAL) equal maskc's (``agree``): both are exact
for these masks. Records in bench/results/latest.json's format (mask, seq_len, impl, ms, pass = "bind",
device, date, params, command) go to ``--out``; a table of medians and ratios is printed last.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

from maskc.kernel_ir import FULL, PARTIAL  # noqa: E402

IMPLS = ("maskc", "maskc_device", "flex", "flex_compiled")
STEP_BINDS = 10             # binds captured back to back for ``in_step_ms``
CLOCK = time.perf_counter


def maskc_once(mask, w: W.Workload, block: int, cold: bool = False) -> tuple[float, float]:
    """(bind ms, descriptor ms) of one fresh bind; ``cold`` forgets the specializations to int values first."""
    if cold:
        mask.__dict__.pop("_specialized", None)
    t0 = CLOCK()
    bound = mask.bind(seq_len=w.seq_len, **w.params)
    t1 = CLOCK()
    bound.descriptor(block, block)
    return (t1 - t0) * 1e3, (CLOCK() - t1) * 1e3


def device_times(mask, w: W.Workload, block: int, repeat: int) -> dict:
    """A DeviceMask's update + descriptor on the GPU (see the module docstring): medians in ms."""
    fixed = ("num_heads", "kv_len")
    dm = mask.bind_on_device(w.seq_len, **w.params)
    values = {k: torch.as_tensor(v, device="cuda") for k, v in w.params.items()
              if k not in fixed and not mask.resolved.param(k).const}

    def once(transposed: bool) -> None:
        dm.update(**values)
        dm.build_views(((block, block, transposed),), torch.cuda.current_stream().cuda_stream)

    def timed(run) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    for _ in range(3):
        once(True)
    torch.cuda.synchronize()
    both = [timed(lambda: once(True)) for _ in range(repeat)]
    rows = [timed(lambda: once(False)) for _ in range(repeat)]
    wall = []
    for _ in range(repeat):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        once(True)
        wall.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        once(True)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        once(True)
    graphed = [timed(graph.replay) for _ in range(repeat)]
    # In a captured training step the bind's kernels follow the step's others back to back: the graph's own
    # launch latency (paid once per step) is not the bind's. STEP_BINDS binds in one graph, per bind.
    step_graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step_graph, stream=stream):
        for _ in range(STEP_BINDS):
            once(True)
    in_step = [timed(step_graph.replay) / STEP_BINDS for _ in range(repeat)]
    dm.check()
    got, want = dm.descriptor_arrays(block, block), dm.to_host().descriptor(block, block)
    same = all(np.array_equal(got[k], getattr(want, k)) for k in ("run_offsets", "runs", "work_order", "col_offsets",
                                                                 "col_runs", "col_work_order", "mask_data"))
    return dict(ms=statistics.median(both), min_ms=min(both), rows_ms=statistics.median(rows),
                wall_ms=statistics.median(wall), graph_ms=statistics.median(graphed),
                in_step_ms=statistics.median(in_step),
                bytes=dm._builder(block, block).nbytes, agree_host=same)


def minor_faults() -> int:
    """This process's minor page faults so far (0 where the platform does not count them)."""
    try:
        import resource
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    except (ImportError, AttributeError):
        return 0


def warm_allocator() -> None:
    """Allocate and free one 16 MiB block, as any process that has freed a large array has: glibc then raises
    its mmap threshold and its trim threshold (to 32 MiB) and keeps freed memory for the next bind, instead of
    giving it back to the system and taking page faults on it at every bind."""
    import numpy as np
    block = np.ones(16 << 20, np.uint8)
    del block


def block_counts(tile_map) -> tuple[int, int]:
    """(FULL, PARTIAL) tiles of a maskc tile map, from its runs."""
    widths = tile_map.runs[:, 1] - tile_map.runs[:, 0]
    return int(widths[tile_map.runs[:, 2] == FULL].sum()), int(widths[tile_map.runs[:, 2] == PARTIAL].sum())


def flex_once(create, w: W.Workload, block: int, device: str):
    """(ms, BlockMask) of one create_block_mask call, wall clock, the GPU synchronised around it."""
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    sync()
    t0 = time.perf_counter()
    bm = create(w.mask_mod(), None, None, w.seq_len, w.seq_len, device=device, BLOCK_SIZE=block)
    sync()
    return (time.perf_counter() - t0) * 1e3, bm


def cpu_name() -> str:
    """The host CPU's model name (Linux), else what platform knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def run(args) -> list[dict]:
    global CLOCK
    CLOCK = time.process_time if args.clock == "process" else time.perf_counter
    if args.allocator == "warm":
        warm_allocator()
    from torch.nn.attention.flex_attention import create_block_mask

    impls = [i for i in args.impls.split(",") if i]
    on_gpu = args.device.startswith("cuda")
    limit = args.flex_max_elements if args.flex_max_elements is not None else (None if on_gpu else 1 << 26)
    common = dict(device=args.device, gpu=torch.cuda.get_device_name() if on_gpu else None, cpu=cpu_name(),
                  host_cores=os.cpu_count(), block=args.block,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python bench/bench_bind.py " + " ".join(sys.argv[1:]))
    common["pass"] = "bind"
    compiled = None
    records = []
    for S in map(int, args.lengths.split(",")):
        for name in (m for m in args.masks.split(",") if m):
            w = W.workload(name, S, device=args.device)
            mask = W._compiled(w.example)
            base = dict(mask=name, seq_len=S, params=w.short_params(), **common)
            counts = block_counts(mask.bind(seq_len=S, **w.params).tile_map(args.block, args.block))
            if "maskc" in impls:
                maskc_once(mask, w, args.block)                             # imports, caches, specializations
                faults = minor_faults()
                times = [maskc_once(mask, w, args.block) for _ in range(args.repeat)]
                faults = (minor_faults() - faults) / args.repeat
                cold = [sum(maskc_once(mask, w, args.block, cold=True)) for _ in range(max(3, args.repeat // 5))]
                rec = dict(base, impl="maskc_host", ms=statistics.median(b + d for b, d in times),
                           bind_ms=statistics.median(b for b, _ in times),
                           descriptor_ms=statistics.median(d for _, d in times), cold_ms=statistics.median(cold),
                           min_ms=min(b + d for b, d in times), clock=args.clock, full=counts[0],
                           partial=counts[1], faults_per_bind=faults, allocator=args.allocator)
                records.append(rec)
                print(json.dumps(rec), flush=True)
            if "maskc_device" in impls and on_gpu and mask.ranges.linear:
                rec = dict(base, impl="maskc_device", clock="cuda events")
                try:
                    rec.update(device_times(mask, w, args.block, args.repeat))
                except Exception as exc:   # noqa: BLE001 - reported, the other impls go on
                    rec.update(ms=None, error=repr(exc)[:300])
                records.append(rec)
                print(json.dumps(rec), flush=True)
            for impl in ("flex", "flex_compiled"):
                if impl not in impls:
                    continue
                rec = dict(base, impl=impl, clock="wall")
                if impl == "flex" and limit is not None and S * S > limit:
                    rec.update(ms=None, skipped=f"{S} x {S} query-key pairs past --flex-max-elements = {limit} "
                                                f"(create_block_mask evaluates the whole grid on {args.device})")
                else:
                    try:
                        if impl == "flex_compiled" and compiled is None:
                            compiled = torch.compile(create_block_mask)
                        create = compiled if impl == "flex_compiled" else create_block_mask
                        flex_once(create, w, args.block, args.device)          # warm-up (compiles)
                        times, bm = [], None
                        for _ in range(args.repeat if S <= 32768 else max(3, args.repeat // 4)):
                            ms, bm = flex_once(create, w, args.block, args.device)
                            times.append(ms)
                        full, partial = int(bm.full_kv_num_blocks.sum()), int(bm.kv_num_blocks.sum())
                        rec.update(ms=statistics.median(times), min_ms=min(times), full=full, partial=partial,
                                   agree=(full, partial) == counts)
                    except Exception as exc:   # noqa: BLE001 - a peer that cannot run a case is reported
                        rec.update(ms=None, error=repr(exc)[:300])
                    if on_gpu:
                        torch.cuda.empty_cache()
                records.append(rec)
                print(json.dumps(rec), flush=True)
    return records


def print_table(records: list[dict]) -> None:
    by = {(r["mask"], r["seq_len"], r["impl"]): r for r in records}
    print("\n| mask | S | maskc bind ms | descriptor ms | maskc total | faults | cold | device rows + cols us | "
          "rows us | graph us | in step us | wall us | flex ms | flex compiled ms | flex / maskc | blocks agree |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for mask, S in dict.fromkeys((r["mask"], r["seq_len"]) for r in records):   # a row even without the host's
        r = by.get((mask, S, "maskc_host")) or {}
        peers = [by.get((mask, S, i)) for i in ("flex", "flex_compiled")]
        dev = by.get((mask, S, "maskc_device")) or {}
        us = lambda key: "-" if dev.get(key) is None else f"{dev[key] * 1e3:.0f}"  # noqa: E731
        ms = lambda key: "-" if r.get(key) is None else f"{r[key]:.3f}"  # noqa: E731

        def shown(p):
            return "-" if p is None else f"{p['ms']:.2f}" if p.get("ms") is not None else (
                "skipped" if "skipped" in p else "failed")
        best = min((p["ms"] for p in peers if p and p.get("ms") is not None), default=None)
        ratio = "-" if best is None or r.get("ms") is None else f"{best / r['ms']:.1f}x"
        agree = {p.get("agree") for p in peers if p and "agree" in p}
        faults = "-" if not r else f"{r.get('faults_per_bind', 0):.0f}"
        print(f"| {mask} | {S} | {ms('bind_ms')} | {ms('descriptor_ms')} | {ms('ms')} | "
              f"{faults} | {ms('cold_ms')} | {us('ms')} | {us('rows_ms')} | "
              f"{us('graph_ms')} | {us('in_step_ms')} | {us('wall_ms')} | {shown(peers[0])} | {shown(peers[1])} | "
              f"{ratio} | "
              f"{'-' if not agree else 'yes' if agree == {True} else 'NO'} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,32768,131072")
    ap.add_argument("--masks", default=",".join(W.ALL_MASKS))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                    help="where Flex builds its block mask (maskc binds on the host either way)")
    ap.add_argument("--impls", default=None, help=f"of {','.join(IMPLS)}; default all on the GPU, "
                                                  "maskc,flex on the CPU")
    ap.add_argument("--block", type=int, default=128)
    ap.add_argument("--repeat", type=int, default=20)
    ap.add_argument("--clock", choices=["wall", "process"], default="wall",
                    help="maskc's clock: process = this process's CPU time (Flex stays on the wall clock)")
    ap.add_argument("--allocator", choices=["as-is", "warm"], default="as-is",
                    help="warm: free a 16 MiB block first, as a process that has freed a large array (glibc then "
                         "keeps freed memory: no page faults per bind); as-is: this process's state, which a Flex "
                         "run before maskc's also warms. Records carry faults_per_bind either way")
    ap.add_argument("--flex-max-elements", type=int, default=None,
                    help="skip eager create_block_mask past this many query-key pairs (default 2**26 on the CPU)")
    ap.add_argument("--out", default=None, help="default bench/results/bind_<device>.json")
    args = ap.parse_args()
    if args.impls is None:
        args.impls = ",".join(IMPLS) if args.device.startswith("cuda") else "maskc,flex"
    records = run(args)
    out = Path(args.out or W.ROOT / "bench" / "results" / f"bind_{args.device.split(':')[0]}.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(records, indent=1))
    print_table(records)


if __name__ == "__main__":
    main()
