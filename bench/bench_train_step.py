"""An HSTU training step with a new mask every batch: re-bind + forward + backward, maskc against FlexAttention
(issue 16's end-to-end target: at least 1.3x faster than Flex-FA4 with create_block_mask per step).

    python bench/bench_train_step.py [--lengths 4096,32768,131072] [--steps 30] [--warmup 5] [--users 4]
                                     [--impls maskc_host,maskc_device,maskc_device_graph,flex_fa4,flex_triton]
                                     [--block-mask eager,compiled] [--device cuda|cpu] [--out PATH]

B=1 packed sequence of S tokens, H=16, D=128, bf16, the hstu mask (examples/hstu.mask; context 0). Every step is
a new packed batch: ``--users`` users of random lengths filling S, each with a random number of targets
(bench/workloads.py ``jagged_users``, one seeded generator: every implementation runs the same sequence of
batches). S stays fixed in a run, as in a packed training loop: only the jagged lengths inside it change (Flex
recompiles its kernels when the sequence length changes; here it must not, and the records say whether it did).
A step = bind the mask to the batch's lengths + forward + backward of ``out`` with a fixed output gradient
``g`` (``torch.autograd.grad(out, (q, k, v), g)``), timed by the wall clock, the GPU synchronised before the
step, after the bind and after the backward; median of ``--steps`` steps after ``--warmup`` (the first compiles).

- ``maskc_host``: ``mask.bind(seq_len=S, users=..., targets=...)`` on the host and the descriptors the kernels
  read (the tile shapes the warm-up asked for), then ``maskc.attention`` forward and backward.
- ``maskc_device``: a DeviceMask (``bind_on_device`` once), each step ``update(users=..., targets=...)`` with the
  lengths copied into GPU tensors and its descriptor views rebuilt on the GPU, eagerly; then attention.
- ``maskc_device_graph``: update + forward + backward captured once in a CUDA graph (as
  examples/train_packed.py ``--bind device --cuda-graph``); a step copies the lengths into the graph's input
  tensors and replays it (the bind is inside the replay: no ``bind_ms``; ``copy_ms`` the input copies,
  ``replay_ms`` the replay).
- ``flex_fa4`` / ``flex_triton``: FlexAttention with the hand-written hstu mask_mod (bench/workloads.py), on its
  FlashAttention-4 backend (``kernel_options={"BACKEND": "FLASH"}``) and on Triton, compiled once
  (``workloads.flex_functions``). The mask_mod reads per-token tables (user, position, history length) that each
  step rewrites in place (``hstu_tables``: built on the host as workloads.py builds them, then copied), so the
  compiled kernel and its guards see the same tensors every step; then ``create_block_mask(mask_mod, None,
  None, S, S)`` per step, as Flex users call it (``--block-mask eager``), or ``torch.compile(create_block_mask)``
  (``compiled``: Flex's advice for long sequences; records carry ``block_mask``). The tables and the block mask
  are the bind (``bind_ms``).

Checks, once per implementation, at the first step after the warm-up (new lengths): its output and gradients
against maskc_host's on the same batch (relative norm error within 3e-2, bf16; ``correct``, ``max_rel_err``;
maskc_host's own record compares it with itself: Flex's hand-written mask_mod is the independent side), which
would fail if Flex ran a kernel compiled for stale lengths; Flex's records carry ``new_graphs``, the
graphs dynamo compiled after the warm-up (0 expected: new lengths must not recompile). The device masks' own
checks (``DeviceMask.check``) run after the last step.

Records (bench/results/latest.json's keys: mask, seq_len, impl, pass = "train_step", ms, bind_ms,
fwd_bwd_ms, ..., and ``step_ms``, every timed step in order: the batches differ in cost, up to 2.8x in visible
pairs, so per-step ratios can be taken too) go to ``--out``; a table with the ratio of Flex-FA4's median step
time to each implementation's is printed last. On the CPU (``--device cpu``, a smoke run at toy sizes: float32,
maskc's reference path) only maskc_host and maskc_device run: FlexAttention has no backward on the CPU.
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

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workloads as W  # noqa: E402

import maskc  # noqa: E402  (workloads put the checkout first on sys.path)

IMPLS = ("maskc_host", "maskc_device", "maskc_device_graph", "flex_fa4", "flex_triton")
TOLERANCE = 3e-2


def batches(S: int, users: int, count: int, seed: int) -> list[tuple[list[int], list[int]]]:
    """The run's sequence of packed batches, (user lengths, target counts) each: the same for every impl."""
    rng = np.random.default_rng(seed)
    return [W.jagged_users(S, users, rng) for _ in range(count)]


