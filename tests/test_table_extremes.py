"""Table extremes: the least and greatest entry over any index range, against brute force, with blocks of one
entry and with the coarser blocks of large tables (forced here on small ones by a small cell budget)."""
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import maskc
from maskc.analysis import table_extremes
from maskc.analysis.table_extremes import table_bounds
from maskc.audit import audit_tiles
from maskc.bound_params import Table
from conftest import EXAMPLES


@st.composite
def table_and_ranges(draw):
    n = draw(st.integers(1, 300))
    values = np.array(draw(st.lists(st.integers(-5, 5), min_size=n, max_size=n)), np.int64)
    ends = np.array(draw(st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), min_size=1,
                                  max_size=40)), np.int64)
    return values, np.minimum(ends[:, 0], ends[:, 1]), np.maximum(ends[:, 0], ends[:, 1])


@settings(max_examples=300)
@given(table_and_ranges(), st.sampled_from([1 << 22, 256, 40, 8]))
def test_extremes_are_exact_for_every_block_size(case, cells):
    values, lo, hi = case
    old = table_extremes.EXTREME_CELLS
    table_extremes.EXTREME_CELLS = cells           # small budgets: blocks of 2 .. 64 entries
    try:
        least, greatest = table_bounds(Table(values), lo, hi)
    finally:
        table_extremes.EXTREME_CELLS = old
    expected = [(values[a:b + 1].min(), values[a:b + 1].max()) for a, b in zip(lo, hi)]
    assert [tuple(x) for x in zip(least.tolist(), greatest.tolist())] == expected


def test_extremes_broadcast_like_their_indices():
    values = np.arange(100, dtype=np.int64) % 7
    lo = np.array([[0], [10]])
    hi = np.array([[3, 50, 99]])
    least, greatest = table_bounds(Table(values), lo, hi)
    assert least.shape == greatest.shape == (2, 3)
    assert greatest[0, 0] == 3 and least[1, 1] == 0 and greatest[1, 1] == 6


def _random_tree(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    parent = [-1] + [int(rng.integers(-1, i)) for i in range(1, n)]
    anc = np.eye(n, dtype=np.int64)
    for i in range(n):
        j = parent[i]
        while j >= 0:
            anc[i, j], j = 1, parent[j]
    return anc


@pytest.mark.parametrize("tile", [(128, 128), (64, 64)])
def test_large_ancestor_tables_give_exact_tiles(tile):
    """An ancestor matrix of 2500 draft tokens (6.25 M entries: past one-entry blocks) read row by row: no tile
    classified PARTIAL that is really FULL or EMPTY (38 of 267 were, at 128 x 128, with blocks read whole)."""
    n = 2500
    bound = maskc.load(EXAMPLES / "tree_verify.mask").bind(seq_len=n, kv_len=2 * n + 7, anc=_random_tree(n, 2))
    audit = audit_tiles(bound, *tile)
    assert audit.unsound == 0 and audit.really_full == 0 and audit.really_empty == 0, audit
