"""Masks that read k through // and % by divisors known at bind (images, frames, chunks) and through
discs: their keys per row are one interval per chunk, and their tile classes exact, against brute force."""
import numpy as np
import pytest
from hypothesis import assume, event, example, given, settings, strategies as st

import maskc
import maskc.analysis.classify as classify_module
import maskc.analysis.piece_tiles as piece_tiles
from maskc import ir
from maskc.analysis.descriptor import unpack
from maskc.analysis.formprog import Env, FormProgram
from maskc.analysis.keys import region_keys, union, values_at
from maskc.analysis.rows import RowValues, k_bound_rows
from conftest import EXAMPLES, tile_truth
from mask_strategies import binding, chunk_atom, chunk_binding, chunk_mask_text, mask_text, q_guard, tile_shape


def _compiled_and_bound(text, bind_args):
    """(mask, bound mask); draws that do not compile or bind are rejected."""
    try:
        mask = maskc.compile_mask(text)
        seq_len, kv_len, params = bind_args
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
    except maskc.MaskError as err:
        event(f"rejected: {type(err).__name__}")
        assume(False)
    event(f"exact: {mask.exact}, linear: {mask.ranges.linear}")
    return mask, bound


def _region_dense(region: ir.RegionBounds, bound) -> np.ndarray:
    """The region's pairs by brute force: guards, bounds and opaque atoms at every (q, k)."""
    s, kv = bound.seq_len, bound.kv_len
    rows = RowValues(bound.params.batch[0], s, kv, 0, 0, np.arange(s)[:, None], np.arange(kv)[None, :])
    out = np.ones((s, kv), bool)
    for atom in region.static_guards + region.guards + region.opaque:
        out &= np.broadcast_to(rows.lin(atom.lin) <= 0, out.shape)
    k = np.arange(kv)[None, :]
    for b in region.lower:
        out &= np.broadcast_to(k >= k_bound_rows(b, rows, True), out.shape)
    for b in region.upper:
        out &= np.broadcast_to(k <= k_bound_rows(b, rows, False), out.shape)
    return out


def _region_keys_dense(region: ir.RegionBounds, bound) -> np.ndarray:
    """The region's pairs from its chunks' intervals; asserts a row's intervals are disjoint."""
    s, kv = bound.seq_len, bound.kv_len
    params = bound.params.batch[0]
    row, lo, hi = region_keys(region, values_at(params, s, kv, 0, 0), np.arange(s, dtype=np.int64), kv, 1 << 20)
    count = np.zeros((s, kv + 1), np.int64)
    np.add.at(count, (row, lo), 1)
    np.add.at(count, (row, hi), -1)
    painted = np.cumsum(count, axis=1)[:, :kv]
    assert painted.max(initial=0) <= 1, "a row's chunk intervals overlap"
    return painted == 1


def _check_classes(bound, bm, bn, exact):
    truth = tile_truth(bound.dense(), bm, bn)
    tile_map = bound.tile_map(bm, bn)
    got = tile_map.classes[0]
    assert not np.any((got == maskc.FULL) & (truth != maskc.FULL)), "a FULL tile has a hidden pair"
    assert not np.any((got == maskc.EMPTY) & (truth != maskc.EMPTY)), "an EMPTY tile has a visible pair"
    if exact:
        np.testing.assert_array_equal(got, truth)
        assert tile_map.exact
    np.testing.assert_array_equal(unpack(bound.descriptor(bm, bn))[0], got)


@given(chunk_mask_text(consistent=True), chunk_binding())
def test_chunks_denote_their_regions(text, bind_args):
    """Every chunked region, generic and specialized to the bound values, enumerates exactly its pairs."""
    mask, bound = _compiled_and_bound(text, bind_args)
    generic = mask.ranges
    special = mask.specialized(bound.params.batch[0].ints)
    for ranges in (generic, special):
        for region in ranges.allow + ranges.deny:
            event(f"chunked: {region.chunks is not None}, levels: {len(region.chunks.levels) if region.chunks else 0}")
            if region.chunks is not None:
                np.testing.assert_array_equal(_region_keys_dense(region, bound), _region_dense(region, bound))


@given(chunk_mask_text(consistent=True), chunk_binding(), tile_shape)
def test_image_masks_are_exact(text, bind_args, shape):
    """Masks over one image's coordinates (columns, rows, frames, discs) are exact, and tell so."""
    mask, bound = _compiled_and_bound(text, bind_args)
    _check_classes(bound, *shape, exact=mask.exact)
    assert bound.visible_pairs() == int(bound.dense().sum())


@given(chunk_mask_text(consistent=False), chunk_binding(), tile_shape)
def test_masks_with_random_divisors_are_sound_and_exact_when_they_say_so(text, bind_args, shape):
    mask, bound = _compiled_and_bound(text, bind_args)
    _check_classes(bound, *shape, exact=mask.exact)
    special = mask.specialized(bound.params.batch[0].ints)
    event(f"exact once bound: {special.exact}")
    if special.exact:     # specialized to the values, divisors are numbers: more masks are exact
        _check_classes(bound, *shape, exact=True)


@settings(max_examples=30)
@given(chunk_mask_text(consistent=True), chunk_binding(), tile_shape)
def test_rows_and_pieces_agree(text, bind_args, shape):
    """Classes from q-pieces equal those counted row by row (the pieces' conditions forced off)."""
    mask, bound = _compiled_and_bound(text, bind_args)
    assume(mask.exact and not mask.ranges.linear)
    got = bound.tiles(*shape)
    saved = classify_module._piece_breaks       # kept on the mask after the first bind: patched, not slopes_ok
    classify_module._piece_breaks = lambda mask: None
    try:
        rows_only = mask.bind(seq_len=bind_args[0], kv_len=bind_args[1], **bind_args[2]).tiles(*shape)
    finally:
        classify_module._piece_breaks = saved
    np.testing.assert_array_equal(got, rows_only)


@settings(max_examples=30)
@given(chunk_mask_text(consistent=True), chunk_binding(), chunk_binding(), tile_shape)
def test_what_a_mask_keeps_between_binds_fits_every_bind(text, first, second, shape):
    """One compiled mask bound again and again (new lengths and values, then the first ones again): the piece
    breaks and plans kept on its specializations after the first bind give exact classes every time."""
    mask, _ = _compiled_and_bound(text, first)
    for seq_len, kv_len, params in (first, second, (second[0], second[1], first[2] | {"docs": second[2]["docs"]}),
                                    first):
        try:
            bound = mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
        except maskc.MaskError:
            continue
        _check_classes(bound, *shape, exact=mask.exact)


@settings(max_examples=20)
@given(chunk_mask_text(consistent=True), chunk_binding(), tile_shape)
def test_past_the_budget_classes_are_sound_and_not_exact(text, bind_args, shape):
    mask, bound = _compiled_and_bound(text, bind_args)
    assume(mask.exact and not mask.ranges.linear)
    saved = classify_module._BUDGET
    classify_module._BUDGET = 0
    try:
        tile_map = bound.tile_map(*shape)
        _check_classes(bound, *shape, exact=False)
        event(f"fell back: {not tile_map.exact}")
    finally:
        classify_module._BUDGET = saved