def hstu_values(users, targets) -> dict:
    return {"users": users, "targets": targets, "context": 0}


# ---- the implementations: each makes (bind(users, targets), attend() -> (out, dq, dk, dv), final check) -------

def maskc_host(ctx):
    mask, (q, k, v, g) = ctx["mask"], ctx["inputs"]
    state = {"shapes": ()}

    def bind(users, targets):
        bound = mask.bind(seq_len=ctx["S"], **hstu_values(users, targets))
        for shape in state["shapes"]:          # the descriptors the kernels read, built now (else in the call)
            bound.descriptor(*shape)
        state["bound"] = bound

    def attend():
        out = maskc.attention(q, k, v, state["bound"])
        grads = torch.autograd.grad(out, (q, k, v), g)
        # the tile shapes the runtime asked this bound mask for (BoundMask's descriptor cache), for the next binds
        state["shapes"] = tuple(state["bound"].__dict__.get("_descriptors", ()))
        return (out, *grads)
    return bind, attend, None


def maskc_device(ctx):
    mask, (q, k, v, g), dev = ctx["mask"], ctx["inputs"], ctx["device"]
    users, targets = ctx["first"]
    dm = mask.bind_on_device(ctx["S"], users=users, targets=targets, max_segments=len(users), device=dev)
    state = {"views": ()}

    def bind(users, targets):
        dm.update(users=torch.tensor(users, dtype=torch.int32).to(dev),
                  targets=torch.tensor(targets, dtype=torch.int32).to(dev))
        if state["views"]:                     # the descriptor views the kernels read, built now (else in the call)
            dm.build_views(state["views"], torch.cuda.current_stream().cuda_stream)

    def attend():
        out = maskc.attention(q, k, v, dm)
        grads = torch.autograd.grad(out, (q, k, v), g)
        if dev.startswith("cuda"):             # the views the runtime built (DeviceMask's builders), for next binds
            state["views"] = tuple((bm, bn, b.cols is not None) for (bm, bn), b in dm._builders.items())
        return (out, *grads)
    return bind, attend, dm.check


def maskc_device_graph(ctx):
    mask, (q, k, v, g), dev = ctx["mask"], ctx["inputs"], ctx["device"]
    first_users, first_targets = ctx["first"]
    n = len(first_users)
    dm = mask.bind_on_device(ctx["S"], users=first_users, targets=first_targets, max_segments=n, device=dev)
    lengths = torch.zeros(n, dtype=torch.int32, device=dev)          # the graph's inputs
    counts = torch.zeros(n, dtype=torch.int32, device=dev)

    def write(users, targets):
        lengths.copy_(torch.tensor(users, dtype=torch.int32))
        counts.copy_(torch.tensor(targets, dtype=torch.int32))

    def step():
        dm.update(users=lengths, targets=counts)
        out = maskc.attention(q, k, v, dm)
        return (out, *torch.autograd.grad(out, (q, k, v), g))

    write(first_users, first_targets)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):                     # kernels loaded, buffers and launches made before the capture
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=side):
        static = step()

    def attend():
        graph.replay()
        return static
    return write, attend, dm.check


