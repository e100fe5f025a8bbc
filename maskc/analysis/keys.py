"""Rows' visible keys as flat interval lists: chunked regions enumerated, regions unioned, denies subtracted.

Classification's exact instrument for masks with chunked regions (:class:`~maskc.ir.ChunkedKeys`), where a
row's keys are a variable number of intervals. A *flat* list is three int64 arrays ``(row, lo, hi)``: key
intervals ``[lo, hi)`` of the rows ``row`` (indices into the caller's rows). :func:`row_keys` returns,
per row, the keys of the allow regions minus those of the deny regions as sorted, disjoint, non-adjacent
intervals, with work proportional to the intervals enumerated (``budget`` caps them: beyond it
:class:`TooMany` is raised and the caller falls back to sound bounds).

:func:`enumerate_keys` is the enumeration itself, for one region, at one or two points per owner: one
(rows), or a piece's two end rows (:mod:`maskc.analysis.piece_tiles` reads the second point to tell which chunks,
and which intervals, a whole piece of rows shares).
"""
from __future__ import annotations

import functools

import numpy as np

from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.rows import RowValues, k_bound_rows, split_on_chunks


class TooMany(Exception):
    """More intervals than the budget allows: the caller classifies this mask soundly instead."""


def values_at(params, seq_len: int, kv_len: int, head: int, batch_index: int):
    """The ``make`` that :func:`enumerate_keys` takes, for one batch element and head."""
    def make(q: np.ndarray, chunks: dict, gather=None) -> RowValues:
        return RowValues(params, seq_len, kv_len, head, batch_index, q, chunks=chunks, gather=gather)
    return make


def nest_of(region: ir.RegionBounds) -> ir.ChunkedKeys:
    """The region's keys as a nest: its chunks, or for a linear region a nest of one level (k)."""
    if region.chunks is not None:
        return region.chunks
    assert region.linear, "an opaque region without chunks has no exact keys"
    return ir.ChunkedKeys((ir.ChunkLevel(F.K, region.lower, region.upper),))


def _bounds(level: ir.ChunkLevel, rows: RowValues):
    """The level's lower bounds (ceil) and upper bounds (floor) at the rows, as lists of values."""
    return ([k_bound_rows(b, rows, lower=True) for b in level.lower],
            [k_bound_rows(b, rows, lower=False) for b in level.upper])


def _groups(level: ir.ChunkLevel, lower: bool) -> tuple:
    """The level's lower (upper) bounds grouped by the part of their form that reads chunk indices and their
    divisor: ``(moving, den, fixed forms)`` per group, ``moving`` a form of the chunk-reading terms (None: the
    bounds free of chunks), the fixed forms the rest of each bound (constant included). Kept on the level."""
    key = "_lower_groups" if lower else "_upper_groups"
    cached = level.__dict__.get(key)
    if cached is None:
        found: dict = {}
        for b in (level.lower if lower else level.upper):
            fixed, moving = split_on_chunks(b.lin)
            found.setdefault((ir.Lin(moving, 0) if moving else None, b.den), []).append(fixed)
        cached = tuple((moving, den, tuple(fixed)) for (moving, den), fixed in found.items())
        object.__setattr__(level, key, cached)
    return cached