@pytest.mark.parametrize("text, levels", [
    ("mask m(w: const int)\n  allow k // w == q // w, k % w <= q % w\n", 2),
    ("mask m(w: const int, ht: int)\n  allow k // (w * ht) == q // (w * ht), (k // w) % ht <= (q // w) % ht\n", 3),
    ("mask m()\n  allow (k % 8 - q % 8) ** 2 + (k // 8 - q // 8) ** 2 <= 5\n", 2),
    ("mask m()\n  allow (q - k) ** 2 < 10\n", 1),
])
def test_nest_depth(text, levels):
    (region,) = maskc.compile_mask(text).ranges.allow
    assert region.chunks is not None and len(region.chunks.levels) == levels


@pytest.mark.parametrize("text", [
    "mask m(c: int)\n  allow k // c <= q // c\n",               # chunked causal: a bound on k
    "mask m(c: int)\n  allow k // c == q // c\n",               # block-diagonal
    "mask m()\n  allow (q - k) // 16 == 0\n",                   # a window, written with //
    "mask m()\n  allow 2 * (k // 3) >= q - 10\n",
])
def test_one_floor_of_k_is_a_bound(text):
    """Where k appears through one floor only, the atom is a bound: the region stays linear (the kernel's
    predicate is an interval test) and exact."""
    mask = maskc.compile_mask(text)
    assert mask.ranges.linear and mask.exact
    bound = mask.bind(seq_len=100, **({"c": 7} if "c:" in text else {}))
    _check_classes(bound, 16, 16, exact=True)


def test_a_floor_whose_k_cancels_leaves_the_nest():
    """(-q - 2*k) % 2 is q % 2: once its floor is canonical it reads no k, and goes up as a guard (it used to
    reach the solver for k and fail there with an IndexError)."""
    mask = maskc.compile_mask("mask m()\n  allow (-q - 2 * k) % 2 == 0, k <= q\n")
    assert mask.exact
    _check_classes(mask.bind(seq_len=40), 4, 4, exact=True)


_NEIGHBORHOOD = """
mask neighborhood(width: int, window: int)
  let height = (seq_len + width - 1) // width
  let y(i) = i // width
  let x(i) = i % width
  let y0(i) = clamp(y(i) - window // 2, 0, height - window)
  let x0(i) = clamp(x(i) - window // 2, 0, width - window)
  allow y(k) in [y0(q), y0(q) + window), x(k) in [x0(q), x0(q) + window)
"""