def flex(ctx, impl: str, block_mask: str):
    from torch.nn.attention.flex_attention import create_block_mask

    fn = ctx["flex"][0] if impl == "flex_triton" else ctx["flex"][1]
    if fn is None:
        raise RuntimeError("FlashAttention-4 is not importable here (Flex's FLASH backend needs it)")
    (q, k, v, g), S, dev = ctx["inputs"], ctx["S"], ctx["device"]
    users, targets = ctx["first"]
    tables = W.hstu_tables(users, targets, 0, dev)           # rewritten in place each step: the same tensors
    mask_mod = W.Workload("hstu", S, "hstu", hstu_values(users, targets), tables).mask_mod()
    if block_mask == "compiled" and "create_compiled" not in ctx:
        ctx["create_compiled"] = torch.compile(create_block_mask)
    create = create_block_mask if block_mask == "eager" else ctx["create_compiled"]
    state = {}

    def bind(users, targets):
        for name, table in W.hstu_tables(users, targets, 0, dev).items():
            tables[name].copy_(table)
        state["bm"] = create(mask_mod, None, None, S, S, device=dev)

    def attend():
        out = fn(q, k, v, block_mask=state["bm"])
        return (out, *torch.autograd.grad(out, (q, k, v), g))
    return bind, attend, None


MASKC = {"maskc_host": maskc_host, "maskc_device": maskc_device, "maskc_device_graph": maskc_device_graph}


# ---- timing and checks ---------------------------------------------------------------------------------------

def measure(make, ctx, seq: list, warmup: int, reference) -> dict:
    """Warm-up steps, one checked step (new lengths), then the timed steps: medians in ms, the check's errors."""
    from torch._dynamo.utils import counters

    on_gpu = ctx["device"].startswith("cuda")
    sync = torch.cuda.synchronize if on_gpu else (lambda: None)
    bind, attend, final_check = make(ctx)
    for users, targets in seq[:warmup]:
        bind(users, targets)
        attend()
    sync()
    graphs = counters["stats"]["unique_graphs"]
    bind(*seq[warmup])
    got = attend()
    errors = [W.rel_err(a.detach(), b) for a, b in zip(got, reference)]
    del got
    steps, binds = [], []
    for users, targets in seq[warmup + 1:]:
        sync()
        t0 = time.perf_counter()
        bind(users, targets)
        sync()
        t1 = time.perf_counter()
        attend()
        sync()
        steps.append((time.perf_counter() - t0) * 1e3)
        binds.append((t1 - t0) * 1e3)
    if final_check is not None:
        final_check()
    rec = dict(ms=statistics.median(steps), min_ms=min(steps), bind_ms=statistics.median(binds),
               fwd_bwd_ms=statistics.median(s - b for s, b in zip(steps, binds)), steps=len(steps), step_ms=steps,
               max_rel_err=max(errors), rel_err=errors,
               correct=all(e <= TOLERANCE for e in errors), new_graphs=counters["stats"]["unique_graphs"] - graphs)
    return rec


def run(args) -> list[dict]:
    on_gpu = args.device.startswith("cuda")
    impls = [i for i in args.impls.split(",") if i]
    unknown = set(impls) - set(IMPLS)
    if unknown:
        raise SystemExit(f"unknown impls {sorted(unknown)}: choose from {','.join(IMPLS)}")
    if not on_gpu:
        dropped = [i for i in impls if i not in ("maskc_host", "maskc_device")]
        if dropped:
            print(f"# on the CPU only maskc_host and maskc_device run (FlexAttention has no backward there, a CUDA "
                  f"graph needs the GPU): {','.join(dropped)} skipped", flush=True)
        impls = [i for i in impls if i not in dropped]
    common = dict(mask="hstu", device=args.device, gpu=torch.cuda.get_device_name() if on_gpu else None,
                  date=datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
                  command="python bench/bench_train_step.py " + " ".join(sys.argv[1:]), B=W.B, H=W.H, D=W.D,
                  dtype="bf16" if on_gpu else "float32", warmup=args.warmup)
    common["pass"] = "train_step"
    dtype = torch.bfloat16 if on_gpu else torch.float32
    ctx = {"mask": W._compiled("hstu"), "device": args.device}
    if any(i.startswith("flex") for i in impls):
        ctx["flex"] = W.flex_functions()
    records = []
    for S in (int(x) for x in args.lengths.split(",") if x):
        seq = batches(S, args.users, args.warmup + 1 + args.steps, args.seed)
        gen = torch.Generator(device=args.device).manual_seed(0)
        q, k, v, g = (torch.randn(W.B, W.H, S, W.D, device=args.device, dtype=dtype, generator=gen)
                      for _ in range(4))
        ctx.update(S=S, first=seq[0], inputs=(*(x.requires_grad_() for x in (q, k, v)), g))
        # the reference: maskc_host on the checked step's batch
        bound = ctx["mask"].bind(seq_len=S, **hstu_values(*seq[args.warmup]))
        out = maskc.attention(*ctx["inputs"][:3], bound)
        reference = [x.detach() for x in (out, *torch.autograd.grad(out, ctx["inputs"][:3], g))]
        del out, bound
        base = dict(common, seq_len=S, params={"users": args.users, "targets": "0 to length // 5, random",
                                               "context": 0, "seed": args.seed})
        variants = [(i, None) for i in impls if not i.startswith("flex")]
        variants += [(i, b) for i in impls if i.startswith("flex") for b in args.block_mask.split(",") if b]
        for impl, block_mask in variants:
            rec = dict(base, impl=impl, **({"block_mask": block_mask} if block_mask else {}))
            make = (lambda c, i=impl, b=block_mask: flex(c, i, b)) if block_mask else MASKC[impl]
            try:
                rec.update(measure(make, ctx, seq, args.warmup, reference))
                if impl == "maskc_device_graph":   # the bind runs inside the replay; "bind" was the input copies
                    rec.update(copy_ms=rec["bind_ms"], bind_ms=None, replay_ms=rec.pop("fwd_bwd_ms"))
            except Exception as exc:   # noqa: BLE001 - an implementation that cannot run is reported, not fatal
                rec.update(ms=None, error=repr(exc)[:400])
            records.append(rec)
            print(json.dumps(rec), flush=True)
            if on_gpu:
                torch.cuda.empty_cache()
        del q, k, v, g, reference
        ctx.pop("inputs")
    return records


