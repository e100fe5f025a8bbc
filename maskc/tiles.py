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
    return _joined(row[order], begin[order], end[order], kind[order], rows)


def _joined(row: np.ndarray, begin: np.ndarray, end: np.ndarray, kind: np.ndarray, rows: int):
    """CSR from non-empty runs sorted by row and begin, adjacent runs of one kind merged."""
    joins = (row[1:] == row[:-1]) & (kind[1:] == kind[:-1]) & (begin[1:] == end[:-1])
    if joins.any():
        head = np.flatnonzero(np.concatenate([[True], ~joins]))
        end = np.maximum.reduceat(end, head)
        row, begin, kind = row[head], begin[head], kind[head]
    offsets = np.zeros(rows + 1, np.int32)
    np.cumsum(np.bincount(row, minlength=rows), out=offsets[1:])
    runs = np.empty((len(row), 3), np.int32)
    runs[:, 0], runs[:, 1], runs[:, 2] = begin, end, kind
    return offsets, runs


def starts_of(block: np.ndarray) -> np.ndarray:
    """The index of the first element of each run of equal values of ``block``."""
    new = np.empty(len(block), bool)
    new[:1] = True
    np.not_equal(block[1:], block[:-1], out=new[1:])
    return np.flatnonzero(new)


def runs_of_keys(block: np.ndarray, slots, need: np.ndarray, kv_len: int, block_n: int, rows: int):
    """CSR runs of ``rows`` q_blocks from the key intervals of their *owners* (rows, or pieces of rows).

    Owner i lies in q_block ``block[i]`` (``block`` ascending). ``slots`` is a list of ``(lo, hi, lo_b, hi_b)``
    arrays over the owners: slot j of owner i holds keys ``[lo, hi)`` at the owner's first row and
    ``[lo_b, hi_b)`` at its last (empty at both or at neither), every row between seeing an interval that
    moves from one to the other by one key per row at most, so that the rows' union is the hull of the two
    and their intersection the intersection. An owner's slots are disjoint and not adjacent; ``need[q]``
    counts q_block q's owners. A key block is FULL where every owner covers it at every row, PARTIAL where
    some row touches it. Work and memory are O(owners x slots): the tile grid is never built.

    Most q_blocks are settled from per-slot hulls (the keys touched are the hull of each slot's intervals
    where consecutive owners' intervals chain; a block every owner covers lies in one slot where the slots'
    hulls are disjoint); the others from the intervals themselves (:func:`_counted_runs`)."""
    kt = -(-kv_len // block_n)
    first = starts_of(block)                                  # each q_block's first owner
    present = block[first]
    bad = np.zeros(len(first), bool)
    big = np.int64(1) << 40
    hulls, flat = [], []
    for lo, hi, lo_b, hi_b in slots:
        live = lo < hi
        t0 = np.where(live, np.minimum(lo, lo_b) // block_n, big)       # touched key blocks [t0, t1)
        t1 = np.where(live, -(-np.maximum(hi, hi_b) // block_n), -1)
        inner_hi = np.minimum(hi, hi_b)
        c0 = np.where(live, -(-np.maximum(lo, lo_b) // block_n), big)   # covered key blocks [c0, c1)
        c1 = np.where(live, np.where(inner_hi >= kv_len, kt, inner_hi // block_n), -1)   # short last tile
        idx = np.flatnonzero(live)            # a hole: consecutive live owners' intervals apart
        a, b = idx[:-1], idx[1:]
        hole = (block[a] == block[b]) & ((t0[b] > t1[a]) | (t0[a] > t1[b]))
        bad[np.searchsorted(present, block[a[hole]])] = True
        hulls.append((np.minimum.reduceat(t0, first), np.maximum.reduceat(t1, first),
                      np.maximum.reduceat(c0, first), np.minimum.reduceat(c1, first)))
        flat.append((live, t0, t1, c0, c1))
    h0, h1, f0, f1 = (np.array(x) for x in zip(*hulls))          # [slots, q_blocks]
    for i in range(len(slots)):                               # a key block two slots' hulls share
        for j in range(i + 1, len(slots)):
            bad |= (h0[i] < h1[i]) & (h0[j] < h1[j]) & (h0[i] < h1[j]) & (h0[j] < h1[i])
    some = h0 < h1
    h0, h1 = np.where(some, h0, 0), np.where(some, h1, 0)
    cut0, cut1 = np.maximum(f0, h0), np.minimum(f1, h1)
    has_full = cut0 < cut1
    cut0, cut1 = np.where(has_full, cut0, h1), np.where(has_full, cut1, h1)
    # Per q_block, each slot's PARTIAL, FULL, PARTIAL runs, slot after slot: already in order.
    begin, end = np.empty((len(first), 3 * len(slots)), np.int64), np.empty((len(first), 3 * len(slots)), np.int64)
    begin[:, 0::3], begin[:, 1::3], begin[:, 2::3] = h0.T, cut0.T, cut1.T
    end[:, 0::3], end[:, 1::3], end[:, 2::3] = cut0.T, cut1.T, h1.T
    keep = begin < end
    keep[bad] = False
    at, col = np.nonzero(keep)
    out = (present[at], begin[at, col], end[at, col], np.where(col % 3 == 1, FULL, PARTIAL))
    if not bad.any():
        return _joined(*out, rows)
    owners = np.isin(block, present[bad])
    counted = _counted_runs(block, owners, [np.stack(x) for x in zip(*flat)], need, kt)
    return merge_runs(*(np.concatenate([o, c]) for o, c in zip(out, counted)), rows)


def _counted_runs(block, owners, flat, need, kt: int):
    """Runs ``(q_block, begin, end, kind)`` of the q_blocks of the ``owners`` from their slots' touched
    ``[t0, t1)`` and covered ``[c0, c1)`` key blocks ([slots, owners]): touched blocks the union, FULL those
    every owner covers (each owner's covered ranges are disjoint, so a count of ``need`` is every owner)."""
    live, t0, t1, c0, c1 = flat
    pick = live & owners
    rows = np.broadcast_to(block, live.shape)
    touched = union(rows[pick], t0[pick], t1[pick], kt)
    pick &= c0 < c1
    covered = covered_by_all(rows[pick], c0[pick], c1[pick], need, kt)
    partial = subtract(touched, covered, kt)
    return tuple(np.concatenate([c, p]) for c, p in zip(covered + (np.full(len(covered[0]), FULL),),
                                                     partial + (np.full(len(partial[0]), PARTIAL),)))