@settings(max_examples=60)
@given(st.integers(2, 20), st.data(), tile_shape)
def test_pieces_cut_where_a_chunk_interval_empties(width, data, shape):
    """A window over an image whose last row is short (seq_len not a multiple of the width): a chunk's key
    interval empties inside a piece, where the pieces are cut again. Classes against brute force and
    against the rows-only classification."""
    window = data.draw(st.integers(1, width), label="window")
    seq_len = data.draw(st.integers((window - 1) * width + 1, (window + 6) * width), label="seq_len")
    assume((seq_len + width - 1) // width >= window)
    mask = maskc.compile_mask(_NEIGHBORHOOD)
    cuts = []
    real_cut = piece_tiles._cut

    def counting_cut(*args, **kwargs):
        cuts.append(len(args[6]))
        return real_cut(*args, **kwargs)
    piece_tiles._cut = counting_cut
    try:
        bound = mask.bind(seq_len=seq_len, width=width, window=window)
        _check_classes(bound, *shape, exact=True)
    finally:
        piece_tiles._cut = real_cut
    event(f"pieces cut again: {bool(cuts)}")
    saved = classify_module._piece_breaks
    classify_module._piece_breaks = lambda mask: None
    try:
        rows_only = maskc.compile_mask(_NEIGHBORHOOD).bind(seq_len=seq_len, width=width, window=window)
        np.testing.assert_array_equal(bound.tiles(*shape), rows_only.tiles(*shape))
    finally:
        classify_module._piece_breaks = saved


_EMPTIES_INSIDE = {      # windows along an image row, ended by a key bound: a row's interval empties inside a piece
    "at its last rows": """
mask m(w: int, c: int, e: int)
  allow k // w == q // w, k % w >= q % w, k % w <= q % w + c, k <= e
""",
    "at its first rows": """
mask m(w: int, c: int, e: int)
  allow k // w == q // w, k % w <= q % w, k % w >= q % w - c, k >= e
""",
}


@settings(max_examples=60)
@pytest.mark.parametrize("kind", ["image", *_EMPTIES_INSIDE])
@given(width=st.integers(2, 20), data=st.data())
def test_families_that_empty_inside_their_piece_keep_their_hull(kind, width, data):
    """A family whose interval empties inside its piece is kept with the hull of its keys over the piece's rows
    (piece_tiles._emptying_hulls) instead of the piece being cut: the classes equal brute force, and the runs
    equal bit for bit those of the pieces cut (the hulls left out). Windows ended by a key bound inside an image
    row (the hull's far end read at the row next to the cut), and NATTEN's short last row (in tall q_blocks, where
    its pieces hold the cuts)."""
    shape = data.draw(st.tuples(st.integers(8, 64), st.integers(1, 24)) if kind == "image" else tile_shape,
                      label="shape")
    if kind == "image":
        window = data.draw(st.integers(1, width), label="window")
        rows, last = data.draw(st.integers(window, window + 6), label="rows"), data.draw(st.integers(1, width - 1))
        seq_len = (rows - 1) * width + last
        text, params = _NEIGHBORHOOD, {"width": width, "window": window}
    else:
        seq_len = data.draw(st.integers(width, 6 * width), label="seq_len")
        params = {"w": width, "c": data.draw(st.integers(0, width), label="c"),
                  "e": data.draw(st.integers(0, seq_len), label="e")}
        text = _EMPTIES_INSIDE[kind]
    kept = []
    real = piece_tiles._emptying_hulls

    def counted(*args):
        found = real(*args)
        kept.append(len(found[0]))
        return found

    def runs(hulls):
        piece_tiles._emptying_hulls = hulls
        try:
            bound = maskc.compile_mask(text).bind(seq_len=seq_len, **params)
            _check_classes(bound, *shape, exact=True)
            tile_map = bound.tile_map(*shape)
            return tile_map.run_offsets, tile_map.runs
        finally:
            piece_tiles._emptying_hulls = real
    got = runs(counted)
    event(f"{kind}: hulls kept: {sum(kept) > 0}")
    none = np.zeros(0, np.int64)
    for a, b in zip(got, runs(lambda *args: (none, none, none))):
        np.testing.assert_array_equal(a, b)


@settings(max_examples=60)
@given(st.integers(8, 40), st.integers(0, 3), st.data(), tile_shape)
def test_families_empty_at_both_ends_of_their_piece_but_not_between_are_kept(width, c, data, shape):
    """An image row's window ``[max(5, x), min(x + c, 6)]`` along the row is empty at the row's first and last
    columns and not between (neither bound keeps it empty at both ends, so it is not blind): its piece is left
    to the rows, not dropped with the families empty throughout. Classes against brute force."""
    seq_len = data.draw(st.integers(width, 4 * width), label="seq_len")
    mask = maskc.compile_mask("mask m(w: int, c: int)\n  allow k // w == q // w, k % w >= 5, k % w >= q % w,"
                              " k % w <= q % w + c, k % w <= 6\n")
    _check_classes(mask.bind(seq_len=seq_len, w=width, c=c), *shape, exact=True)


@settings(max_examples=80)
@given(st.booleans(), st.integers(2, 20), st.data(), st.tuples(st.integers(8, 64), st.integers(1, 24)))
def test_cut_pieces_interpolated_as_enumerated(image, width, data, shape):
    """The families of pieces cut again, from the pieces' bounds interpolated to the parts' ends
    (piece_tiles._parts_by_interpolation), equal those of the parts enumerated again, bit for bit: the same
    runs, the same q_blocks left to the rows (a window over an image with a short last row, cut often where
    q_blocks are tall, or any chunk mask)."""
    text = _NEIGHBORHOOD if image else data.draw(chunk_mask_text(consistent=True), label="text")
    if image:                                     # a short last row: its chunk empties inside pieces
        window = data.draw(st.integers(1, width), label="window")
        rows, last = data.draw(st.integers(window, window + 6), label="rows"), data.draw(st.integers(1, width - 1))
        seq_len = (rows - 1) * width + last
        bind_args = (seq_len, seq_len, {"width": width, "window": window})
    else:
        bind_args = data.draw(chunk_binding(), label="bind")
    answered = []
    real = piece_tiles._parts_by_interpolation

    def interpolated(*args):
        found = real(*args)
        answered.append(found is not None)
        return found

    def runs(how):
        piece_tiles._parts_by_interpolation = how
        try:
            mask, bound = _compiled_and_bound(text, bind_args)
            tile_map = bound.tile_map(*shape)
            return tile_map.run_offsets, tile_map.runs
        finally:
            piece_tiles._parts_by_interpolation = real
    got = runs(interpolated)
    event(("image, " if image else "") + ("no piece cut" if not answered else f"interpolated: {all(answered)}"))
    enumerated = runs(lambda *args: None)
    for a, b in zip(got, enumerated):
        np.testing.assert_array_equal(a, b)


@given(st.lists(st.tuples(st.booleans(), st.integers(-2, 3), st.integers(1, 6), st.integers(0, 2), st.booleans(),
                          st.booleans()), max_size=24))
def test_families_drop_covered_keeps_are_kept(drawn):
    """Where _nothing_covered says _drop_covered keeps the families as they are (none constant over its piece, or
    each piece's hulls disjoint with no two constant ones touching), piece_runs skips it: it must return them
    unchanged there. Families non-empty at both ends, in order, some constant, some touching or overlapping
    the previous one (then it may not keep them)."""
    rows, piece, start, end = [], 0, 0, 0
    for next_piece, gap, width, inset, constant, moves_right in drawn:
        piece, start, end = (piece + 1, 0, 0) if next_piece else (piece, start, end)
        start = max(end + gap, start)                  # hulls in order of their start
        end = max(end, start + width)
        inner = min(inset, width - 1)                  # the other end's interval, inside the hull
        h0, h1 = start, start + width
        rows.append((piece, h0, h1, h0, h1) if constant else (piece, h0, h1 - inner, h0 + inner, h1) if moves_right
                    else (piece, h0 + inner, h1, h0, h1 - inner))
    families = tuple(np.array(x, np.int64) for x in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 5
    ordered = piece_tiles._hull_order(families, 200, sort=False)
    assume(ordered is not None and piece_tiles._nothing_covered(*ordered))
    event(f"constant families: {min(sum(r[4] for r in drawn), 3)}, overlapping: {any(r[1] < 0 for r in drawn)}")
    for kept, given_ in zip(piece_tiles._drop_covered(*families, 200), families):
        np.testing.assert_array_equal(kept, given_)


@given(st.lists(st.tuples(st.booleans(), st.integers(0, 40), st.integers(1, 40)), max_size=40),
       st.sampled_from([1, 4, 7, 16]))
def test_touched_blocks_are_the_union_of_the_hulls_blocks(drawn, block_n):
    """piece_runs takes each piece's touched key blocks from _touched_blocks, not keys.union: for families in
    hull order whose hulls are disjoint within a piece (gaps of 0 keys: abutting hulls; hulls inside one block,
    or one block apart, so that blocks touch and merge), both give the same ranges."""
    rows, piece, end = [], 0, 0
    for next_piece, gap, width in drawn:
        piece, end = (piece + 1, 0) if next_piece else (piece, end)
        rows.append((piece, end + gap, end + gap + width))
        end += gap + width
    piece, h0, h1 = (np.array(x, np.int64) for x in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 3
    kt = -(-int(h1.max(initial=1)) // block_n)                 # the blocks that the hulls reach
    expected = union(piece, h0 // block_n, -(-h1 // block_n), kt)
    for got, want in zip(piece_tiles._touched_blocks(piece, h0, h1, block_n), expected):
        np.testing.assert_array_equal(got, want)


def _dropped_by_hand(families):
    """What _drop_covered returns, written out: each piece's constant families merged where they overlap or
    touch (first, by piece and start), then the other families in order less those inside a merged one; the
    families unchanged where nothing merges and nothing lies inside."""
    rows = list(zip(*(x.tolist() for x in families)))
    merged: list = []
    for p, lo, hi in sorted((p, la, ha) for p, la, ha, lb, hb in rows if (la, ha) == (lb, hb)):
        if merged and merged[-1][0] == p and lo <= merged[-1][2]:
            merged[-1][2] = max(merged[-1][2], hi)
        else:
            merged.append([p, lo, hi])
    rest = [r for r in rows if (r[1], r[2]) != (r[3], r[4])]
    kept = [r for r in rest if not any(p == r[0] and lo <= min(r[1], r[3]) and hi >= max(r[2], r[4])
                                       for p, lo, hi in merged)]
    if len(kept) == len(rest) and len(merged) == len(rows) - len(rest):
        return rows
    return [(p, lo, hi, lo, hi) for p, lo, hi in merged] + kept


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 30), st.integers(1, 12), st.integers(-3, 3),
                          st.integers(-3, 3)), max_size=24),
       st.lists(st.integers(0, 3), max_size=3))
def test_families_inside_constant_ones_are_dropped(drawn, doubled):
    """_drop_covered against _dropped_by_hand: families of four pieces in any order, each an interval at the
    first end and one moved by up to 3 keys at each side at the other (constant where unmoved), pieces with
    one constant interval (the union looked up by piece) and with several (searched: the pieces ``doubled``
    get a constant family holding a moving one, and a second constant family to their right; piece 4 has one
    constant family, a moving one inside it and one across its start)."""
    rows = [(p, lo, lo + width, lo + max(0, da), lo + width + max(0, db) if da or db else lo + width)
            for p, lo, width, da, db in drawn]
    rows = [(p, la, ha, lb, max(hb, lb + 1)) for p, la, ha, lb, hb in rows]
    rows += [r for p in doubled for r in ((p, 0, 40, 0, 40), (p, 5, 8, 6, 9), (p, 60, 64, 60, 64))]
    rows += [(4, 47, 52, 48, 53), (4, 50, 56, 50, 56), (4, 51, 53, 52, 54)]    # one constant, a family across its start
    families = tuple(np.array(x, np.int64) for x in zip(*rows)) if rows else (np.zeros(0, np.int64),) * 5
    got = list(zip(*(x.tolist() for x in piece_tiles._drop_covered(*families, 100))))
    expected = _dropped_by_hand(families)
    constants = [r[0] for r in expected if r[1:3] == r[3:5]]
    event(f"several constant intervals in a piece: {len(set(constants)) < len(constants)}")
    event(f"fewer families: {len(expected) < len(rows)}")
    assert got == expected


_COLUMN_CHUNKED = {      # the rule beside the columns: windows along image rows (those after t, or from 0), clear's disc
    "row window": "y(k) == y(q) and x(k) <= x(q) + c",
    "two rows": "y(k) >= y(q) - 1 and y(k) <= y(q) and x(k) >= x(q) - c",
    "own row from c": "y(k) == y(q) and x(k) >= c",         # constant over a piece: a column of its own
    "disc": "(y(q) - y(k)) ** 2 + (x(q) - x(k)) ** 2 < c ** 2",
    "unaligned window": "k // w == q // w and k % w >= q % w - c",
    "unaligned rows": "k // w >= q // w - 1 and k // w <= q // w and k % w <= q % w + c",
}
_COLUMN_BOUNDS = ["", " and k >= q - c", " and k >= t", " and k <= q", " and k >= t and k <= q", " and k >= t - c",
                  " and q >= t + c"]     # the last: a guard whose truth changes inside a piece (flagged)
# the last: one interval a piece, its lower end (0) the same at both end rows and its upper one not: no column
_COLUMNS = ["q < t", "k < t", "k >= kv_len - c", "k <= q - t"]


@settings(max_examples=200)
@given(st.sampled_from(sorted(_COLUMN_CHUNKED)), st.sampled_from(_COLUMN_BOUNDS),
       st.sets(st.sampled_from(_COLUMNS), min_size=1), st.integers(1, 100), st.integers(0, 100), st.integers(2, 16),
       st.integers(0, 6), st.one_of(st.none(), st.integers(1, 120)), st.tuples(st.integers(4, 24), st.integers(1, 24)))
@example("unaligned rows", "", {"q < t"}, 4, 3, 2, 0, None, (4, 1))    # a flagged q_block on the column path
@example("row window", "", {"k < t"}, 32, 8, 8, 3, None, (8, 1))       # a piece a q_block, chains covering blocks
@example("disc", "", {"k < t", "q < t"}, 48, 16, 8, 3, None, (8, 4))   # clear's shape: a piece a q_block, none covering
@example("disc", "", {"k <= q - t"}, 96, 48, 8, 3, None, (8, 4))        # a one-level region that is no column
def test_columns_join_the_other_families_blocks(kind, bounds, columns, seq_len, t, w, c, kv_len, shape):
    """Masks with regions free of q (clear's ``q < t`` and ``k < t``, and ``k >= kv_len - c``: columns, whose
    blocks piece_runs joins to the other families' at the end) beside a chunked rule whose families lie inside a
    column, across its end (chunks from 0, not from t), abut it at one end row or at both (a block across the
    column's end then covered at every row), or lie apart: classes against brute force, and runs bit for bit
    against the path that drops the families inside the columns; q_blocks that the pieces flag get no runs
    from them."""
    t = min(t, seq_len)
    kv_len = kv_len or seq_len
    text = f"""
mask m(t: int, w: int, c: int)
  let y(i) = (i - t) // w
  let x(i) = (i - t) % w
  allow {" or ".join(sorted(columns) + [_COLUMN_CHUNKED[kind] + bounds])}
"""
    mask = maskc.compile_mask(text)
    assume(mask.exact and not mask.ranges.linear)
    taken = []
    real, real_runs = piece_tiles._column_apart, classify_module.piece_runs

    def spy(*args):
        found = real(*args)
        taken.append(found[0] is not None)
        return found

    def runs_spy(*args):
        (q_block, _, _, _), bad = found = real_runs(*args)
        assert not bad[q_block].any(), "a flagged q_block has runs from the pieces"
        event(f"flagged q_blocks: {bad.any()}")
        return found
    piece_tiles._column_apart, classify_module.piece_runs = spy, runs_spy
    try:
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, t=t, w=w, c=c)
        _check_classes(bound, *shape, exact=True)
    finally:
        piece_tiles._column_apart, classify_module.piece_runs = real, real_runs
    event(f"column path: {taken}")
    piece_tiles._column_apart = lambda *args: (None, None)
    try:
        dropped = maskc.compile_mask(text).bind(seq_len=seq_len, kv_len=kv_len, t=t, w=w, c=c).tile_map(*shape)
    finally:
        piece_tiles._column_apart = real
    got = bound.tile_map(*shape)
    np.testing.assert_array_equal(got.run_offsets, dropped.run_offsets)
    np.testing.assert_array_equal(got.runs, dropped.runs)


