"""Range analysis (maskc/analysis/ranges.py), region by region, against brute force: each normal-form region and its
RegionBounds (guards, lower and upper k bounds, opaque atoms) hold for exactly the same (q, k) pairs, an exact
region's rows see one interval of keys, and atoms are sorted into bounds, guards and opaque atoms by how they
use k. (tests/test_normalize.py holds the whole mask, the union of the regions, against dense().)"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import maskc
from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis.intervals import (NONE, combine, combine_stacked, compact, union, union_compacted,
                                      union_compacted_stacked, visible_slots)
from maskc.analysis.ranges import analyze_ranges
from maskc.analysis.rows import RowValues, k_bound_rows

from mask_strategies import binding, mask_text


def _rows(bound) -> RowValues:
    q = np.arange(bound.seq_len, dtype=np.int64)[:, None]
    k = np.arange(bound.kv_len, dtype=np.int64)[None, :]
    return RowValues(bound.params.batch[0], bound.seq_len, bound.kv_len, 0, 0, q, k)


def _holds(rows: RowValues, atoms, shape) -> np.ndarray:
    out = np.ones(shape, bool)
    for a in atoms:
        out &= np.broadcast_to(rows.lin(a.lin) <= 0, shape)
    return out


def region_dense(region: ir.Region, bound) -> np.ndarray:
    """The pairs where every atom of a normal-form region holds."""
    return _holds(_rows(bound), region.atoms, (bound.seq_len, bound.kv_len))


def bounds_dense(r: ir.RegionBounds, bound) -> np.ndarray:
    """The pairs RegionBounds describe: guards, max(lower) <= k <= min(upper), opaque atoms."""
    rows, shape = _rows(bound), (bound.seq_len, bound.kv_len)
    out = _holds(rows, r.static_guards + r.guards + r.opaque, shape)
    k = np.arange(bound.kv_len, dtype=np.int64)[None, :]
    for b in r.lower:
        out &= np.broadcast_to(k >= k_bound_rows(b, rows, True), shape)
    for b in r.upper:
        out &= np.broadcast_to(k <= k_bound_rows(b, rows, False), shape)
    return out


def _pairs(compiled):
    return list(zip(compiled.normal.allow + compiled.normal.deny, compiled.ranges.allow + compiled.ranges.deny))


@given(text=mask_text(exact=False), b=binding())
def test_each_region_is_its_bounds(text, b):
    seq_len, kv_len, params = b
    c = maskc.compile_mask(text)
    bound = c.bind(seq_len, kv_len, **params)
    assert len(c.ranges.allow) == len(c.normal.allow) and len(c.ranges.deny) == len(c.normal.deny)
    for region, bounds in _pairs(c):
        assert np.array_equal(region_dense(region, bound), bounds_dense(bounds, bound)), F.render(region.atoms[0].lin)


@given(text=mask_text(exact=True), b=binding())
def test_exact_regions_see_one_interval_per_row(text, b):
    seq_len, kv_len, params = b
    c = maskc.compile_mask(text)
    bound = c.bind(seq_len, kv_len, **params)
    for region, bounds in _pairs(c):
        assert bounds.exact and not bounds.opaque
        dense = region_dense(region, bound)
        for row in dense:
            keys = np.flatnonzero(row)
            assert keys.size == 0 or keys[-1] - keys[0] + 1 == keys.size, keys


def _slots_dense(slots, shape) -> np.ndarray:
    """The keys each row's [lo, hi) slots cover."""
    k = np.arange(shape[1], dtype=np.int64)[None, :]
    out = np.zeros(shape, bool)
    for lo, hi in slots:
        out |= (k >= lo[:, None]) & (k < hi[:, None])
    return out


@given(text=mask_text(exact=True), b=binding())
def test_row_intervals_of_the_ranges_are_the_mask(text, b):
    """What classification builds on: the analysis's regions as per-row intervals (maskc.analysis.intervals),
    allow regions united and deny regions taken out row by row, see exactly the keys bound.dense() sees;
    each row's slots ascending and apart, its empty ones last, no more than the regions' count."""
    seq_len, kv_len, params = b
    c = maskc.compile_mask(text)
    bound = c.bind(seq_len, kv_len, **params)
    rows = RowValues(bound.params.batch[0], seq_len, kv_len, 0, 0, np.arange(seq_len, dtype=np.int64))
    slots = visible_slots(c.ranges.allow, c.ranges.deny, rows, kv_len)
    assert np.array_equal(_slots_dense(slots, (seq_len, kv_len)), bound.dense())
    assert len(slots) <= len(c.ranges.allow) + len(c.ranges.deny)
    for (lo_a, hi_a), (lo_b, hi_b) in zip(slots, slots[1:]):
        assert np.all((lo_a >= hi_a) <= (lo_b >= hi_b)), "an empty slot before a non-empty one"
        seen = (lo_a < hi_a) & (lo_b < hi_b)
        assert np.all(hi_a[seen] < lo_b[seen]), "slots of a row overlap, touch or are out of order"


@st.composite
def _row_intervals(draw):
    """One to five intervals over the same rows, each row's ``lo < hi`` or empty (``NONE``), as masked() gives them:
    apart, touching, overlapping, nested, equal starts; a region seen by no row now and then; some seen on disjoint
    rows."""
    rows = draw(st.integers(1, 8))
    count = draw(st.integers(1, 5))
    # now and then each row seen by a few of them only (intervals never seen together share a lane)
    part = np.array(draw(st.lists(st.integers(0, 2), min_size=rows, max_size=rows))) if draw(st.booleans()) else None
    out = []
    for n in range(count):
        lo = np.array(draw(st.lists(st.integers(0, 12), min_size=rows, max_size=rows)), np.int64)
        width = np.array(draw(st.lists(st.integers(-2, 6), min_size=rows, max_size=rows)), np.int64)
        seen = (width > 0) & (True if part is None else (part == n % 3) | (n == 0))
        out.append((np.where(seen, lo, NONE), np.where(seen, lo + width, NONE)))
    return out