def _extremes(level: ir.ChunkLevel, base: RowValues, index: np.ndarray, family, clip: tuple | None):
    """The level's greatest lower bound and least upper bound, int64[count, families] each, at the families
    of ``index`` ([count, families] rows of ``base``).

    By groups (:func:`_groups`): the greatest of a group's chunk-free parts is taken at the owners' rows,
    gathered once, and its chunk-reading part added once: ``max(ceil((a + m) / d), ceil((b + m) / d)) =
    ceil((max(a, b) + m) / d)`` (and so for floors and minima). ``family()`` is the RowValues of the
    families (for the chunk-reading parts); ``clip``, the bounds (0, kv_len - 1) of the keys at level 0."""
    out = []
    for lower, fn in ((True, np.maximum), (False, np.minimum)):
        found = [] if clip is None else [clip[0 if lower else 1]]
        for moving, den, fixed in _groups(level, lower):
            v = functools.reduce(fn, [base.lin(lin) for lin in fixed])
            v = v[index] if np.ndim(v) else v
            if moving is not None:
                v = v + family().lin(moving)
            if den != 1:
                v = -((-v) // den) if lower else v // den
            found.append(v)
        acc = functools.reduce(fn, found)          # a level's bounds include its chunk's range: never empty
        out.append(np.broadcast_to(acc, index.shape) if np.shape(acc) != index.shape else acc)
    return out


def enumerate_keys(region: ir.RegionBounds, make, points: list[np.ndarray], kv_len: int, budget: int):
    """Every (owner, chunk) of one region and its key interval at each point.

    ``points`` are one or two int64 arrays of query positions, one entry per owner; ``make(q, chunks,
    gather)`` returns the RowValues at positions ``q`` with chunk indices ``chunks`` (forms free of them
    taken from ``gather``: values at the owners' rows, and an index). Returns ``(owner, lo, hi, unsure,
    blind, cut)``: per enumerated interval its owner and, per point, ``[lo, hi)`` (empty where lo >= hi); with
    two points, ``unsure`` flags owners whose guards or chunk ranges differ between the points (their
    intervals are left out), ``blind`` the intervals that some upper bound keeps below some lower
    bound at both points, and ``cut`` (-1 where none) for intervals empty at one point only, the row where
    they would change from empty to not or back if every bound were affine between the points (see
    :func:`_blind_and_cuts`).
    """
    nest = nest_of(region)
    n = len(points[0])
    owner = np.arange(n)
    unsure = np.zeros(n, bool)
    count = len(points)               # the points stacked: one RowValues over all of them
    at = points[0] if count == 1 else np.concatenate(points)
    base = make(at, {}, None)
    ok = np.ones(n * count, bool)
    for g in region.static_guards + region.guards + nest.guards:
        ok = ok & (base.lin(g.lin) <= 0)
    at_point = ok.reshape(count, n)
    if count == 2:
        unsure |= at_point[0] != at_point[1]
    owner = owner[at_point[0] & ~unsure]

    def extremes(level: ir.ChunkLevel, chunks: dict, clip=None):
        """The level's bounds' extremes (lo, hi inclusive) [count, owners], all points at once (forms of the
        chunks alone evaluated once per owner, not per point), and the owners' rows."""
        index = owner[None] + n * np.arange(count)[:, None]      # (count, owners); chunks broadcast along
        found: list = []

        def family():
            if not found:
                found.append(make(at[index], chunks, (base, index)))
            return found[0]
        return (*_extremes(level, base, index, family, clip), index)

    chunks: dict = {}
    for level in reversed(nest.levels[1:]):
        lo, hi, _ = extremes(level, chunks)
        lo, hi = list(lo), list(hi)
        if count == 2:
            differ = (lo[0] != lo[1]) | (hi[0] != hi[1])
            unsure[owner[differ]] = True
            hi[0] = np.where(differ, lo[0] - 1, hi[0])
        per = np.maximum(hi[0] - lo[0] + 1, 0)
        total = int(per.sum())
        if total > budget:
            raise TooMany(f"{total} chunks")
        pick = np.repeat(np.arange(len(owner)), per)
        within = np.arange(total) - np.repeat(per.cumsum() - per, per)
        chunks = {v: a[pick] for v, a in chunks.items()}
        chunks[level.var] = lo[0][pick] + within
        owner = owner[pick]
    lo, hi, index = extremes(nest.levels[0], chunks, (np.int64(0), np.int64(kv_len - 1)))
    lo, hi = list(lo), list(hi + 1)
    blind = np.zeros(len(owner), bool)
    cut = np.full(len(owner), -1, np.int64)
    if count == 2:
        def bounds_at(pick):          # every bound of level 0 at both points, for the families ``pick``
            sub = index[:, pick]
            lows, highs = _bounds(nest.levels[0], make(at[sub], {v: c[pick] for v, c in chunks.items()}, (base, sub)))
            lows, highs = lows + [np.int64(0)], highs + [np.int64(kv_len - 1)]
            return [[np.broadcast_to(v, sub.shape)[p] for v in vs] for p in range(2) for vs in (lows, highs)]
        _blind_and_cuts(points, owner, lo, hi, bounds_at, blind, cut)
    return owner, lo, hi, unsure, blind, cut


def _blind_and_cuts(points, owner, lo, hi, bounds_at, blind, cut) -> None:
    """``blind`` and ``cut`` of :func:`enumerate_keys` (filled in place) for the intervals empty at one point
    at least; ``bounds_at(pick)`` gives every lower and upper bound of those intervals at both points.

    An interval is non-empty where every difference ``d = upper - lower`` of one of its upper and one of its
    lower bounds is >= 0. Interpolating each difference between the two points gives, for an interval
    non-empty at the first point only, the first row where some difference turns negative, and for one
    non-empty at the second only, the first row from which all are >= 0: the row where a piece would be cut
    so that the interval is empty at both ends of each part or at neither. Only a proposal: the caller
    enumerates the parts again and checks them as any piece (bounds that are not affine there just leave
    the parts flagged).
    """
    live_a, live_b = lo[0] < hi[0], lo[1] < hi[1]
    pick = (~(live_a & live_b)).nonzero()[0]
    if not len(pick):
        return
    lows_a, highs_a, lows_b, highs_b = (np.array(v) for v in bounds_at(pick))
    d_a = (highs_a[:, None] - lows_a[None]).reshape(-1, len(pick))     # every (upper, lower) pair
    d_b = (highs_b[:, None] - lows_b[None]).reshape(-1, len(pick))
    start, end = points[0][owner[pick]], points[1][owner[pick]]
    span = end - start
    never = ((d_a < 0) & (d_b < 0)).any(axis=0)
    down, up = (d_a >= 0) & (d_b < 0), (d_a < 0) & (d_b >= 0)
    step = np.where(down | up, d_b - d_a, 1)
    first_out = np.where(down, start + (d_a * span) // -step + 1, end + 1).min(axis=0)
    first_in = np.where(up, start + (-d_a * span + step - 1) // step, start).max(axis=0)
    blind[pick] = never
    row = np.where(live_a[pick], first_out, first_in)
    proposed = (live_a[pick] != live_b[pick]) & (row > start) & (row <= end)
    cut[pick[proposed]] = row[proposed]


# -- flat interval lists ----------------------------------------------------------------------------

def sorted_unique(values: np.ndarray, return_inverse: bool = False):
    """``np.unique`` of int64 values by one sort (numpy's own hashes first: several times slower on the
    short arrays classification makes), and with ``return_inverse`` where each value went."""
    if return_inverse:
        order = values.argsort(kind="stable")
        ordered = values[order]
    else:
        ordered = values.copy()
        ordered.sort()
    new = np.empty(len(ordered), bool)
    new[:1] = True
    np.not_equal(ordered[1:], ordered[:-1], out=new[1:])
    if not return_inverse:
        return ordered[new]
    inverse = np.empty(len(values), np.intp)
    inverse[order] = new.cumsum() - 1
    return ordered[new], inverse


def union(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, kv_len: int):
    """Per row, the union of the intervals as sorted, disjoint, non-adjacent ones (empty ones dropped)."""
    keep = lo < hi
    row, lo, hi = row[keep], lo[keep], hi[keep]
    if not len(row):
        return row, lo, hi
    width = kv_len + 1                                 # rows never touch on this line
    g_lo, g_hi = row * width + lo, row * width + hi
    order = g_lo.argsort(kind="stable")
    g_lo, g_hi = g_lo[order], g_hi[order]
    reach = np.maximum.accumulate(g_hi)
    starts = np.ones(len(g_lo), bool)
    starts[1:] = g_lo[1:] > reach[:-1]
    first = starts.nonzero()[0]
    g_lo, g_hi = g_lo[first], np.maximum.reduceat(g_hi, first)
    out_row = g_lo // width
    return out_row, g_lo - out_row * width, g_hi - out_row * width


def subtract(keys, deny, kv_len: int):
    """Per row, ``keys`` minus ``deny`` (both as :func:`union` returns them)."""
    if not len(deny[0]) or not len(keys[0]):
        return tuple(keys)
    width = kv_len + 1
    a_lo, a_hi = keys[0] * width + keys[1], keys[0] * width + keys[2]
    d_lo, d_hi = deny[0] * width + deny[1], deny[0] * width + deny[2]
    at, inverse = sorted_unique(np.concatenate([a_lo, a_hi, d_lo, d_hi]), return_inverse=True)
    na, nd = len(a_lo), len(d_lo)
    in_a = np.bincount(inverse, np.concatenate([np.ones(na), -np.ones(na), np.zeros(2 * nd)]),
                       minlength=len(at)).cumsum()
    in_d = np.bincount(inverse, np.concatenate([np.zeros(2 * na), np.ones(nd), -np.ones(nd)]),
                       minlength=len(at)).cumsum()
    shown = (in_a[:-1] > 0.5) & (in_d[:-1] < 0.5)       # the segment [at[i], at[i + 1])
    seg_lo, seg_hi = at[:-1][shown], at[1:][shown]
    row = seg_lo // width
    return union(row, seg_lo - row * width, seg_hi - row * width, kv_len)


def covered_by_all(row: np.ndarray, lo: np.ndarray, hi: np.ndarray, need: np.ndarray, width: int):
    """Flat intervals of the points covered ``need[row]`` times by ``[lo, hi)``: where each of a row's
    owners (its rows of keys, or pieces of them) gives disjoint ranges and ``need[row]`` counts the owners,
    the points every owner covers."""
    if not len(row):
        return row, lo, hi
    stride = width + 1
    at, inverse = sorted_unique(np.concatenate([row * stride + lo, row * stride + hi]), return_inverse=True)
    count = np.bincount(inverse, np.concatenate([np.ones(len(row)), -np.ones(len(row))]), minlength=len(at)).cumsum()
    seg_row = at[:-1] // stride
    full = (np.abs(count[:-1] - need[seg_row]) < 0.5).nonzero()[0]
    out_row = seg_row[full]
    return union(out_row, at[full] - out_row * stride, at[full + 1] - out_row * stride, width)


def region_keys(region: ir.RegionBounds, make, q: np.ndarray, kv_len: int, budget: int):
    """The flat intervals of one exact region at the rows ``q`` (unsorted; disjoint within a row)."""
    owner, lo, hi, _, _, _ = enumerate_keys(region, make, [q], kv_len, budget)
    keep = lo[0] < hi[0]
    return owner[keep], lo[0][keep], hi[0][keep]


def row_keys(allow, deny, make, q: np.ndarray, kv_len: int, budget: int):
    """Per row of ``q``: the keys of the exact ``allow`` regions minus those of the exact ``deny`` ones."""
    def joined(regions):
        parts = [region_keys(r, make, q, kv_len, budget) for r in regions]
        if not parts:
            empty = np.zeros(0, np.int64)
            return empty, empty, empty
        row, lo, hi = (np.concatenate(x) for x in zip(*parts))
        return union(row, lo, hi, kv_len)
    keys = joined(allow)
    return subtract(keys, joined(deny), kv_len) if deny else keys