@settings(max_examples=600)
@example([(False, 0, 3, 0, "right"), (False, 0, 2, 0, "constant")], [(0, "around", 0, 3)])  # abuts after one inside
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 4), st.integers(1, 6), st.integers(0, 2),
                          st.sampled_from(["constant", "right", "left", "emptying"])), min_size=1, max_size=12),
       st.lists(st.tuples(st.integers(0, 11), st.sampled_from(["after", "before", "from inside", "around"]),
                          st.integers(0, 2), st.integers(1, 8)), max_size=6))
def test_families_apart_from_the_column_by_hand(drawn, columns):
    """_apart against its definition written out: no family's hull across an end of a column interval of its
    piece (``h0 < end < h1``), none abutting one at both end rows (``ha == hb == lo`` or ``la == lb == hi``).
    Families of a few pieces with disjoint hulls in hull order, small gaps; column intervals placed 0 to 2 keys
    after a family's hull, before it, from inside it, or around it (so that ends meet often), disjoint and not
    adjacent within a piece."""
    rows, piece, end = [], 0, 0
    for next_piece, gap, width, inset, form in drawn:
        piece, end = (piece + 1, 0) if next_piece else (piece, end)
        h0, h1 = end + gap, end + gap + width
        end = h1
        inner = min(inset, width - 1)
        rows.append({"constant": (piece, h0, h1, h0, h1), "right": (piece, h0, h1 - inner, h0 + inner, h1),
                     "left": (piece, h0 + inner, h1, h0, h1 - inner), "emptying": (piece, h0, h0, h1, h1)}[form])
    families = tuple(np.array(x, np.int64) for x in zip(*rows))
    placed = []
    for i, where, gap, width in columns:
        p, la, ha, lb, hb = rows[i % len(rows)]
        h0, h1 = min(la, lb), max(ha, hb)
        placed.append({"after": (p, h1 + gap, h1 + gap + width), "before": (p, max(0, h0 - gap - width), h0 - gap),
                       "from inside": (p, h0 + 1 + gap, h0 + 1 + gap + width),
                       "around": (p, max(0, h0 - gap), h1 + width % 3)}[where])
    col: list = []
    for p, lo, hi in sorted(placed):
        if lo < hi and not (col and col[-1][0] == p and lo <= col[-1][2]):
            col.append((p, lo, hi))
    c_piece, c_lo, c_hi = (np.array(x, np.int64) for x in zip(*col)) if col else (np.zeros(0, np.int64),) * 3
    across = any(p == q and ((min(la, lb) < lo < max(ha, hb)) or (min(la, lb) < hi < max(ha, hb)))
                 for p, la, ha, lb, hb in rows for q, lo, hi in col)
    abuts = any(p == q and (ha == hb == lo or la == lb == hi) for p, la, ha, lb, hb in rows for q, lo, hi in col)
    event(f"across: {across}, abuts: {abuts}")
    ordered, key = piece_tiles._keyed_hull_order(families, 100, sort=False)
    assert piece_tiles._apart(ordered, key, c_piece, c_lo, c_hi, 100) == (not across and not abuts)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 60), st.integers(0, 40), st.integers(0, 60),
                          st.integers(0, 40)), min_size=1, max_size=30), st.booleans())
