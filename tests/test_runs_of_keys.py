"""maskc.analysis.tiles.runs_of_keys against brute force: owners (pieces of rows) whose slots' ends move by one key
per row at most, drawn directly (hypothesis), every row's keys marked on a dense grid of key blocks."""
import contextlib

import numpy as np
from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from maskc.analysis.intervals import NONE
from maskc.analysis import tiles
from maskc.analysis.tiles import runs_of_keys
from maskc.runs import EMPTY, FULL, PARTIAL, dense_of


_SLOPE = st.sampled_from([0, 0, 1, -1])


def _slots(draw, kv_len: int, span: int, count: int, width: int, gap: int) -> list:
    """Up to ``count`` slots (lo, hi, slope_lo, slope_hi) ascending, disjoint and not adjacent at rows 0 and
    ``span`` (so at every row between: the ends are affine), each non-empty and inside [0, kv_len] at both."""
    mine: list = []
    at = draw(st.integers(0, gap))
    for _ in range(count):
        lo, hi = at, at + draw(st.integers(1, width))
        s_lo, s_hi = draw(_SLOPE), draw(_SLOPE)
        ends = [(lo + s_lo * t, hi + s_hi * t) for t in (0, span)]
        if all(0 <= a < b <= kv_len for a, b in ends) and all(
                not mine or mine[-1][1] + mine[-1][3] * t < a for t, (a, _) in zip((0, span), ends)):
            mine.append((lo, hi, s_lo, s_hi))
        at = hi + draw(st.integers(1, gap))
    return mine