@settings(max_examples=300)
@given(_row_intervals())
@example([(np.array([0]), np.array([6])), (np.array([1]), np.array([2])), (np.array([3]), np.array([4]))])  # nested
def test_union_compacted_is_the_rows_keys_and_the_general_path(intervals):
    """union_compacted (two or three seen intervals, or lanes of intervals never seen together, in closed form) is
    compact(union(...)) array for array, and so is union_compacted_stacked (the intervals as one array, a lane's by
    one min); its slots are each row's keys as ascending, apart intervals, the empty ones last."""
    found = union_compacted(intervals)
    general = compact(union(intervals))
    stacked = union_compacted_stacked(np.array([[lo for lo, _ in intervals], [hi for _, hi in intervals]]))
    assert len(found) == len(general) == len(stacked)
    for (lo, hi), (g_lo, g_hi), (s_lo, s_hi) in zip(found, general, stacked):
        np.testing.assert_array_equal(lo, g_lo)
        np.testing.assert_array_equal(hi, g_hi)
        np.testing.assert_array_equal(s_lo, g_lo)
        np.testing.assert_array_equal(s_hi, g_hi)
    for row in range(len(intervals[0][0])):
        keys = {k for lo, hi in intervals for k in range(lo[row], hi[row]) if hi[row] != NONE}
        slots = [(lo[row], hi[row]) for lo, hi in found if lo[row] < hi[row]]
        assert {k for a, b in slots for k in range(a, b)} == keys
        assert all(b < c for (_, b), (c, _) in zip(slots, slots[1:])), "slots overlap, touch or are out of order"
        assert all(lo[row] == hi[row] == NONE for lo, hi in found[len(slots):]), "an empty slot before a seen one"


@settings(max_examples=200)
@given(_row_intervals(), st.integers(1, 5))
def test_combine_stacked_is_combine(intervals, allow):
    """combine_stacked of the intervals as one array, the first ``allow`` allowed and the others denied, is combine
    of the two lists, array for array."""
    allow = min(allow, len(intervals))
    found = combine_stacked(np.array([[lo for lo, _ in intervals], [hi for _, hi in intervals]]), allow)
    expected = combine(intervals[:allow], intervals[allow:])
    assert len(found) == len(expected)
    for (lo, hi), (e_lo, e_hi) in zip(found, expected):
        np.testing.assert_array_equal(lo, e_lo)
        np.testing.assert_array_equal(hi, e_hi)


@pytest.mark.parametrize("coef", [-3, -2, -1, 1, 2, 3])
@pytest.mark.parametrize("offset", [-4, 0, 5])
def test_a_coefficient_of_k_becomes_a_rounded_bound(coef, offset):
    """``coef * k <= q + offset``: an upper bound floor((q + offset) / coef) for coef > 0, a lower bound
    ceil(...) for coef < 0, the same pairs as the atom."""
    c = maskc.compile_mask(f"mask m()\n  allow {coef} * k <= q + {offset}\n")
    (r,) = c.ranges.allow
    assert (len(r.upper), len(r.lower)) == ((1, 0) if coef > 0 else (0, 1))
    assert (r.upper or r.lower)[0].den == abs(coef) and r.exact
    bound = c.bind(23, 31)
    q, k = np.arange(23)[:, None], np.arange(31)[None, :]
    assert np.array_equal(bounds_dense(r, bound), coef * k <= q + offset)


@pytest.mark.parametrize("text,where", [
    ("allow k <= q, q < a", "guards"),           # free of k, reads q: checked per row
    ("allow k <= q, a < 7", "static_guards"),    # parameters only: whether the region exists
    ("allow k <= q, h < 2", "guards"),           # reads the head: per row, and the mask uses h
    ("allow k <= q, b < 1", "guards"),           # reads the batch element
])
def test_atoms_free_of_k_are_guards(text, where):
    r = maskc.compile_mask(f"mask m(a: int)\n  {text}\n").ranges
    (region,) = r.allow
    other = "static_guards" if where == "guards" else "guards"
    assert len(getattr(region, where)) == 1 and not getattr(region, other)
    assert r.uses_head == ("h <" in text)


@pytest.mark.parametrize("atom", ["(q - k) ** 2 < 9", "k * a <= q", "k % 4 == 0"])
def test_k_inside_another_term_is_opaque(atom):
    """Opaque to the linear analysis; exact through chunked keys (maskc/analysis/chunks.py) where k enters through
    % by a known divisor or a square, not where a parameter multiplies it. (One floor of k alone,
    ``k // 2 <= q``, is a bound: tests/test_chunks.py.)"""
    c = maskc.compile_mask(f"mask m(a: int)\n  allow k <= q, {atom}\n")
    (region,) = c.ranges.allow
    assert region.opaque and not c.ranges.linear
    assert (region.chunks is not None) == region.exact == c.exact == (atom != "k * a <= q")
    assert all(F.split_k(a.lin) is None for a in region.opaque)
    bound = c.bind(20, a=3)
    assert np.array_equal(bounds_dense(region, bound), region_dense(c.normal.allow[0], bound))


@given(st.sampled_from(["mask m()\n  allow k <= q\n", "mask m(w: int)\n  allow k <= q, q - k < w\n  deny k == 0\n"]))
def test_analyze_ranges_is_pure(text):
    c = maskc.compile_mask(text)
    assert analyze_ranges(c.normal) == analyze_ranges(c.normal) == c.ranges