def test_keyed_hull_order_keys_its_families(rows, presorted):
    """_keyed_hull_order's key is each family's ``piece * (kv_len + 1) + hull start`` in the order it returns the
    families (sorted by piece and hull start, stably), sorting or not, and that order is _hull_order's."""
    kv_len = 100
    rows = [(p, la, la + wa, lb, lb + wb) for p, la, wa, lb, wb in rows]
    if presorted:
        rows.sort(key=lambda r: (r[0], min(r[1], r[3])))
    families = tuple(np.array(x, np.int64) for x in zip(*rows))
    ordered, key = piece_tiles._keyed_hull_order(families, kv_len)
    expect = sorted(range(len(rows)), key=lambda i: (rows[i][0], min(rows[i][1], rows[i][3])))
    for got, column in zip(ordered[0], zip(*rows)):
        np.testing.assert_array_equal(got, np.array(column)[expect])
    (piece, la, _, lb, _), h0, _, _ = ordered
    np.testing.assert_array_equal(key, piece * (kv_len + 1) + np.minimum(la, lb))
    np.testing.assert_array_equal(h0, np.minimum(la, lb))
    same = piece_tiles._hull_order(families, kv_len)
    for a, b in zip(same[0] + same[1:], ordered[0] + ordered[1:]):
        np.testing.assert_array_equal(a, b)


# Rules that pin q to a point or a bounded interval in the middle of a q_block, with a chunked region in the mask:
# two guards (q >= lo and q <= hi), each affine, whose conjunction is false at both ends of the q_block's piece
# and true between. The pieces classified every tile of such a q_block EMPTY (a MISMATCH in `maskc run`).
_CLEAR = (EXAMPLES / "clear.mask").read_text()
_PINNED = {
    "a point": ("mask f()\n  allow q == 1000, k % 4 == 0\n", {}),
    "a register token in clear": (_CLEAR.replace("radius: int = 16)", "radius: int = 16, reg: int = 1000)")
                                  + "  allow q == reg\n", {}),
    "a point beside a strided causal rule": ("mask f()\n  allow k <= q, k % 8 == q % 8\n  allow q == 1\n", {}),
    "a point beside a disc": ("mask f()\n  allow q == 1\n  allow (q - k) ** 2 <= 14\n", {}),
    "a residue": ("mask f()\n  allow q % 100 == 7, k % 4 == 0\n", {}),
    "an interval": ("mask f()\n  allow q in [5, 10), k % 4 == 0\n", {}),
    "two bounds": ("mask f()\n  allow q >= 5, q <= 9, k % 4 == 0\n", {}),
    "one-sided bounds": ("mask f()\n  allow q < 3, k % 4 == 0\n  allow q >= 4000, k % 4 == 1\n", {}),
}


@pytest.mark.parametrize("name", sorted(_PINNED))
def test_rows_pinned_inside_a_q_block_are_seen(name):
    """At 4096 tokens and 128 x 128 tiles, against brute force: exact classes (none EMPTY where a pinned row
    sees keys), the descriptor's, and no q_block left to the row-by-row classification."""
    text, params = _PINNED[name]
    mask = maskc.compile_mask(text)
    assert mask.exact
    bad = []
    real = classify_module.piece_runs

    def spy(*args):
        found = real(*args)
        bad.append(int(found[1].sum()))
        return found
    classify_module.piece_runs = spy
    try:
        _check_classes(mask.bind(seq_len=4096, **params), 128, 128, exact=True)
    finally:
        classify_module.piece_runs = real
    assert bad == [0], "q_blocks classified row by row"


def test_a_pinned_row_reaches_flex():
    """The Flex BlockMask keeps the blocks a row pinned mid-block sees (they were dropped)."""
    pytest.importorskip("torch")
    bound = maskc.compile_mask(_PINNED["a point"][0]).bind(seq_len=4096)
    block_mask = bound.to_flex_block_mask(128)
    kept = int(block_mask.kv_num_blocks[0, 0, 1000 // 128]) + int(block_mask.full_kv_num_blocks[0, 0, 1000 // 128]
                                                                  if block_mask.full_kv_num_blocks is not None else 0)
    assert kept == 32


_NESTED_EXTREMES = {     # a form of q with extremes inside extremes: clamps, a shifted inner one, a scaled one
    "clamp": "clamp(i % w + c, lo, hi)",
    "clamp to a row": "clamp(i % w + c, 0, i // w)",
    "parallel bound": "min(max(i % w + c, lo), i % w + hi)",
    "max of a min": "max(min(i % w + c, hi), lo)",
    "shifted inside": "min(max(i % w + c, lo) + 3, hi)",
    "scaled inside": "min(2 * max(i % w + c, lo), hi)",
    "three deep": "min(max(min(i % w + c, hi), lo), i % w + 1)",
    "one inside twice": "min(max(i % w + c, lo), 2 * max(i % w + c, lo) - hi)",
}


@settings(max_examples=200)
@given(st.sampled_from(sorted(_NESTED_EXTREMES)), st.integers(1, 20), st.integers(-8, 8), st.integers(-4, 12),
       st.integers(-4, 24), st.integers(1, 150), tile_shape)
@example("shifted inside", 20, 0, 0, 10, 100, (16, 16))      # the outer one's crossing 3 rows from the inner form's
def test_nested_extremes_are_affine_on_each_piece(kind, w, c, lo, hi, seq_len, shape):
    """piece_starts' rounds of cuts (``Breaks.cut_rounds``: a clamp's forms cut in one round where they are free of
    extremes): every extreme the mask reads is affine on each piece, at every row, and the classes are the
    brute-force ones."""
    from maskc.analysis.pieces import plan_of
    text = (f"mask m(w: int, c: int, lo: int, hi: int)\n  let x(i) = {_NESTED_EXTREMES[kind]}\n"
            "  allow k <= q, k >= q - x(q) - 1\n")
    mask, bound = _compiled_and_bound(text, (seq_len, seq_len, {"w": w, "c": c, "lo": lo, "hi": hi}))
    params = bound.params.batch[0]
    spec = mask.specialized(params.ints)
    plan = plan_of(spec.allow, spec.deny)
    assume(plan is not None and plan.breaks.extremes)
    breaks = plan.breaks
    event(f"{kind}: {len(breaks.extremes)} extremes, {len(breaks.cut_rounds())} rounds")
    starts = piece_tiles.piece_starts(breaks, params, 0, 0, seq_len, seq_len, shape[0])
    piece = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, seq_len)))
    env = Env(params, seq_len, seq_len, 0, 0, np.arange(seq_len, dtype=np.int64))
    forms = [ir.Lin(((e, 1),), 0) for e in breaks.extremes]
    for form, v in zip(forms, FormProgram([(f, None) for f in forms]).run(env)):
        v = np.broadcast_to(v, (seq_len,))
        step = np.diff(v)
        bends = (step[1:] != step[:-1]) & (piece[2:] == piece[1:-1]) & (piece[1:-1] == piece[:-2])
        assert not bends.any(), f"{form} bends inside a piece, at q = {int(bends.argmax()) + 1}"
    _check_classes(bound, *shape, exact=mask.exact)


