"""Executed instructions and stall samples of one profiled kernel, by SASS opcode: reads the CSV that
``ncu --section InstructionStats --section SourceCounters --page source --print-source sass --csv`` writes
(one row per SASS instruction) and prints the opcodes that account for most of them, with their share.

    python bench/ncu_opcodes.py sass.csv [--top 25]
"""
from __future__ import annotations

import argparse
import csv
import re
import sys
from collections import Counter

PREDICATE = re.compile(r"^@!?U?P\w+\s+")


def opcode(source: str) -> str:
    """``@!P0 LOP3.LUT R1, ...`` -> ``LOP3``: the operation without its predicate and modifiers."""
    text = PREDICATE.sub("", source.strip())
    return text.split(" ", 1)[0].split(".", 1)[0] if text else "?"


def number(text: str) -> float:
    try:
        return float(text.replace(",", "")) if text else 0.0
    except ValueError:
        return 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("csv")
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    with open(args.csv, newline="") as f:
        rows = list(csv.reader(f))
    header_at = next((i for i, r in enumerate(rows) if "Source" in r and "Instructions Executed" in r), None)
    if header_at is None:
        sys.exit(f"{args.csv}: no row with the columns Source and Instructions Executed")
    header = rows[header_at]
    source, executed = header.index("Source"), header.index("Instructions Executed")
    stalls = next((header.index(c) for c in header if c.startswith("Warp Stall Sampling (All")), None)
    counts, samples = Counter(), Counter()
    for r in rows[header_at + 1:]:
        if len(r) != len(header):
            continue
        op = opcode(r[source])
        counts[op] += number(r[executed])
        if stalls is not None:
            samples[op] += number(r[stalls])
    total, total_samples = sum(counts.values()), sum(samples.values()) or 1.0
    print(f"{total / 1e9:.3f} G instructions executed; stall samples {total_samples:.0f}")
    print(f"{'opcode':<12} {'executed':>10} {'share':>7} {'stall share':>12}")
    for op, n in counts.most_common(args.top):
        print(f"{op:<12} {n / 1e6:>9.1f}M {100 * n / total:>6.1f}% {100 * samples[op] / total_samples:>11.1f}%")


if __name__ == "__main__":
    main()
