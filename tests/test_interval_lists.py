"""Flat interval lists (maskc.analysis.keys) and the chunk families' pruning (maskc.analysis.piece_tiles): each
against the plain set of keys per row, on random intervals (hypothesis)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskc.analysis.keys import covered_by_all, subtract, union
from maskc.analysis.piece_tiles import _drop_covered, _split_at_covered
from maskc.analysis.tiles import merge_runs
from maskc.runs import FULL, PARTIAL

KV = 40


def intervals(max_rows: int = 6, max_size: int = 30):
    """Flat (row, lo, hi) lists: any order, overlapping, nested, adjacent or empty intervals; or ones whose ends
    ascend (the path union takes without a running maximum)."""
    one = st.tuples(st.integers(0, max_rows - 1), st.integers(0, KV), st.integers(0, KV))
    return st.lists(one, max_size=max_size).map(
        lambda xs: tuple(np.array(c, np.int64).reshape(-1) for c in (zip(*xs) if xs else ([], [], []))))


def keys_of(row, lo, hi) -> set:
    return {(int(r), k) for r, a, b in zip(row, lo, hi) for k in range(a, b)}


def check_canonical(row, lo, hi):
    """Sorted by row then key, non-empty, disjoint and not adjacent within a row."""
    assert np.all(lo < hi)
    same = row[1:] == row[:-1]
    assert np.all((row[1:] > row[:-1]) | (same & (lo[1:] > hi[:-1])))


@settings(max_examples=300, deadline=None)
@given(intervals(), st.booleans())
def test_union_is_the_set_union(flat, ascending):
    row, lo, hi = flat
    if ascending:           # sorted by (row, lo) with ends that ascend too: nested intervals made apart
        order = np.lexsort((lo, row))
        row, lo, hi = row[order], lo[order], np.maximum(hi[order], lo[order])
        g_hi = row * (KV + 1) + hi
        hi = np.maximum.accumulate(g_hi) - row * (KV + 1) if len(g_hi) else hi
    out = union(row, lo, hi, KV)
    check_canonical(*out)
    assert keys_of(*out) == keys_of(row, lo, hi)


@settings(max_examples=200, deadline=None)
@given(intervals(), intervals())
def test_subtract_is_the_set_difference(a, b):
    keys, deny = union(*a, KV), union(*b, KV)
    out = subtract(keys, deny, KV)
    check_canonical(*out)
    assert keys_of(*out) == keys_of(*keys) - keys_of(*deny)


def split_at(flat, cuts):
    """The intervals of ``flat`` each cut in two at a key inside it (``cuts``, fractions): adjacent, disjoint."""
    row, lo, hi = flat
    at = lo + ((hi - lo) * np.resize(np.array(cuts or [0.0]), len(lo))).astype(np.int64)
    inner = (at > lo) & (at < hi)
    return (np.concatenate([row, row[inner]]), np.concatenate([np.where(inner, at, lo), lo[inner]]),
            np.concatenate([hi, at[inner]]))


@settings(max_examples=200, deadline=None)
@given(st.lists(intervals(max_rows=3, max_size=6), min_size=1, max_size=4),
       st.lists(st.floats(0, 1), max_size=6))
def test_covered_by_all_is_the_intersection_over_owners(owners, cuts):
    """Each owner's intervals disjoint (a union, its intervals cut in adjacent parts, out of order), every owner
    of one row: the keys all of them cover, as union returns them (one owner: its ranges merged)."""
    parts = [split_at(union(*o, KV), cuts) for o in owners]
    row, lo, hi = (np.concatenate(x) for x in zip(*parts))
    need = np.full(3, len(owners))
    out = covered_by_all(row, lo, hi, need, KV)
    check_canonical(*out)
    assert keys_of(*out) == set.intersection(*[keys_of(*p) for p in parts])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4), st.integers(0, KV - 1), st.integers(1, 12), st.integers(-3, 3),
                          st.integers(-3, 3), st.booleans()), max_size=25))
def test_drop_covered_keeps_every_piece_keys(drawn):
    """Families (piece, [la, ha) at the first row, [lb, hb) at the last; constant where both agree): after
    _drop_covered each piece sees the same keys at both rows, its constant families merged, none of the rest
    inside them, and every family still non-empty at both rows."""
    fams = []
    for piece, lo, width, dlo, dhi, constant in sorted(drawn):
        la, ha = lo, min(KV, lo + width)
        lb, hb = (la, ha) if constant else (max(0, la + dlo), min(KV, max(la + dlo + 1, ha + dhi)))
        if lb < hb:
            fams.append((piece, la, ha, lb, hb))
    cols = [np.array(c, np.int64) for c in zip(*fams)] if fams else [np.zeros(0, np.int64)] * 5
    out = _drop_covered(*cols, KV)
    for first, second in ((1, 2), (3, 4)):
        assert keys_of(out[0], out[first], out[second]) == keys_of(cols[0], cols[first], cols[second])
    piece, la, ha, lb, hb = out
    assert np.all(la < ha) and np.all(lb < hb)
    constant = (la == lb) & (ha == hb)
    c = union(piece[constant], la[constant], ha[constant], KV)
    assert len(c[0]) == np.count_nonzero(constant)                  # the constants merged already
    for p, a, b, x, y in zip(*(v[~constant] for v in out)):
        inside = (c[0] == p) & (c[1] <= min(a, x)) & (c[2] >= max(b, y))
        assert not inside.any()


@settings(max_examples=300, deadline=None)
@given(intervals(), intervals())
def test_touched_split_at_covered_is_the_runs_of_both(a, b):
    """Touched ranges cut at the covered ones inside them (any ranges of b, intersected with a's): FULL runs
    where covered, PARTIAL elsewhere, in row and key order, none empty, as merge_runs makes them from the
    covered ranges and the rest of the touched ones (subtract)."""
    touched = union(*a, KV)
    drawn = union(*b, KV)
    covered = subtract(drawn, subtract(drawn, touched, KV), KV)
    row, begin, end, kind = _split_at_covered(touched, covered, KV)
    assert np.all(begin < end)
    assert np.all((row[1:] > row[:-1]) | ((row[1:] == row[:-1]) & (begin[1:] >= end[:-1])))
    assert keys_of(row[kind == FULL], begin[kind == FULL], end[kind == FULL]) == keys_of(*covered)
    assert keys_of(row, begin, end) == keys_of(*touched)
    partial = subtract(touched, covered, KV)
    expected = merge_runs(*(np.concatenate([c, p]) for c, p in zip(
        covered + (np.full(len(covered[0]), FULL),), partial + (np.full(len(partial[0]), PARTIAL),))), 8)
    for got in (merge_runs(row, begin, end, kind, 8), merge_runs(row, begin, end, kind, 8, ordered=True)):
        for x, y in zip(got, expected):
            np.testing.assert_array_equal(x, y)