_CUT_ROUNDS = {    # hstu's clamp of a position within its user, extremes over a segment, and a round of two-slope forms
    "hstu": "clamp(i - users.start(i) - c, 0, users.length(i) - lo)",
    "two segment forms": "min(max(i - users.start(i), lo), users.end(i) - hi)",
    "a scaled one": "min(2 * max(i - users.start(i) - c, 0), users.length(i) + hi)",
    "two scaled": "min(2 * max(i % w + c, lo), 2 * max(i % w, hi) - 1)",
}


@settings(max_examples=200)
@given(st.sampled_from(sorted(_NESTED_EXTREMES) + sorted(_CUT_ROUNDS)), st.integers(1, 20),
       st.integers(-8, 8), st.integers(-4, 12), st.integers(-4, 24), st.integers(1, 150),
       st.lists(st.integers(0, 60), min_size=1, max_size=5), tile_shape)
def test_cut_rounds_leave_out_only_pairs_that_never_cross(kind, w, c, lo, hi, seq_len, lengths, shape):
    """piece_starts' cut rounds compare only the pairs of forms that may cross (``Breaks.cut_rounds``: not two of
    one slope): the pieces are those every pair of every round's forms gives (the pairs restored)."""
    from maskc.analysis.pieces import plan_of
    form = {**_NESTED_EXTREMES, **_CUT_ROUNDS}[kind]
    if "users" in form:
        text = (f"mask m(users: segments, w: int, c: int, lo: int, hi: int)\n"
                f"  let x(i) = {form}\n  allow same(users), k <= q, k >= q - x(q) - 1\n")
        seq_len = max(sum(lengths), 1)
        values = {"users": lengths[:-1] + [seq_len - sum(lengths[:-1])]}     # segment lengths, covering the rows
    else:
        text = f"mask m(w: int, c: int, lo: int, hi: int)\n  let x(i) = {form}\n  allow k <= q, k >= q - x(q) - 1\n"
        values = {}
    mask, bound = _compiled_and_bound(text, (seq_len, seq_len, {"w": w, "c": c, "lo": lo, "hi": hi, **values}))
    params = bound.params.batch[0]
    spec = mask.specialized(params.ints)
    plan = plan_of(spec.allow, spec.deny)
    assume(plan is not None and plan.breaks.cut_rounds())
    breaks = plan.breaks
    every = piece_tiles.Breaks()
    every.__dict__.update(breaks.__dict__)
    every._rounds = [(program, tuple(zip(*[(i, j) for j in range(len(program.outputs)) for i in range(j)]))
                      or ((), ())) for program, _ in breaks.cut_rounds()]
    left_out = sum(len(p[0]) for _, p in every._rounds) - sum(len(p[0]) for _, p in breaks.cut_rounds())
    event(f"{kind}: pairs left out {left_out}")
    for block_m in (shape[0], None):
        found = piece_tiles.piece_starts(breaks, params, 0, 0, seq_len, seq_len, block_m)
        assert found.tolist() == piece_tiles.piece_starts(every, params, 0, 0, seq_len, seq_len, block_m).tolist()


def _guards_hold_piece_by_piece(regions, breaks, params, b, head, seq_len, kv_len, block_m):
    """Every guard of every region has one truth on each piece (:func:`piece_tiles.piece_starts`), at every row."""
    starts = piece_tiles.piece_starts(breaks, params, b, head, seq_len, kv_len, block_m)
    piece = np.repeat(np.arange(len(starts)), np.diff(np.append(starts, seq_len)))
    guards = [g.lin for r in regions for g in r.guards + r.static_guards + piece_tiles.nest_of(r).guards]
    env = Env(params, seq_len, kv_len, head, b, np.arange(seq_len, dtype=np.int64))
    for lin, v in zip(guards, FormProgram([(lin, None) for lin in guards]).run(env)):
        holds = np.broadcast_to(v <= 0, (seq_len,))
        changes = (holds[1:] != holds[:-1]) & (piece[1:] == piece[:-1])
        assert not changes.any(), f"guard {lin} changes truth inside a piece, at q = {int(changes.argmax()) + 1}"


@settings(max_examples=200)
@given(st.lists(q_guard(), min_size=1, max_size=2), st.lists(chunk_atom(True), min_size=0, max_size=2),
       chunk_mask_text(consistent=True), st.booleans(), chunk_binding(), tile_shape)
def test_rules_pinning_q_beside_chunked_regions_are_exact(guards, atoms, others, deny, bind_args, shape):
    """A rule of q guards (points, intervals, residues, one side of an interval), with chunked atoms or alone,
    added to a mask of chunked rules: exact classes against brute force, the same as counted row by row, and
    pieces on which every guard has one truth. (The chunked fuzzers drew one-sided q guards only, never a
    conjunction true inside a piece and false at both ends.) Deny rules, kept in some draws, send a mask to the
    rows alone."""
    text = "".join(line + "\n" for line in others.splitlines() if deny or not line.startswith("  deny"))
    text += "  allow " + ", ".join(guards + atoms) + "\n"
    mask, bound = _compiled_and_bound(text, bind_args)
    assume(mask.exact)
    event(f"linear: {mask.ranges.linear}")
    seen = []
    real = classify_module.piece_runs

    def spy(regions, breaks, make, params, b, head, seq_len, kv_len, block_m, *rest):
        seen.append(1)
        _guards_hold_piece_by_piece(regions, breaks, params, b, head, seq_len, kv_len, block_m)
        return real(regions, breaks, make, params, b, head, seq_len, kv_len, block_m, *rest)
    classify_module.piece_runs = spy
    try:
        _check_classes(bound, *shape, exact=True)
    finally:
        classify_module.piece_runs = real
    event(f"pieces: {bool(seen)}")
    if not mask.ranges.linear:
        saved = classify_module._piece_breaks
        classify_module._piece_breaks = lambda mask: None
        try:
            rows_only = mask.bind(seq_len=bind_args[0], kv_len=bind_args[1], **bind_args[2]).tiles(*shape)
        finally:
            classify_module._piece_breaks = saved
        np.testing.assert_array_equal(bound.tiles(*shape), rows_only)


# -- strided families (keys.StridedFamilies, piece_tiles._strided_runs) ---------------------------------------

