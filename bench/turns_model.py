"""A model of the deterministic backward's schedule (wgmma_tma, dQ added in turns): why it loses most at 4K.

The dK/dV kernel runs one CTA per (key column, kv head), one CTA per SM, dispatched in launch order as SMs free
up: in L2 sections of heads, and within a section column by column (the heads of the section inner), in the order
of ``maskc.runs.ordered_columns``. A CTA walks its column's query blocks in order, one step each; the dQ warp adds a
step's partial dQ only when every column before it in the launch order that sees the same query block has added
(its turn), and a step's staging tile is reused two steps later. Causal, 64-row query blocks, 128-key columns,
16 heads; a step takes 1 unit, an addition ``--hold`` units. The fast mode is the same schedule without turns,
heaviest columns first.

    python bench/turns_model.py [--sms 132] [--hold 0.05]

It prints each length's makespan without turns, with turns shortest first (maskc's default order), longest first,
and in waves (``Options(dq_turn_order="wave")``: one wave of CTAs shortest first, then longest first), and their
ratios to the first. It models the order only, not what a turn costs (the spin, the wait for the addition to
land): measured ratios run ~0.1 below it (bench/NOTES.md, session 12).
"""
from __future__ import annotations

import argparse
import heapq


def causal_columns(seq_len: int) -> dict[int, list[int]]:
    """Key column j (128 keys) -> the 64-row query blocks it sees under the causal mask, in walking order."""
    return {j: list(range(2 * j, seq_len // 64)) for j in range(seq_len // 128)}


def makespan(seq_len: int, heads: int, section: int, order: str, sms: int, hold: float, turns: bool = True) -> float:
    """Time until the last CTA ends (module docstring); ``order``: "shortest" or "longest" first, or "wave" (the
    first ceil(sms / section) columns shortest first, the others longest first: maskc.runs.ordered_columns)."""
    cols = causal_columns(seq_len)
    by_length = sorted(cols, key=lambda j: (len(cols[j]), -j))          # shortest first, ties: later block first
    if order == "longest":
        by_length.reverse()
    elif order == "wave":
        wave = -(-sms // section)
        by_length = by_length[:wave] + by_length[wave:][::-1]
    launch = [(h, j) for first in range(0, heads, section) for j in by_length
              for h in range(first, min(heads, first + section))]
    position = {cta: i for i, cta in enumerate(launch)}
    contributors: dict[tuple[int, int], list[int]] = {}
    for h, j in launch:
        for qb in cols[j]:
            contributors.setdefault((h, qb), []).append(position[(h, j)])
    for ranks in contributors.values():
        ranks.sort()
    added: dict[tuple[int, int, int], float] = {}       # (head, query block, turn) -> when that addition landed
    free = [0.0] * sms                                  # when each SM frees up
    end_all = 0.0
    # turns follow the launch order, so each CTA depends only on CTAs dispatched before it: one pass in that order
    for h, j in launch:
        start = heapq.heappop(free)
        computed = last_add = add_before = start
        for qb in cols[j]:
            computed = max(computed, add_before) + 1.0                  # the staging tile of two steps back is free
            turn = contributors[(h, qb)].index(position[(h, j)])
            ready = added.get((h, qb, turn - 1), 0.0) if turns and turn else 0.0
            add = max(computed, ready, last_add) + hold
            added[(h, qb, turn)] = add
            add_before, last_add = last_add, add
        end = max(computed, last_add)
        end_all = max(end_all, end)
        heapq.heappush(free, end)
    return end_all


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sms", type=int, default=132)
    ap.add_argument("--hold", type=float, default=0.05, help="units an addition takes (a step is 1)")
    args = ap.parse_args()
    # heads per L2 section as the runtime picks them at D=128 on a 50 MB L2 (kernels._l2_section_heads)
    for seq_len, section in ((4096, 9), (8192, 4), (16384, 2), (32768, 1)):
        fast = makespan(seq_len, 16, section, "longest", args.sms, args.hold, turns=False)
        times = {order: makespan(seq_len, 16, section, order, args.sms, args.hold)
                 for order in ("shortest", "longest", "wave")}
        print(f"{seq_len:6d}: no turns {fast:8.0f} | " + " | ".join(
            f"{order} {t:8.0f} ({fast / t:.2f}x)" for order, t in times.items()))


if __name__ == "__main__":
    main()
