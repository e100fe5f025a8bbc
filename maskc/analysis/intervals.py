"""Row intervals: each query row's visible keys as a few disjoint [lo, hi) slots, in numpy.

The exact core of classification: a region linear in k gives one interval per row; allow regions are
unioned and deny regions subtracted row by row. A list of slots is a list of (lo, hi) int64 arrays
over the same rows; an empty slot of a row has lo = hi = ``NONE``.
"""
from __future__ import annotations

import numpy as np

from maskc import ir
from maskc.analysis.rows import RowValues, k_bound_rows

NONE = np.iinfo(np.int64).max // 4      # the endpoints of an empty interval, sorted last


def region_ends(region: ir.RegionBounds, rows: RowValues, kv_len: int):
    """The region's interval ends at the rows, unclipped by its guards: ``lo = max(0, lower bounds)``,
    ``hi = min(kv_len, upper bounds + 1)``, and whether the guards hold (static guards included)."""
    n = rows.q.shape[0]
    lo = np.zeros(n, np.int64)
    hi = np.full(n, kv_len, np.int64)
    for b in region.lower:
        lo = np.maximum(lo, k_bound_rows(b, rows, lower=True))
    for b in region.upper:
        hi = np.minimum(hi, k_bound_rows(b, rows, lower=False) + 1)
    ok = np.ones(n, bool)
    for g in region.static_guards + region.guards:
        ok = ok & (rows.lin(g.lin) <= 0)
    return lo, hi, ok


def region_rows(region: ir.RegionBounds, rows: RowValues, kv_len: int):
    """The row-wise interval [lo, hi) of a region's linear part (lo = hi = NONE where empty)."""
    n = rows.q.shape[0]
    if any(rows.lin(g.lin) > 0 for g in region.static_guards):
        return np.full(n, NONE), np.full(n, NONE)
    return masked(*region_ends(region, rows, kv_len))


def masked(lo: np.ndarray, hi: np.ndarray, ok: np.ndarray):
    """An interval per row, ``lo = hi = NONE`` where ``ok`` is false or it is empty."""
    ok = ok & (lo < hi)
    return np.where(ok, lo, NONE), np.where(ok, hi, NONE)


def union(intervals: list[tuple[np.ndarray, np.ndarray]]):
    """Per row, the union of intervals as ascending, disjoint, non-adjacent slots; a row's empty
    slots may sit between its others (``compact`` moves them to the end)."""
    return _merged([i for i in intervals if (i[0] < i[1]).any()])     # regions no row sees drop out


def _merged(intervals: list[tuple[np.ndarray, np.ndarray]]):
    """:func:`union` of intervals each seen by some row."""
    if len(intervals) <= 1:
        return intervals
    lo = np.array([i[0] for i in intervals])
    hi = np.array([i[1] for i in intervals])
    order = lo.argsort(axis=0, kind="stable")
    column = np.arange(lo.shape[1])
    lo, hi = lo[order, column], hi[order, column]
    out = []
    cur_lo, cur_hi = lo[0], hi[0]
    for j in range(1, len(intervals)):
        new = lo[j] > cur_hi                       # touching intervals merge: [a, b) + [b, c)
        out.append((np.where(new, cur_lo, NONE), np.where(new, cur_hi, NONE)))
        cur_lo = np.where(new, lo[j], cur_lo)
        cur_hi = np.where(new, hi[j], np.maximum(cur_hi, hi[j]))
    out.append((cur_lo, cur_hi))
    return out


def union_compacted(intervals: list[tuple[np.ndarray, np.ndarray]]):
    """``compact(union(intervals))``, for intervals each ``lo < hi`` or ``lo = hi = NONE`` per row (as
    :func:`masked` gives them): intervals no row sees together share a lane (:func:`_lanes`); where two lanes are
    left, in closed form (:func:`_union_of_two`)."""
    rows = [lo < hi for lo, hi in intervals]
    kept = [i for i, r in enumerate(rows) if r.any()]
    lanes = [intervals[i] for i in kept]
    if len(lanes) > 2:
        lanes = _lanes(lanes, [rows[i] for i in kept])
    return _union_of_lanes(lanes)


