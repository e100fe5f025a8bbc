"""Flat interval lists (maskc.analysis.keys) and the chunk families' pruning (maskc.analysis.piece_tiles): each
against the plain set of keys per row, on random intervals (hypothesis)."""
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from maskc.analysis.keys import covered_by_all, subtract, union
from maskc.analysis.piece_tiles import _drop_covered, _merged_in_q_blocks, _split_at_covered
from maskc.analysis.tiles import merge_runs
from maskc.runs import FULL, PARTIAL, all_true, any_true, sorted_unique

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


@st.composite
def _records(draw):
    """Records as _strided_runs has them before _touching_hulls: sorted by piece (some pieces with several, some
    with none), non-empty hulls ``[h0, h1)``, a count and stride each (few values, so that neighbours agree); and
    each piece's q_block (ascending with the piece)."""
    pieces = draw(st.integers(1, 8))
    block = np.array(sorted(draw(st.lists(st.integers(0, 3), min_size=pieces, max_size=pieces))), np.int64)
    rows = draw(st.lists(st.tuples(st.integers(0, pieces - 1), st.integers(0, 30), st.integers(1, 12),
                                   st.integers(1, 3), st.sampled_from([3, 7, 20])), max_size=14))
    rows.sort(key=lambda r: r[0])
    piece, h0, width, count, stride = (np.array(c, np.int64).reshape(-1) for c in (zip(*rows) if rows else [[]] * 5))
    return (piece, h0, h0 + width, count, stride), block


def _member_blocks(piece, h0, h1, count, stride, block, block_n: int) -> set:
    """(q_block, key block) of every block some member of some record touches (member j: ``[h0, h1) + j * stride``)."""
    return {(int(block[p]), b) for p, a, z, c, s in zip(piece, h0, h1, count, stride) for j in range(c)
            for b in range((a + j * s) // block_n, -(-(z + j * s) // block_n))}


@settings(max_examples=400, deadline=None)
@given(_records(), st.integers(1, 16))
def test_records_merged_in_q_blocks_touch_the_same_blocks(drawn, block_n):
    """The records merged across a q_block's pieces touch, q_block by q_block, exactly the key blocks the records
    did (members listed one by one); they stay sorted by piece, and a piece with several records keeps them."""
    (piece, h0, h1, count, stride), block = drawn
    out = _merged_in_q_blocks(piece, h0, h1, count, stride, block)
    assert _member_blocks(*out, block, block_n) == _member_blocks(piece, h0, h1, count, stride, block, block_n)
    assert np.all(out[0][1:] >= out[0][:-1]) and np.all(out[1] < out[2])
    several = [p for p in set(piece.tolist()) if (piece == p).sum() > 1]
    for p in several:
        for before, after in zip((piece, h0, h1, count, stride), out):
            np.testing.assert_array_equal(before[piece == p], after[out[0] == p])


def test_records_merged_in_q_blocks_chain_only_where_hulls_meet():
    """Three single-record pieces of one q_block: the first two hulls abut ([0, 5), [5, 9)) and merge, the third
    lies apart ([10, 12)) and stays; a fourth piece in the next q_block, abutting, stays too."""
    piece, h0, h1 = np.arange(4), np.array([0, 5, 10, 12]), np.array([5, 9, 12, 14])
    count, stride, block = np.full(4, 3), np.full(4, 20), np.array([0, 0, 0, 1])
    out = _merged_in_q_blocks(piece, h0, h1, count, stride, block)
    for got, want in zip(out, ([0, 2, 3], [0, 10, 12], [9, 12, 14], [3, 3, 3], [20, 20, 20])):
        np.testing.assert_array_equal(got, want)


@settings(max_examples=300)
@given(st.lists(st.lists(st.integers(-50, 200), max_size=40), min_size=1, max_size=5), st.booleans(), st.booleans())
def test_sorted_unique_is_np_unique_for_runs_and_any_values(parts, ascending, runs):
    """sorted_unique with and without ``runs`` (its sort kind only), and with ``return_inverse``: np.unique's
    values (and inverse), for a few ascending runs concatenated or the same values in no order."""
    values = np.concatenate([np.array(sorted(p) if ascending else p, np.int64) for p in parts])
    np.testing.assert_array_equal(sorted_unique(values, runs=runs), np.unique(values))
    got, inverse = sorted_unique(values, return_inverse=True)
    np.testing.assert_array_equal(got[inverse], values)
    np.testing.assert_array_equal(got, np.unique(values))


@settings(max_examples=300)
@given(st.lists(st.booleans(), max_size=12), st.sampled_from([(-1,), (2, -1), (-1, 1)]), st.booleans())
def test_truth_tests_by_count_are_numpy_s(values, shape, scalar):
    """any_true and all_true give ndarray.any() and .all() on arrays of any shape (empty ones included) and on
    numpy scalars."""
    x = np.array(values, bool)
    if scalar:
        x = np.bool_(bool(values) and values[0])
    elif len(values) % 2 == 0:
        x = x.reshape(shape)
    assert any_true(x) == bool(np.asarray(x).any()) and all_true(x) == bool(np.asarray(x).all())
