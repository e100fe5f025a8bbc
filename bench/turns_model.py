"""A model of the deterministic backward's schedule (wgmma_tma, dQ added in turns) on any benchmark mask.

The dK/dV kernel runs one CTA per (key column, kv head), one CTA per SM, dispatched in launch order as SMs free
up: in sections of heads, and within a section column by column (the heads of the section inner), in the order of
``maskc.runs.ordered_columns``. A CTA walks its column's query blocks in order, one step each; the dQ warp adds a
step's partial dQ only when every column before it in the launch order that sees the same query block has added
(its turn), and a step's staging tile is reused two steps later. A step takes 1 unit, an addition ``--hold`` units
(``maskc.runs.TURN_HOLD``, 1, reproduces CLEAR's measured 0.54x at 32K; causal's 4K loss is about 0.1 below the
model at any hold). The fast mode is the same schedule without turns, heaviest columns first.

    python bench/turns_model.py [--masks causal,clear] [--lengths 4096,32768] [--sms 132] [--hold 1]

For each mask and length: the makespan without turns in the L2's sections (``kernels._l2_section_heads`` on a
50 MB L2 at D=128), then with turns shortest first (maskc's default order), in waves (``Options(dq_turn_order=
"wave")``: one wave of CTAs shortest first, then longest first), and shortest first in the sections that
``Descriptor.turn_sections`` picks, each with its ratio to the first. It models the order only, not what a turn
costs beyond its hold.
"""
from __future__ import annotations

import argparse
import heapq

from maskc.ordered import token_order
from maskc.runs import TURN_HOLD

L2_BYTES = 50 * 2 ** 20


def columns_of(desc) -> list[list[int]]:
    """The query blocks of each key column of a descriptor's column view, in walking order."""
    offsets, runs = desc.col_offsets, desc.col_runs
    return [[qb for r in range(offsets[c], offsets[c + 1]) for qb in range(runs[r, 0], runs[r, 1])]
            for c in range(len(offsets) - 1)]


def makespan(columns, order, heads: int, section: int, sms: int, hold: float, turns: bool = True) -> float:
    """When the last CTA ends (module docstring), columns launched in ``order``, ``section`` heads at a time."""
    launch = [(h, c) for first in range(0, heads, section) for c in order
              for h in range(first, min(heads, first + section))]
    added: dict[tuple[int, int], float] = {}        # (head, query block) -> when its last addition landed
    free = [0.0] * sms                              # when each SM frees up
    end_all = 0.0
    # turns follow the launch order, so each CTA depends only on CTAs dispatched before it: one pass in that order
    for h, c in launch:
        start = heapq.heappop(free)
        computed = last_add = add_before = start
        for qb in columns[c]:
            computed = max(computed, add_before) + 1.0                  # the staging tile of two steps back is free
            ready = added.get((h, qb), 0.0) if turns else 0.0
            add = max(computed, ready, last_add) + hold
            added[(h, qb)] = add
            add_before, last_add = last_add, add
        end = max(computed, last_add)
        end_all = max(end_all, end)
        heapq.heappush(free, end)
    return end_all


def main() -> None:
    import bench.workloads as W
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--masks", default="causal,document,clear")
    ap.add_argument("--lengths", default="4096,32768")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--hold", type=float, default=TURN_HOLD, help="units an addition takes (a step is 1)")
    args = ap.parse_args()
    for S in map(int, args.lengths.split(",")):
        l2 = max(1, min(args.heads, int(0.8 * L2_BYTES // (S * (128 * (2 + 2 + 4) + 8)))))
        for name in args.masks.split(","):
            bound = W.workload(name, S, device="cpu").bound()
            ordered = token_order(bound)
            desc = getattr(ordered, "inner", bound).descriptor(64, 128)
            columns = columns_of(desc)
            fast = makespan(columns, desc.col_work_order, args.heads, l2, args.sms, args.hold, turns=False)
            wave = -(-args.sms // l2)
            wider = desc.turn_sections(args.heads, l2, args.sms)
            times = {"shortest": makespan(columns, desc.turns()[0], args.heads, l2, args.sms, args.hold),
                     "wave": makespan(columns, desc.turns(wave)[0], args.heads, l2, args.sms, args.hold),
                     f"sections {wider}": makespan(columns, desc.turns()[0], args.heads, wider, args.sms, args.hold)}
            print(f"{name:14s} {S:6d} (sections {l2}): no turns {fast:7.0f} | " + " | ".join(
                f"{what} {t:7.0f} ({fast / t:.2f}x)" for what, t in times.items()), flush=True)


if __name__ == "__main__":
    main()