_TRANSLATES = {        # masks whose level-0 intervals are translates across runs of chunks (video's image rows)
    "video": "mask v(w: int, ht: int, r: int, p: int)\n  let t(i) = i // (w * ht)\n  let y(i) = (i // w) % ht\n"
             "  let x(i) = i % w\n  allow t(k) in [t(q) - p, t(q)], y(k) in [y(q) - r, y(q) + r], "
             "x(k) in [x(q) - r, x(q) + r]\n",
    "offset image": "mask m(w: int, o: int, r: int, a: int)\n  allow abs((q - o) // w - (k - o) // w) <= r, "
                    "(k - o) % w in [(q - o) % w - a, (q - o) % w + r]\n",
    "neighborhood": (EXAMPLES / "neighborhood.mask").read_text(),
    "shifted columns": "mask m(w: int, r: int, a: int)\n  allow k // w in [q // w - r, q // w], "
                       "k % w in [q % w + a, q % w + r]\n",
    "clipped columns": "mask m(w: int, r: int, a: int)\n  allow k // w <= q // w, k % w <= q % w + r, k >= q - a\n",
    "frames": "mask m(w: int, ht: int, r: int)\n  allow (k // w) % ht in [(q // w) % ht - r, (q // w) % ht], "
              "k % w >= q % w - r, k // (w * ht) == q // (w * ht)\n",
}


@st.composite
def _translate_binding(draw):
    """(kind, seq_len, kv_len, params) for a mask of _TRANSLATES, lengths at and off multiples of the width (a
    last chunk cut short by kv_len: the clip binds at the last members of the runs that reach it, peeled)."""
    kind = draw(st.sampled_from(sorted(_TRANSLATES)))
    w = draw(st.integers(1, 12))
    seq_len = draw(st.one_of(st.integers(1, 160), st.integers(1, 12).map(lambda n: n * w)))
    kv_len = draw(st.one_of(st.just(seq_len), st.integers(1, 12).map(lambda n: n * w), st.integers(1, 160)))
    r, a = draw(st.integers(0, 5)), draw(st.integers(-3, 6))
    params = {"video": {"w": w, "ht": draw(st.integers(1, 5)), "r": r, "p": draw(st.integers(0, 2))},
              "offset image": {"w": w, "o": draw(st.sampled_from([kv_len % w, (kv_len % w) - w, 3])), "r": r, "a": a},
              "neighborhood": {"width": w, "window": draw(st.integers(1, w))},
              "shifted columns": {"w": w, "r": r, "a": a},
              "clipped columns": {"w": w, "r": r, "a": draw(st.integers(0, 40))},
              "frames": {"w": w, "ht": draw(st.integers(1, 5)), "r": r}}[kind]
    return kind, seq_len, kv_len, params


def _assert_members(records, owner, lo, hi, unsure) -> None:
    """Member j of each record is its interval moved by j * stride, with its owner and unsure flag: the families
    (owner, lo, hi, unsure) the records stand for, member by member."""
    member = np.arange(int(records.count.sum())) - np.repeat(records.count.cumsum() - records.count, records.count)
    step = np.repeat(records.stride, records.count) * member
    np.testing.assert_array_equal(np.repeat(records.owner, records.count), owner)
    for p in range(2):
        np.testing.assert_array_equal(np.repeat(records.lo[p], records.count) + step, lo[p])
        np.testing.assert_array_equal(np.repeat(records.hi[p], records.count) + step, hi[p])
    np.testing.assert_array_equal(records.unsure, unsure)


def _some_empty(records) -> bool:
    return any((lo >= hi).any() for lo, hi in zip(records.lo, records.hi))


def _bound_with_records(text, seq_len, kv_len, params, shape, records=True):
    """The bound mask (from a fresh compile), its classes at ``shape`` found, the StridedFamilies that finding them
    made, and whether piece_tiles._strided_runs answered for any (``records`` off: no records tried, every family
    enumerated as before them)."""
    from maskc.analysis import strided
    made, answered = [], []
    real, real_runs = strided.records, piece_tiles._strided_runs

    def recorded(*args):
        found = real(*args)
        made.append(found)
        return found

    def recorded_runs(*args):
        found = real_runs(*args)
        answered.append(found is not None)
        return found
    strided.records = recorded if records else (lambda *args: None)
    piece_tiles._strided_runs = recorded_runs
    try:
        mask = maskc.compile_mask(text)
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
        bound.tiles(*shape)                      # a bind's classes are found lazily: found here, patched
    except maskc.MaskError as err:
        event(f"rejected: {type(err).__name__}")
        assume(False)
    finally:
        strided.records, piece_tiles._strided_runs = real, real_runs
    return mask, bound, [f for f in made if f is not None], any(answered)


@settings(max_examples=300)
@given(_translate_binding(), st.one_of(tile_shape, st.tuples(st.integers(1, 8), st.integers(1, 8)),
                                       st.tuples(st.integers(4, 32), st.integers(8, 48))))
@example(("neighborhood", 121, 121, {"width": 11, "window": 3}), (4, 4))       # stride 11 past block_n 4
@example(("video", 96, 96, {"w": 4, "ht": 3, "r": 1, "p": 1}), (16, 16))
@example(("neighborhood", 144, 144, {"width": 12, "window": 2}), (1, 3))      # untouched blocks between members
@example(("video", 30, 30, {"w": 5, "ht": 6, "r": 2, "p": 0}), (1, 4))         # a last member covers the short tile
@example(("video", 64, 64, {"w": 4, "ht": 4, "r": 4, "p": 0}), (16, 8))       # whole image rows: members chain
@example(("neighborhood", 124, 124, {"width": 11, "window": 3}), (4, 4))     # a short last row: peeled, some empty
@example(("neighborhood", 125, 125, {"width": 11, "window": 5}), (8, 8))
@example(("video", 116, 71, {"w": 9, "ht": 3, "r": 0, "p": 2}), (5, 2))     # peeled, empty at an end, not monotone
@example(("clipped columns", 112, 103, {"w": 4, "r": 1, "a": 0}), (4, 3))
@example(("neighborhood", 118, 98, {"width": 6, "window": 1}), (2, 5))   # peeled, empty at both ends: dropped
def test_strided_records_are_the_families_they_stand_for(drawn, shape):
    """Each record of a StridedFamilies, its members listed (``lo + j * stride``, j < count), is the families that
    enumerate_keys finds without records (its ``expand``, today's code): owners, intervals at both end rows,
    unsure pieces; and the classes from the records are the brute-force ones, the descriptor the one built with
    the records off, bit for bit."""
    kind, seq_len, kv_len, params = drawn
    mask, bound, made, answered = _bound_with_records(_TRANSLATES[kind], seq_len, kv_len, params, shape)
    event(f"{kind}: records {'made' if made else 'not made'}, runs from them: {answered}")
    for records in made:
        assert (records.count >= 1).all() and (records.stride >= 1).all()
        several = records.count > 1                       # only a record of one (peeled) may be empty
        assert all(((lo < hi) | ~several).all() for lo, hi in zip(records.lo, records.hi))
        event(f"{kind}: peeled members {'empty at an end' if _some_empty(records) else 'none empty'}")
        owner, lo, hi, unsure, *_ = records.expand()
        _assert_members(records, owner, lo, hi, unsure)
    _check_classes(bound, *shape, exact=mask.exact)
    _, before, _, _ = _bound_with_records(_TRANSLATES[kind], seq_len, kv_len, params, shape, records=False)
    for name in ("run_offsets", "runs", "work_order"):
        np.testing.assert_array_equal(getattr(bound.descriptor(*shape), name), getattr(before.descriptor(*shape), name))