@st.composite
def owners(draw):
    """(q_block of each owner, its slots as (lo, hi, slope_lo, slope_hi), its rows - 1), q_blocks, slots, kv_len,
    block_n (:func:`_slots`; some owners have fewer slots than others, the rest empty, some none). Either each
    owner's slots drawn on their own, or every owner of a q_block taking some of the q_block's pool of slots, some
    of them joined with the gap between (so that one owner's slot j is another's slot j + 1 or holds several of
    another's: hulls that share key blocks, some FULL, runs out of order)."""
    pooled = draw(st.booleans())
    block_n = draw(st.sampled_from([1, 2, 3, 4, 8]))
    kv_len = draw(st.one_of(st.integers(1, 12), st.integers(24, 48)))
    qt = draw(st.integers(1, 4))
    slots = draw(st.integers(1, 4))
    out = []
    for q in range(qt):
        span = draw(st.integers(0, 4))
        width, gap = max(1, kv_len // 3), max(1, kv_len // 6)
        pool = _slots(draw, kv_len, span, slots, width, gap)
        for _ in range(draw(st.integers(1, 3))):
            if pooled:
                picked = sorted(draw(st.lists(st.sampled_from(range(len(pool))), unique=True)) if pool else [])
                mine = [pool[i] for i in picked]
                for at in reversed(range(1, len(mine))):         # some picked slots joined with the next one
                    if draw(st.booleans()):
                        mine[at - 1:at + 1] = [mine[at - 1][:1] + mine[at][1:2] + mine[at - 1][2:3] + mine[at][3:]]
                out.append((q, mine, span))
            else:
                own_span = draw(st.integers(0, 4))
                out.append((q, _slots(draw, kv_len, own_span, draw(st.integers(0, slots)), width, gap), own_span))
    return out, qt, slots, kv_len, block_n


def brute_force(drawn, qt: int, kv_len: int, block_n: int) -> np.ndarray:
    """int8[qt, kt]: PARTIAL where some row of some owner of the q_block sees a key of the block, FULL where every
    row of every owner of it sees all of the block's keys (those below kv_len)."""
    kt = -(-kv_len // block_n)
    touched = np.zeros((qt, kt), bool)
    full = np.ones((qt, kt), bool)
    for q, mine, span in drawn:
        for t in range(span + 1):
            keys = np.zeros(kt * block_n, bool)
            keys[kv_len:] = True
            for lo, hi, s_lo, s_hi in mine:
                keys[lo + s_lo * t:hi + s_hi * t] = True
                touched[q, (lo + s_lo * t) // block_n:-(-(hi + s_hi * t) // block_n)] = True
            full[q] &= keys.reshape(kt, block_n).all(axis=1)
    return np.where(touched & full, FULL, np.where(touched, PARTIAL, EMPTY)).astype(np.int8)


@settings(max_examples=600, deadline=None)
@given(owners())
# one owner's slot 0 holds the other's three slots, a third owner sees nothing: runs out of order, none FULL
@example(([(0, [(0, 1, 0, 0), (2, 3, 0, 0), (4, 5, 0, 0)], 0), (0, [(0, 5, 0, 0)], 0), (0, [], 0)], 1, 3, 24, 1))
# keys [4, 6) are one owner's slot 1 and the other's slot 0: FULL, though no slot covers them for both
@example(([(0, [(0, 3, 0, 0), (4, 6, 0, 0)], 1), (0, [(4, 6, 0, 0)], 1)], 1, 2, 8, 2))
# the same keys, a third owner seeing only [0, 3): they are PARTIAL
@example(([(0, [(0, 3, 0, 0), (4, 6, 0, 0)], 1), (0, [(4, 6, 0, 0)], 1), (0, [(0, 3, 0, 0)], 1)], 1, 2, 8, 2))
def test_runs_of_keys_are_the_brute_force_classes(case):
    """Every q_block's runs give the brute-force classes: where slots' hulls chain apart (per-slot runs), share
    key blocks (shared blocks PARTIAL where some owner covers none of them, runs merged in order; else counted),
    or leave holes (counted)."""
    drawn, qt, slots, kv_len, block_n = case
    if not drawn:
        return
    block = np.array([q for q, _, _ in drawn], np.int64)
    columns = []
    for j in range(slots):
        rows = [mine[j] + (span,) if j < len(mine) else None for _, mine, span in drawn]
        lo = np.array([NONE if r is None else r[0] for r in rows], np.int64)
        hi = np.array([NONE if r is None else r[1] for r in rows], np.int64)
        lo_b = np.array([NONE if r is None else r[0] + r[2] * r[4] for r in rows], np.int64)
        hi_b = np.array([NONE if r is None else r[1] + r[3] * r[4] for r in rows], np.int64)
        columns.append((lo, hi, lo_b, hi_b))
    kt = -(-kv_len // block_n)
    want = brute_force(drawn, qt, kv_len, block_n)
    event(_shape_of(drawn, qt, kv_len, block_n, want))
    for few in (0, 1 << 20):          # counted q_blocks by numpy (_counted_runs) and by hand (_counted_by_hand)
        with _few_counted(few):
            offsets, runs = runs_of_keys(block, columns, np.bincount(block, minlength=qt), kv_len, block_n, qt)
        np.testing.assert_array_equal(dense_of(offsets, runs, kt), want)
        assert (runs[:, 0] < runs[:, 1]).all(), "an empty run"
        same = (runs[1:, 0] == runs[:-1, 1]) & (runs[1:, 2] == runs[:-1, 2])
        row_of = np.repeat(np.arange(qt), np.diff(offsets))
        assert not (same & (row_of[1:] == row_of[:-1])).any(), "adjacent runs of one kind"


@contextlib.contextmanager
def _few_counted(few: int):
    """tiles.FEW_COUNTED set to ``few`` (0: every counted q_block through numpy) for the block."""
    saved = tiles.FEW_COUNTED
    tiles.FEW_COUNTED = few
    try:
        yield
    finally:
        tiles.FEW_COUNTED = saved


def _shape_of(drawn, qt: int, kv_len: int, block_n: int, want: np.ndarray) -> str:
    """What the case exercises: q_blocks where two slots' hulls (key blocks any owner's slot j touches) share a
    block, and whether such a block is FULL (every owner covering it, some with one slot, some with another)."""
    hulls: dict = {}
    for q, mine, span in drawn:
        for j, (lo, hi, s_lo, s_hi) in enumerate(mine):
            a, b = min(lo, lo + s_lo * span) // block_n, -(-max(hi, hi + s_hi * span) // block_n)
            h = hulls.get((q, j), (a, b))
            hulls[q, j] = (min(a, h[0]), max(b, h[1]))
    shared, full = False, False
    for (q, j), (a, b) in hulls.items():
        for (q2, j2), (c, d) in hulls.items():
            if q == q2 and j < j2 and a < d and c < b:
                shared = True
                full |= bool((want[q, max(a, c):min(b, d)] == FULL).any())
    return "shared hulls, a shared block FULL" if full else "shared hulls" if shared else "hulls apart"


def test_hstu_targets_stay_on_the_per_slot_path(monkeypatch):
    """hstu's target rows see their user's history and themselves: in the q_block where the history ends, the two
    slots' hulls share its last key block, which the rows before the targets do not cover. runs_of_keys keeps that
    q_block on the per-slot path (no counted runs) and the classes are the brute-force ones."""
    import maskc
    from conftest import EXAMPLES, tile_truth

    def counted(*args):
        raise AssertionError("a q_block was counted")
    bound = maskc.load(EXAMPLES / "hstu.mask").bind(seq_len=1024, users=[300, 400, 324], targets=[37, 50, 21])
    monkeypatch.setattr(tiles, "_counted_runs", counted)
    monkeypatch.setattr(tiles, "_counted_by_hand", counted)
    for shape in ((64, 64), (128, 128), (64, 32)):
        np.testing.assert_array_equal(bound.tile_map(*shape).classes[0], tile_truth(bound.dense(), *shape))


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 70), st.integers(1, 9), st.sampled_from([1, 2, 4, 5, 8, 16]), st.data())
def test_touched_and_covered_blocks_are_the_rounded_hull_and_intersection(kv_len, owners, block_n, data):
    """tiles._touched_and_covered against each slot's ends rounded one by one in Python: touched [floor(min lo),
    ceil(max hi)), covered [ceil(max lo), floor(min hi)) with kt where the keys reach kv_len; (2**40, -1) both for
    a dead slot. Block sizes powers of two (a shift) and not (a division); intervals up to kv_len."""
    kt = -(-kv_len // block_n)
    slots = []
    for _ in range(data.draw(st.integers(1, 3))):
        cols = [[], [], [], []]
        for _ in range(owners):
            if data.draw(st.booleans()):
                lo, lo_b = data.draw(st.integers(0, kv_len - 1)), data.draw(st.integers(0, kv_len - 1))
                ends = (lo, data.draw(st.integers(lo + 1, kv_len)), lo_b, data.draw(st.integers(lo_b + 1, kv_len)))
            else:
                ends = (NONE,) * 4
            for col, v in zip(cols, ends):
                col.append(v)
        slots.append(tuple(np.array(c, np.int64) for c in cols))
    live, t0, t1, c0, c1 = tiles._touched_and_covered(slots, kv_len, block_n)
    for s, (lo, hi, lo_b, hi_b) in enumerate(slots):
        for o in range(owners):
            a, b, a2, b2 = int(lo[o]), int(hi[o]), int(lo_b[o]), int(hi_b[o])
            if a >= b:
                assert not live[s, o] and (t0[s, o], t1[s, o], c0[s, o], c1[s, o]) == (1 << 40, -1, 1 << 40, -1)
                continue
            inner = min(b, b2)
            want = (min(a, a2) // block_n, -(-max(b, b2) // block_n), -(-max(a, a2) // block_n),
                    kt if inner >= kv_len else inner // block_n)
            assert live[s, o] and (t0[s, o], t1[s, o], c0[s, o], c1[s, o]) == want
