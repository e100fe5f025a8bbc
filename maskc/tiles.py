"""Run-length tile rows: the shared currency of classify and pack (int32 CSR of (begin, end, kind))."""
from __future__ import annotations

import numpy as np

from .keys import covered_by_all, subtract, union
from .kernel_ir import EMPTY, FULL, PARTIAL

PARTIAL_COST = 1.25     # a PARTIAL tile also evaluates the predicate: a little dearer than a FULL one


def heaviest_first(offsets: np.ndarray, runs: np.ndarray) -> np.ndarray:
    """int32 permutation of the CSR rows by non-increasing cost (FULL + PARTIAL_COST * PARTIAL tiles),
    ties in row order: the launch order that finishes the longest rows first (LPT)."""
    rows = len(offsets) - 1
    row_of_run = np.repeat(np.arange(rows), np.diff(offsets))
    weight = (runs[:, 1] - runs[:, 0]) * np.where(runs[:, 2] == PARTIAL, PARTIAL_COST, 1.0)
    cost = np.bincount(row_of_run, weight, minlength=rows)
    return np.lexsort((np.arange(rows), -cost)).astype(np.int32)


def runs_of(classes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR runs of equal non-EMPTY classes along the last axis of int8[R, C]:
    ``offsets`` int32[R + 1] and ``runs`` int32[n, 3] of (begin, end, kind)."""
    rows, cols = classes.shape
    padded = np.full((rows, cols + 2), -1, np.int8)
    padded[:, 1:-1] = classes
    live = classes != EMPTY
    starts = live & (padded[:, 1:-1] != padded[:, :-2])       # a non-empty run begins here
    ends = live & (padded[:, 1:-1] != padded[:, 2:])          # ... and ends here (inclusive)
    r, c = np.nonzero(starts)
    _, e = np.nonzero(ends)                                   # same runs, same row-major order
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(r, minlength=rows), out=offsets[1:])
    runs = np.stack([c, e + 1, classes[r, c]]).T.astype(np.int32) if len(r) else np.zeros((0, 3), np.int32)
    return offsets, np.ascontiguousarray(runs)


def dense_of(offsets: np.ndarray, runs: np.ndarray, cols: int) -> np.ndarray:
    """int8[R, cols] classes from CSR runs (the inverse of :func:`runs_of`), vectorized."""
    rows = len(offsets) - 1
    out = np.zeros(rows * (cols + 1), np.int16)
    if len(runs):
        row = np.repeat(np.arange(rows), np.diff(offsets))
        base = row * (cols + 1)
        kind = runs[:, 2].astype(np.int16)
        np.add.at(out, base + runs[:, 0], kind)
        np.add.at(out, base + runs[:, 1], -kind)
    return np.cumsum(out.reshape(rows, cols + 1), axis=1)[:, :cols].astype(np.int8)


def merge_runs(row: np.ndarray, begin: np.ndarray, end: np.ndarray, kind: np.ndarray, rows: int):
    """CSR from unsorted, non-overlapping runs: sorted per row, empty ones dropped, adjacent runs of
    one kind merged."""
    keep = begin < end
    row, begin, end, kind = row[keep], begin[keep], end[keep], kind[keep]
    order = np.lexsort((begin, row))
    row, begin, end, kind = row[order], begin[order], end[order], kind[order]
    joins = np.zeros(len(row), bool)
    joins[1:] = (row[1:] == row[:-1]) & (kind[1:] == kind[:-1]) & (begin[1:] == end[:-1])
    head = np.nonzero(~joins)[0]
    if len(head):
        end = np.maximum.reduceat(end, head)
        row, begin, kind = row[head], begin[head], kind[head]
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(row, minlength=rows), out=offsets[1:])
    runs = np.stack([begin, end, kind]).T.astype(np.int32) if len(row) else np.zeros((0, 3), np.int32)
    return offsets, np.ascontiguousarray(runs)


def runs_of_keys(block: np.ndarray, lo: np.ndarray, hi: np.ndarray, need: np.ndarray, kv_len: int,
                 block_n: int, rows: int, last: tuple[np.ndarray, np.ndarray] | None = None):
    """CSR runs of ``rows`` q_blocks from the key intervals of their *owners* (rows, or pieces of rows).

    Interval i belongs to an owner in q_block ``block[i]``: keys ``[lo, hi)`` at the owner's first row and
    ``last`` = ``(lo_b, hi_b)`` at its last (the same row when omitted), with every row between seeing an
    interval that moves monotonically from one to the other, one key per row at most (so the rows' union is
    the hull of the two, their intersection the intersection). An owner's intervals are disjoint and not
    adjacent; ``need[q]`` counts q_block q's owners, those that see nothing included. A key block is FULL
    where every owner covers it at every row, PARTIAL where some row touches it. Work and memory are
    O(intervals log intervals): the tile grid is never built."""
    kt = -(-kv_len // block_n)
    lo_b, hi_b = (lo, hi) if last is None else last
    live = lo < hi
    block, outer_lo, outer_hi = block[live], np.minimum(lo, lo_b)[live], np.maximum(hi, hi_b)[live]
    inner_lo, inner_hi = np.maximum(lo, lo_b)[live], np.minimum(hi, hi_b)[live]
    touched = union(block, outer_lo // block_n, -(-outer_hi // block_n), kt)
    c0 = -(-inner_lo // block_n)
    c1 = np.where(inner_hi >= kv_len, kt, inner_hi // block_n)       # the last, short tile ends at kv_len
    ok = c0 < c1
    covered = covered_by_all(block[ok], c0[ok], c1[ok], need, kt)
    partial = subtract(touched, covered, kt)
    kinds = (np.full(len(covered[0]), FULL), np.full(len(partial[0]), PARTIAL))
    return merge_runs(*(np.concatenate(x) for x in zip(covered + kinds[:1], partial + kinds[1:])), rows)