@settings(max_examples=200)
@given(chunk_mask_text(consistent=True), chunk_binding(), tile_shape)
def test_random_chunk_masks_classify_the_same_with_records(text, bind_args, shape):
    """Random image masks (columns, rows, frames, discs, windows; several rules) bound with the records tried and
    without: the same descriptor, and the brute-force classes."""
    seq_len, kv_len, params = bind_args
    mask, bound, made, answered = _bound_with_records(text, seq_len, kv_len, params, shape)
    event(f"records made: {bool(made)}, runs from them: {answered}")
    _check_classes(bound, *shape, exact=mask.exact)
    _, before, _, _ = _bound_with_records(text, seq_len, kv_len, params, shape, records=False)
    for name in ("run_offsets", "runs", "work_order"):
        np.testing.assert_array_equal(getattr(bound.descriptor(*shape), name), getattr(before.descriptor(*shape), name))


_BOUNDED_TRANSLATES = {    # level 0 with chunk-free bounds that bind at some chunks of a run and not at others
    "below": "mask m(w: int, r: int, a: int)\n  allow k // w in [q // w - r, q // w], k % w <= q % w + r, k <= q + a\n",
    "above": "mask m(w: int, r: int, a: int)\n  allow k // w in [q // w - r, q // w + r], k % w >= q % w - r, "
             "k >= q - a\n",
    "both": "mask m(w: int, r: int, a: int)\n  allow k // w <= q // w + r, k % w in [q % w - r, q % w + 1], "
            "k >= q - a, k < q + a\n",
}


@settings(max_examples=400)
@given(st.sampled_from(sorted(_BOUNDED_TRANSLATES)), st.integers(1, 9), st.integers(1, 12), st.integers(0, 4),
       st.integers(-4, 40), st.lists(st.tuples(st.integers(0, 120), st.integers(0, 6)), min_size=1, max_size=3),
       st.integers(0, 8))
def test_records_at_any_points_are_the_families(kind, w, chunks, r, a, rows, short):
    """enumerate_keys with and without records, at one to three owners' two points anywhere (few owners: few
    records, so one whose chunk-free bound binds at a single chunk of its run is often the only one that could
    refuse them): the records' members are the families, or no records are made. Points a few rows apart (far
    apart, most owners' chunk ranges differ: unsure, no families)."""
    from maskc.analysis import keys, strided
    kv_len = max(1, chunks * w - short % w)                # the last chunk whole, or cut short (the clip binds)
    points = [(q, q + d) for q, d in rows]
    seq_len = max(q for p in points for q in p) + 1
    mask = maskc.compile_mask(_BOUNDED_TRANSLATES[kind])
    try:
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, w=w, r=r, a=a)
    except maskc.MaskError:
        assume(False)
    params = bound.params.batch[0]
    make = values_at(params, seq_len, kv_len, 0, 0)
    at = [np.array(p, np.int64) for p in zip(*points)]
    for region in mask.specialized(params.ints).allow:
        found = keys.enumerate_keys(region, make, at, kv_len, 1 << 20, records=strided.records)
        owner, lo, hi, unsure, *_ = keys.enumerate_keys(region, make, at, kv_len, 1 << 20)
        if not isinstance(found, strided.StridedFamilies):
            event(f"{kind}: families")
            continue
        event(f"{kind}: records, {'peeled' if (found.count == 1).any() else 'none of one'}")
        _assert_members(found, owner, lo, hi, unsure)


@settings(max_examples=300, deadline=None)
@given(mask_text(exact=True), binding(), st.data())
def test_one_level_intervals_are_each_owners_bounds(text, bind_args, data):
    """A one-level region free of chunks (a linear region: keys ``k`` between forms of q) enumerated at one or two
    points: its families are the owners whose guards hold at every point, each with the interval of its own row at
    each point, ``[max(0, lower bounds), min(kv_len - 1, upper bounds) + 1)`` rounded inward, evaluated row by row
    (RowValues) here."""
    from maskc.analysis.keys import enumerate_keys
    mask, bound = _compiled_and_bound(text, bind_args)
    params, s, kv = bound.params.batch[0], bound.seq_len, bound.kv_len
    make = values_at(params, s, kv, 0, 0)
    n = data.draw(st.integers(1, 6))
    points = [np.array(data.draw(st.lists(st.integers(0, s - 1), min_size=n, max_size=n)), np.int64)
              for _ in range(data.draw(st.integers(1, 2)))]
    for region in mask.specialized(params.ints).allow:
        if region.chunks is not None or not region.linear:
            continue
        owner, lo, hi, *_ = enumerate_keys(region, make, points, kv, 1 << 20)
        holds = np.ones(n, bool)
        for q in points:
            rows = RowValues(params, s, kv, 0, 0, q)
            for g in region.static_guards + region.guards:
                holds &= np.broadcast_to(rows.lin(g.lin) <= 0, (n,))
        np.testing.assert_array_equal(owner, holds.nonzero()[0])
        for p, q in enumerate(points):
            rows = RowValues(params, s, kv, 0, 0, q[owner])
            low = np.zeros(len(owner), np.int64)
            high = np.full(len(owner), kv - 1, np.int64)
            for b in region.lower:
                low = np.maximum(low, k_bound_rows(b, rows, True))
            for b in region.upper:
                high = np.minimum(high, k_bound_rows(b, rows, False))
            np.testing.assert_array_equal(lo[p], low)
            np.testing.assert_array_equal(hi[p], high + 1)


@settings(max_examples=400)
@given(st.lists(st.tuples(st.sampled_from([1, -1]), st.integers(-40, 40), st.integers(1, 24)), max_size=2),
       st.lists(st.tuples(st.sampled_from([1, 2, -1, -3]), st.integers(-90, 90)), max_size=2),
       st.sampled_from([None, 1, 2, 4, 8, 12]), st.integers(0, 3), st.integers(1, 90))
@example([(1, -16, 8)], [(1, -15)], 8, 0, 64)             # clear's shape: the floor and the line at q_block starts
@example([(1, -16, 8)], [(1, -15)], 8, 1, 64)             # the same, rows from the second q_block
@example([(-1, 7, 16)], [(-1, 16)], 8, 0, 64)
def test_piece_starts_are_every_row_where_a_floor_or_line_changes(floors, lines, block_m, first_block, length):
    """piece_starts (floors and guard lines only) against every row, by hand: a row starts a piece where it starts
    its q_block or the rows' range, or where some floor ``(sign q + r) // d`` or line ``c q + r <= 0`` differs from
    the row before. Cuts at q_block starts (a floor stepping at them only, a line changing there) add none: the
    starts come back the same, sorted or not."""
    from maskc.analysis import linear as L
    breaks = piece_tiles.Breaks()
    breaks.floors = {(sign, L.const(r), L.const(d)) for sign, r, d in floors}
    breaks.lines = {(c, L.const(r)) for c, r in lines}
    row0 = first_block * (block_m or 1)
    row1 = row0 + length
    seq_len = row1 + 5
    found = piece_tiles.piece_starts(breaks, None, 0, 0, seq_len, seq_len, block_m, (row0, row1))

    def cuts(q):
        return ([(sign * q + r) // d for sign, r, d in floors] + [c * q + r <= 0 for c, r in lines]
                + ([q // block_m] if block_m else []))
    want = [q for q in range(row0, row1) if q == row0 or cuts(q) != cuts(q - 1)]
    assert found.tolist() == want