def union_compacted_stacked(ends: np.ndarray):
    """:func:`union_compacted` of the intervals ``(ends[0, i], ends[1, i])`` (``ends`` int64[2, intervals, rows], each
    ``lo < hi`` or ``lo = hi = NONE`` per row), in fewer numpy calls: which rows see each interval by one comparison,
    those seen at all by one ``any``, and every lane's interval (:func:`_lane_members`) by one min over its members
    (padded to one width with its first): at each row one member at most is seen, and the others are NONE there,
    above every key, so the min is the seen one's, or NONE: what :func:`_lanes`' ``where``s give."""
    seen = ends[0] < ends[1]                                  # [intervals, rows]
    kept = seen.any(axis=1).nonzero()[0]
    if len(kept) < len(seen):
        ends, seen = ends.take(kept, axis=1), seen.take(kept, axis=0)
    lanes = _lane_members(seen) if len(kept) > 2 else None
    if lanes is not None:
        width = max(len(lane) for lane in lanes)
        members = np.array([lane + lane[:1] * (width - len(lane)) for lane in lanes])     # [lanes, width]
        ends = np.minimum.reduce(ends.take(members, axis=1), axis=2)
    return _union_of_lanes(list(zip(ends[0], ends[1])))


def _union_of_lanes(lanes: list):
    """:func:`union_compacted` of intervals (each ``lo < hi`` or NONE, each seen by some row) left after their lanes
    were merged."""
    if len(lanes) == 2:
        return _union_of_two(*lanes)
    if len(lanes) == 3:
        return _union_of_three(*lanes)
    return compact(_merged(lanes))


def _lanes(intervals: list, rows: list) -> list:
    """The intervals (each seen on ``rows``, bool over the rows) with those that no row sees together merged into
    one per row: the union of a row's intervals is what :func:`union_compacted` returns (sorted, merged, its empty
    slots last), so it does not change, and fewer intervals go through the merge loop and the sorts (hstu_ctx32's
    five, seen three a row: three)."""
    seen = np.array(rows)
    lanes = _lane_members(seen)
    if lanes is None:
        return intervals
    out = []
    for lane in lanes:
        lo, hi = intervals[lane[0]]
        for i in lane[1:]:
            lo, hi = np.where(seen[i], intervals[i][0], lo), np.where(seen[i], intervals[i][1], hi)
        out.append((lo, hi))
    return out


def _lane_members(seen: np.ndarray) -> list[list[int]] | None:
    """The intervals seen on the rows of ``seen`` (bool[intervals, rows]) in lanes, each of intervals no row sees
    together, as lists of their indices (ascending, the lanes by their first); None where that leaves each alone.
    Greedy, in the intervals' order: each joins the first lane none of whose members it meets (a bool matmul says
    which pairs meet)."""
    meets = (seen @ seen.T).tolist()                     # [intervals][intervals]: seen on a row together
    lanes: list[list[int]] = []
    for i, row in enumerate(meets):
        for lane in lanes:
            if not any(row[m] for m in lane):
                lane.append(i)
                break
        else:
            lanes.append([i])
    return None if len(lanes) == len(meets) else lanes


def _union_of_two(first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]):
    """What :func:`union_compacted` returns for two intervals per row, each ``lo < hi`` or empty (``NONE``), without
    a sort: ``a``, the one starting first (the first on a tie, as a stable sort keeps it), and ``b``; where ``b``
    starts past ``a``'s end (empty ``b`` included: NONE is past every key) the row's slots are ``a`` then ``b``, else
    the one slot ``[a_lo, max(a_hi, b_hi))`` and an empty one (both empty: NONE throughout). The second slot is
    dropped where no row has one."""
    (l1, h1), (l2, h2) = first, second
    swap = l2 < l1
    a_lo, b_lo = np.minimum(l1, l2), np.maximum(l1, l2)
    a_hi, b_hi = np.where(swap, h2, h1), np.where(swap, h1, h2)
    apart = b_lo > a_hi
    out = [(a_lo, np.where(apart, a_hi, np.maximum(a_hi, b_hi)))]
    if apart.any():
        lo, hi = np.where(apart, b_lo, NONE), np.where(apart, b_hi, NONE)
        if (lo < hi).any():
            out.append((lo, hi))
    return out