def print_table(records: list[dict]) -> None:
    by = {(r["seq_len"], r["impl"], r.get("block_mask")): r for r in records}
    fmt = lambda x, p=2: "-" if x is None else f"{x:.{p}f}"  # noqa: E731
    print("\n| S | impl | block mask | step ms | bind ms | fwd+bwd ms | correct (max err) | new graphs "
          "| Flex-FA4 (eager block mask) / this | Flex-FA4 (compiled block mask) / this |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for (S, impl, block_mask), r in by.items():
        if r.get("ms") is None:
            print(f"| {S} | {impl} | {block_mask or '-'} | failed: {r.get('error', '')[:80]} | | | | | | |")
            continue
        peers = [by.get((S, "flex_fa4", b)) for b in ("eager", "compiled")]
        ratios = [fmt(p["ms"] / r["ms"]) + "x" if p and p.get("ms") else "-" for p in peers]
        print(f"| {S} | {impl} | {block_mask or '-'} | {fmt(r['ms'])} | {fmt(r.get('bind_ms'))} | "
              f"{fmt(r.get('fwd_bwd_ms'))} | {r['correct']} ({r['max_rel_err']:.1e}) | "
              f"{r['new_graphs'] if block_mask else '-'} | {ratios[0]} | {ratios[1]} |")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lengths", default="4096,32768,131072")
    ap.add_argument("--steps", type=int, default=30, help="timed steps per implementation (after the warm-up)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first (the first one compiles)")
    ap.add_argument("--users", type=int, default=4, help="users packed in each batch (random lengths filling S)")
    ap.add_argument("--seed", type=int, default=0, help="the batches' generator")
    ap.add_argument("--impls", default=",".join(IMPLS), help=f"of {','.join(IMPLS)}")
    ap.add_argument("--block-mask", default="eager,compiled",
                    help="how the Flex impls build their block mask per step: eager create_block_mask, "
                         "torch.compile(create_block_mask), or both (each a record)")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run at toy sizes (maskc only)")
    ap.add_argument("--out", default=str(W.ROOT / "bench" / "results" / "train_step.json"))
    args = ap.parse_args()
    if args.warmup < 1 or args.steps < 1:
        ap.error("--warmup and --steps must be at least 1 (the checked step follows a warm-up step's lengths)")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("# no CUDA device: nothing measured (--device cpu runs a smoke test of maskc's CPU path)")
        return
    records = run(args)
    W.write_records(args.out, records)
    print_table(records)


if __name__ == "__main__":
    main()