def _union_of_three(first, second, third):
    """What :func:`union_compacted` returns for three intervals per row, each ``lo < hi`` or empty (``NONE``),
    without a sort: ``a, b, c`` the three by start (three compare-exchanges, ties kept in order, as a stable sort
    keeps them), the reach ``m2 = max(a_hi, b_hi)`` and ``m3 = max(m2, c_hi)``, and where each starts a slot (past
    the reach before it: NONE is past every key). The slots, empty ones last: ``a`` alone, or with ``b``, or with
    both; then ``b`` (alone or with ``c``) or ``c``; then ``c``. A slot no row has is dropped."""
    (a_lo, a_hi), (b_lo, b_hi), (c_lo, c_hi) = first, second, third
    a_lo, a_hi, b_lo, b_hi = _in_order(a_lo, a_hi, b_lo, b_hi)
    b_lo, b_hi, c_lo, c_hi = _in_order(b_lo, b_hi, c_lo, c_hi)
    a_lo, a_hi, b_lo, b_hi = _in_order(a_lo, a_hi, b_lo, b_hi)
    m2 = np.maximum(a_hi, b_hi)
    m3 = np.maximum(m2, c_hi)
    new_b, new_c = b_lo > a_hi, c_lo > m2
    out = [(a_lo, np.where(new_b, a_hi, np.where(new_c, m2, m3)))]
    lo = np.where(new_b, b_lo, np.where(new_c, c_lo, NONE))
    hi = np.where(new_b, np.where(new_c, m2, m3), np.where(new_c, m3, NONE))
    if (lo < hi).any():
        out.append((lo, hi))
        both = new_b & new_c                              # (c may be empty there: NONE either way)
        lo, hi = np.where(both, c_lo, NONE), np.where(both, c_hi, NONE)
        if (lo < hi).any():
            out.append((lo, hi))
    return out


def _in_order(x_lo, x_hi, y_lo, y_hi):
    """Two intervals per row, the one with the lower start first (the first on a tie)."""
    swap = y_lo < x_lo
    return (np.minimum(x_lo, y_lo), np.where(swap, y_hi, x_hi), np.maximum(x_lo, y_lo), np.where(swap, x_hi, y_hi))


def compact(slots):
    """Ascending slots with empties in between → the same slots with each row's non-empty ones first;
    columns empty in every row dropped. Empties have lo = NONE, above every key, so a stable sort of each
    row's slots by lo moves them to the end and keeps the others in order."""
    slots = [s for s in slots if (s[0] < s[1]).any()]
    if len(slots) <= 1:
        return slots
    lo, hi = np.array([s[0] for s in slots]), np.array([s[1] for s in slots])
    order = lo.argsort(axis=0, kind="stable")
    column = np.arange(lo.shape[1])
    lo, hi = lo[order, column], hi[order, column]
    return [(lo[j], hi[j]) for j in range(len(slots)) if (lo[j] < hi[j]).any()]


def subtract(slots, deny):
    """Per row, slots minus one interval: each slot leaves a left and a right piece."""
    dlo, dhi = deny
    out = []
    for lo, hi in slots:
        left_hi = np.minimum(hi, dlo)
        right_lo = np.maximum(lo, dhi)
        out.append((np.where(lo < left_hi, lo, NONE), np.where(lo < left_hi, left_hi, NONE)))
        out.append((np.where(right_lo < hi, right_lo, NONE), np.where(right_lo < hi, hi, NONE)))
    return out


def visible_slots(allow, deny, rows: RowValues, kv_len: int):
    """Per row, the keys of exact allow regions minus exact deny regions, as disjoint slots.
    At most len(allow) + len(deny) slots: subtracting m disjoint intervals splits n into n + m."""
    return combine([region_rows(r, rows, kv_len) for r in allow], [region_rows(r, rows, kv_len) for r in deny])


def combine(allow: list, deny: list):
    """Per row, the union of the ``allow`` intervals minus those of ``deny`` (each a (lo, hi) pair of
    arrays over the same rows, NONE where empty), as disjoint, non-adjacent slots."""
    return _less_denied(union_compacted(allow), deny)


def combine_stacked(ends: np.ndarray, allow: int):
    """:func:`combine` of the intervals ``(ends[0, i], ends[1, i])`` (int64[2, intervals, rows], each ``lo < hi`` or
    ``lo = hi = NONE`` per row, as :func:`masked` gives them), the first ``allow`` allowed, the others denied."""
    return _less_denied(union_compacted_stacked(ends[:, :allow]), list(zip(ends[0, allow:], ends[1, allow:])))


def _less_denied(slots, deny: list):
    """``slots`` (a union's, compacted) less the ``deny`` intervals, row by row."""
    if deny:
        for interval in union_compacted(deny):
            slots = compact(subtract(slots, interval))
    return slots
