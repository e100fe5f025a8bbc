"""Tile classification against brute force: sound on every mask, exact on the k-linear fragment."""
import numpy as np
import pytest
from hypothesis import assume, event, given, settings, strategies as st

import maskc
from maskc.errors import MaskError
from conftest import EXAMPLES, EXAMPLE_NAMES, SOUND_ONLY_EXAMPLES, example_params, tile_truth
from mask_strategies import binding, mask_text, tile_shape


def _compile_or_skip(text):
    try:
        return maskc.compile_mask(text)
    except MaskError as err:       # e.g. a mask whose rules normalize to too many regions
        event(f"rejected: {err.message}")
        assume(False)


def _bind(mask, seq_len, kv_len, params):
    try:
        return mask.bind(seq_len=seq_len, kv_len=kv_len, **params)
    except maskc.BindError as err:
        event(f"bind rejected: {err.message}")
        return None


def _check(bound, bm, bn, expect_exact, head=0):
    dense = bound.dense(0, head)
    truth = tile_truth(dense, bm, bn)
    got = bound.tiles(bm, bn)
    assert got.shape == truth.shape
    assert not np.any((got == maskc.FULL) & (truth != maskc.FULL)), "a FULL tile has a hidden pair"
    assert not np.any((got == maskc.EMPTY) & (truth != maskc.EMPTY)), "an EMPTY tile has a visible pair"
    if expect_exact:
        np.testing.assert_array_equal(got, truth)
    return int(((got == maskc.PARTIAL) & (truth != maskc.PARTIAL)).sum())


@given(mask_text(exact=True), binding(), tile_shape)
def test_exact_on_k_linear_masks(text, bind_args, shape):
    mask = _compile_or_skip(text)
    assert mask.exact, f"k-linear mask reported inexact:\n{text}"
    bound = _bind(mask, *bind_args)
    if bound is not None:
        _check(bound, *shape, expect_exact=True)


@given(mask_text(exact=False), binding(), tile_shape)
def test_sound_on_every_mask(text, bind_args, shape):
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is not None:
        _check(bound, *shape, expect_exact=mask.exact)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 300), shape=tile_shape)
def test_examples(name, seed, seq_len, shape):
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    rng = np.random.default_rng(seed)
    bound = mask.bind(seq_len=seq_len, **example_params(name, seq_len, rng))
    # Exact, but for the bit operations of morton_local; one map for every head of a mask that reads h: sound.
    assert mask.exact == (name not in SOUND_ONLY_EXAMPLES)
    exact = mask.exact and not mask.ranges.uses_head
    for head in range(bound.num_heads or 1):
        _check(bound, *shape, expect_exact=exact, head=head)
    assert bound.tile_map(*shape).exact == exact


def test_clear_is_exact_at_the_benchmark_shape():
    """CLEAR reads k through // and % by its width and a square: its keys per row are one interval per image
    row, so its classes are exact (issue 15), on tiles that do and do not line up with the image rows."""
    mask = maskc.load(EXAMPLES / "clear.mask")
    bound = mask.bind(seq_len=2048 + 512, text=512, width=128, radius=16)
    dense = bound.dense()
    for shape in ((128, 128), (64, 64), (128, 80), (192, 128)):
        np.testing.assert_array_equal(bound.tiles(*shape), tile_truth(dense, *shape))
        assert bound.tile_map(*shape).exact


def test_an_opaque_mask_stays_sound_and_says_so():
    mask = maskc.compile_mask("mask m()\n  allow (k - q) * (k + q - 100) < 300\n")
    assert not mask.exact
    bound = mask.bind(seq_len=200)
    assert _check(bound, 16, 16, expect_exact=False) > 0      # some PARTIAL tiles really are full or empty
    assert not bound.tile_map(16, 16).exact


def test_batch_elements_are_classified_independently():
    mask = maskc.load(EXAMPLES / "document.mask")
    bound = mask.bind(seq_len=100, docs=[[50, 50], [10, 90], [100]])
    classes = bound.tile_map(16, 16).classes
    for b in range(3):
        np.testing.assert_array_equal(classes[b], tile_truth(bound.dense(b), 16, 16))


def test_head_dependent_masks_are_sound_for_every_head():
    mask = maskc.compile_mask("mask m()\n  allow k <= q, h < 2\n  allow k <= q - h\n")
    bound = mask.bind(seq_len=64, num_heads=4)
    got = bound.tiles(8, 8)
    for h in range(4):
        truth = tile_truth(bound.dense(0, h), 8, 8)
        assert not np.any((got == 2) & (truth != 2)) and not np.any((got == 0) & (truth != 0))


def test_bit_operations_are_bounded_over_aligned_sub_tiles():
    """Morton order at tiles that are not powers of two (80 keys: 64 + 16; 192 queries: 3 x 64): a tile is
    bounded over its sub-tiles aligned to powers of two, FULL or EMPTY where each of them is; without it,
    1039 PARTIAL tiles at 128 x 80 for 615 really PARTIAL. Sound, and within 3% of the truth."""
    bound = maskc.load(EXAMPLES / "morton_local.mask").bind(seq_len=2 * 4096 + 300, radius=2)
    dense = bound.dense()
    for shape in ((128, 80), (192, 128), (96, 48)):
        got, truth = bound.tiles(*shape), tile_truth(dense, *shape)
        assert not np.any((got != maskc.PARTIAL) & (got != truth)), shape
        assert (got == maskc.PARTIAL).sum() <= 1.03 * (truth == maskc.PARTIAL).sum(), shape


def test_sound_tiles_are_bounded_head_by_head():
    """A block map per head (tables read at an index of k: sound classes): each head's tiles are bounded over
    its own row of the table, so that tiles every head sees whole, or not at all, keep that class; against
    every head's brute-force classes, combined."""
    from maskc.audit import audit_tiles
    rng = np.random.default_rng(7)
    heads, blocks = 3, 8
    block_map = rng.integers(0, 2, (heads, blocks, blocks))
    block_map[:, :, :2] = 1                          # key blocks 0 and 1: seen by every head
    block_map[:, :, 5] = 0                           # key block 5: by none
    mask = maskc.compile_mask("mask m(n: int, map: per h table[n * n])\n"
                              "  allow map[q // 16 * n + k // 16] != 0\n")
    bound = mask.bind(seq_len=16 * blocks, num_heads=heads, n=blocks, map=block_map.reshape(heads, -1).tolist())
    truths = [tile_truth(bound.dense(0, h), 16, 16) for h in range(heads)]
    want = np.where(np.all([t == truths[0] for t in truths], axis=0), truths[0], maskc.PARTIAL)
    np.testing.assert_array_equal(bound.tiles(16, 16), want)
    assert not bound.tile_map(16, 16).exact
    audit = audit_tiles(bound, 16, 16)          # the truth of every head at once, as the classes are
    assert audit == type(audit)(int((want == maskc.PARTIAL).sum()), 0, 0, 0)


def test_visible_pairs_matches_dense():
    mask = maskc.load(EXAMPLES / "shared_prompt.mask")
    bound = mask.bind(seq_len=300, prompt=100, responses=[[50, 150], [200]])
    assert bound.visible_pairs() == int(bound.dense(0).sum() + bound.dense(1).sum())


def test_audit_counts_clear_partial_tiles_that_are_not():
    from maskc.audit import audit_tiles
    bound = maskc.load(EXAMPLES / "clear.mask").bind(seq_len=1000, text=100, width=30, radius=5)
    audit = audit_tiles(bound, 64, 64)
    truth = tile_truth(bound.dense(), 64, 64)
    got = bound.tiles(64, 64)
    assert audit.unsound == 0
    assert audit.partial == int((got == maskc.PARTIAL).sum())
    assert audit.really_full == int(((got == maskc.PARTIAL) & (truth == maskc.FULL)).sum())
    assert audit.really_empty == int(((got == maskc.PARTIAL) & (truth == maskc.EMPTY)).sum())
    assert bound.visible_pairs() == int(bound.dense().sum())


def _classes_in_chunks(mask, bound, shape, chunk_blocks):
    """Classes computed with rows in chunks of ``chunk_blocks`` q_blocks."""
    import maskc.analysis.classify as classify_module
    saved = classify_module._CHUNK_ROWS, classify_module._PIECE_BLOCKS
    classify_module._CHUNK_ROWS, classify_module._PIECE_BLOCKS = chunk_blocks * shape[0], chunk_blocks
    try:
        per_element = [mask.specialized(e.ints) for e in bound.params.batch]   # as the pipeline does
        return classify_module.classify(per_element, bound.params, *shape).classes[0]
    finally:
        classify_module._CHUNK_ROWS, classify_module._PIECE_BLOCKS = saved


@given(mask_text(exact=True), binding(), tile_shape, st.integers(1, 4))
def test_exact_when_rows_are_classified_in_small_chunks(text, bind_args, shape, chunk_blocks):
    """Chunk boundaries (whole q_blocks) must not change any class."""
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is not None:
        got = _classes_in_chunks(mask, bound, shape, chunk_blocks)
        np.testing.assert_array_equal(got, tile_truth(bound.dense(), *shape))


@given(mask_text(exact=False), binding(), tile_shape, st.integers(1, 3))
def test_sound_when_rows_are_classified_in_small_chunks(text, bind_args, shape, chunk_blocks):
    """Chunk boundaries keep an opaque mask's classes sound. They may make them tighter: an opaque region's
    bounds are taken over a chunk's rows, so fewer rows can settle a tile that more leave PARTIAL (hypothesis
    found `allow k < 0` / `allow (k >> (q % 4)) < q` at 17 tokens, 9 x 1 tiles: three tiles FULL in chunks of
    one q_block, PARTIAL whole; FULL is right)."""
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is not None:
        got = _classes_in_chunks(mask, bound, shape, chunk_blocks)
        _check(bound, *shape, expect_exact=False)
        truth = tile_truth(bound.dense(0, 0), *shape)
        assert not np.any((got == maskc.FULL) & (truth != maskc.FULL)), "a FULL tile has a hidden pair"
        assert not np.any((got == maskc.EMPTY) & (truth != maskc.EMPTY)), "an EMPTY tile has a visible pair"


# Masks whose bounds are affine in q between segment boundaries, floor steps and the crossings of min/max
# arguments: the piecewise path's territory (maskc/analysis/pieces.py), regions overlapping and denied.
_Q_PART = st.sampled_from(["q", "-q", "", "docs.start(q)", "docs.end(q)", "sub.start(q)", "a", "c", "t(q)",
                           "docs.length(q)", "seq_len", "min(q, a)", "max(q - c, docs.start(q))",
                           "clamp(q - docs.start(q), 0, t(q)) + docs.start(q)", "(q - a) // 3 + q", "min(q, 2)"])
_ATOM = st.builds(lambda side, op, shift, extra: f"k {op} {side} {'+' if shift >= 0 else '-'} {abs(shift)}"
                  + (f" + {extra}" if extra else ""),
                  _Q_PART.filter(bool), st.sampled_from(["<", "<=", ">", ">=", "=="]), st.integers(-9, 9),
                  st.sampled_from(["", "docs.start(q)", "a", "t(q)"]))
_GUARD = st.sampled_from(["same(docs)", "docs.index(q) >= 1", "a > 3", "t(q) < 5", "true", "same(sub)",
                          "q >= a", "min(q, c) < 7", "q - docs.start(q) <= t(q)"])


@st.composite
def piecewise_mask(draw):
    atoms = draw(st.lists(_ATOM, min_size=1, max_size=3)) + draw(st.lists(_GUARD, max_size=2))
    rule = "deny" if draw(st.integers(0, 3)) == 0 else "allow"
    return f"mask m(a: int, c: int, docs: segments, t: per docs, sub: segments from a)\n  {rule} " + \
        ", ".join(atoms) + "\n"


@given(st.lists(piecewise_mask(), min_size=1, max_size=3), binding(max_len=300), tile_shape)
def test_piecewise_path_is_exact(rules, bind_args, shape):
    """One or more such rules: the piecewise path stays exact (the classes equal the brute-force ones)."""
    from maskc.analysis.pieces import plan_of
    text = rules[0].replace("  deny ", "  allow ") + "".join(r.split("\n", 1)[1] for r in rules[1:])
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is None:
        return
    special = mask.specialized(bound.params.batch[0].ints)
    event(f"piecewise path taken: {special.linear and plan_of(special.allow, special.deny) is not None}")
    _check(bound, *shape, expect_exact=True)


_HEAD_RULES = st.sampled_from(["k <= q + h", "k >= q - 2 * h", "k <= q, k >= q - h - 1", "k == h", "q - k <= a * h",
                               "k < docs.start(q) + h", "same(docs), k <= q - h"])


@given(st.lists(_HEAD_RULES, min_size=1, max_size=2), binding(max_len=120), tile_shape, st.integers(1, 4))
def test_heads_agree_on_runs(rules, bind_args, shape, heads):
    """A mask that reads h: each head classified exactly, then a tile keeps its class where every head gives
    it, PARTIAL elsewhere: against the same combination of every head's brute-force classes."""
    text = "mask m(a: int, c: int, docs: segments, t: per docs, sub: segments from a)\n" + "".join(
        f"  allow {r}\n" for r in rules)
    mask = _compile_or_skip(text)
    seq_len, kv_len, params = bind_args
    try:
        bound = mask.bind(seq_len=seq_len, kv_len=kv_len, num_heads=heads, **params)
    except maskc.BindError:
        return
    for b in range(bound.batch):
        truths = [tile_truth(bound.dense(b, h), *shape) for h in range(heads)]
        want = np.where(np.all([t == truths[0] for t in truths], axis=0), truths[0], maskc.PARTIAL)
        np.testing.assert_array_equal(bound.tile_map(*shape).classes[b], want)


@settings(max_examples=200)
@given(piecewise_mask(), piecewise_mask(), st.lists(_ATOM | _GUARD, max_size=2), st.lists(st.integers(-3, 3), min_size=1),
       binding(max_len=120))
def test_regions_found_inside_others_are_inside(rule, other, extra, shifts, bind_args):
    """The piece path drops a region whose forms show it inside another (pieces._inside): wherever it says so,
    every row's keys of the one are keys of the other (per-row intervals, brute force over the rows). The
    regions: a rule's, the same rule with more atoms (often inside it), the rule with its constants moved (one
    way or the other), another rule's."""
    import itertools
    import re

    from maskc.analysis.intervals import region_rows
    from maskc.analysis.pieces import _inside
    from maskc.analysis.rows import RowValues
    rule, other = (r.replace("  deny ", "  allow ") for r in (rule, other))
    tighter = rule.rstrip("\n") + "".join(f", {a}" for a in extra) + "\n"
    moves = itertools.cycle(shifts)
    moved = re.sub(r"(?<=[ (])(\d)\b", lambda m: str(int(m.group(1)) + next(moves) + 3), rule)
    text = rule + "".join("  allow " + r.split("allow ", 1)[1] for r in (tighter, moved, other))
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is None:
        return
    special = mask.specialized(bound.params.batch[0].ints)
    assume(special.linear)
    rows = RowValues(bound.params.batch[0], bound.seq_len, bound.kv_len, 0, 0, np.arange(bound.seq_len))
    for inner in special.allow:
        for outer in special.allow:
            if inner is outer or not _inside(inner, outer):
                continue
            event("a region inside another")
            (i_lo, i_hi), (o_lo, o_hi) = region_rows(inner, rows, bound.kv_len), region_rows(outer, rows, bound.kv_len)
            seen = i_lo < i_hi
            assert np.all((o_lo[seen] <= i_lo[seen]) & (i_hi[seen] <= o_hi[seen]))


@pytest.mark.parametrize("cells", [None, 0])
@settings(max_examples=300)      # about one draw in ten has q_blocks whose hulls do not chain
@given(text=st.one_of(mask_text(exact=True), st.lists(piecewise_mask(), min_size=1, max_size=3).map(
    lambda rules: rules[0] + "".join(r.split("\n", 1)[1] for r in rules[1:]))), bind_args=binding(max_len=300),
       shape=tile_shape)
def test_exact_where_slot_hulls_do_not_chain(cells, text, bind_args, shape):
    """runs_of_keys counts the keys of the q_blocks where per-slot hulls do not chain, on rows of counters up
    to tiles.ROW_COUNT_CELLS of them and by sorting past it (cells=0): the classes stay the brute-force ones."""
    import maskc.analysis.tiles as tiles_module
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is None:
        return
    saved = tiles_module.ROW_COUNT_CELLS
    tiles_module.ROW_COUNT_CELLS = saved if cells is None else cells
    try:
        got = _classes_in_chunks(mask, bound, shape, 1 << 20)
    finally:
        tiles_module.ROW_COUNT_CELLS = saved
    np.testing.assert_array_equal(got, tile_truth(bound.dense(), *shape))


@st.composite
def _affine_slots(draw):
    """Coarse pieces of ``[0, end)`` and, per slot, ends affine on each piece with slope -1, 0 or 1 (or NONE at
    both rows: empty there), as (lo, hi) at the pieces' first then last rows; finer starts containing the pieces'."""
    from maskc.analysis.intervals import NONE
    end = draw(st.integers(1, 200))
    pieces = np.array(sorted({0} | set(draw(st.lists(st.integers(0, end - 1), max_size=8)))), np.int64)
    starts = np.array(sorted(set(pieces.tolist()) | set(draw(st.lists(st.integers(0, end - 1), max_size=12)))),
                      np.int64)
    span = np.append(pieces[1:], end) - 1 - pieces
    slots = []
    for _ in range(draw(st.integers(1, 3))):
        ends = []
        for _ in range(2):
            at0 = np.array(draw(st.lists(st.integers(-50, 50), min_size=len(pieces), max_size=len(pieces))), np.int64)
            slope = np.array(draw(st.lists(st.integers(-1, 1), min_size=len(pieces), max_size=len(pieces))), np.int64)
            ends.append((at0, slope))
        empty = np.array(draw(st.lists(st.booleans(), min_size=len(pieces), max_size=len(pieces))))
        slots.append(tuple(np.concatenate([np.where(empty, NONE, a), np.where(empty, NONE, a + s * span)])
                           for a, s in ends))
    return slots, pieces, end, starts


@given(_affine_slots())
def test_slots_at_cuts_are_the_slot_ends_at_each_row(case):
    """pieces.slots_at_cuts: every slot end at a finer piece's first and last rows is the coarse piece's end
    extrapolated along its slope, computed here row by row from the coarse piece's first row (brute force),
    and an empty slot stays NONE."""
    from maskc.analysis.pieces import slots_at_cuts
    slots, pieces, end, starts = case
    n, m = len(pieces), len(starts)
    lasts = np.append(starts[1:], end) - 1
    got = slots_at_cuts(np.array([x for slot in slots for x in slot]), pieces, end, starts)
    assert len(got) == len(slots)
    for (lo, hi), (g_lo, g_hi, g_lo_b, g_hi_b) in zip(slots, got):
        for x, at_first, at_last in ((lo, g_lo, g_lo_b), (hi, g_hi, g_hi_b)):
            for i in range(m):
                p = int(np.searchsorted(pieces, starts[i], side="right")) - 1
                last = (pieces[p + 1] if p + 1 < n else end) - 1
                slope = 0 if last == pieces[p] else (int(x[n + p]) - int(x[p])) // (int(last) - int(pieces[p]))
                assert at_first[i] == x[p] + slope * (starts[i] - pieces[p])
                assert at_last[i] == x[p] + slope * (lasts[i] - pieces[p])


def _exact_with_pieces_setting(name: str, value: int, rules, bind_args, shape):
    """The piecewise path's classes are the brute-force ones for ``rules`` (their first an allow) with the
    setting ``name`` of maskc.analysis.pieces set to ``value`` (a choice of path, forced)."""
    import maskc.analysis.pieces as pieces_module
    text = rules[0].replace("  deny ", "  allow ") + "".join(r.split("\n", 1)[1] for r in rules[1:])
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is None:
        return
    saved = getattr(pieces_module, name)
    setattr(pieces_module, name, value)
    try:
        _check(bound, *shape, expect_exact=True)
    finally:
        setattr(pieces_module, name, saved)


@pytest.mark.parametrize("pair_pieces", [0, 1 << 30])
@settings(max_examples=150)
@given(st.lists(piecewise_mask(), min_size=2, max_size=3), binding(max_len=300), tile_shape)
def test_refine_finds_the_same_cuts_with_and_without_the_order_prefilter(pair_pieces, rules, bind_args, shape):
    """pieces._refine looks first for the pieces where the forms' order changes when pairs x pieces pass
    _PAIR_PIECES (0: always; 2**30: never): either way the piecewise path's classes are the brute-force ones."""
    _exact_with_pieces_setting("_PAIR_PIECES", pair_pieces, rules, bind_args, shape)


@settings(max_examples=150)
@given(st.lists(piecewise_mask(), min_size=1, max_size=3), binding(max_len=120))
def test_piece_plan_intervals_are_the_regions_rows(rules, bind_args):
    """PiecePlan.intervals (one take of every region's bounds and guards) at every row: each region's interval
    as intervals.region_rows computes it row by row (RowValues), NONE where unseen."""
    from maskc.analysis.formprog import Env
    from maskc.analysis.intervals import region_rows
    from maskc.analysis.pieces import plan_of
    from maskc.analysis.rows import RowValues
    text = rules[0].replace("  deny ", "  allow ") + "".join(r.split("\n", 1)[1] for r in rules[1:])
    mask = _compile_or_skip(text)
    bound = _bind(mask, *bind_args)
    if bound is None:
        return
    params = bound.params.batch[0]
    special = mask.specialized(params.ints)
    plan = plan_of(special.allow, special.deny) if special.linear else None
    assume(plan is not None)
    q = np.arange(bound.seq_len, dtype=np.int64)
    lo, hi = plan.intervals(plan.values(Env(params, bound.seq_len, bound.kv_len, 0, 0, q), bound.kv_len))
    rows = RowValues(params, bound.seq_len, bound.kv_len, 0, 0, q)
    for r, region in enumerate(plan.allow + plan.deny):
        want_lo, want_hi = region_rows(region, rows, bound.kv_len)
        np.testing.assert_array_equal(lo[r], want_lo)
        np.testing.assert_array_equal(hi[r], want_hi)


@pytest.mark.parametrize("union_before_cuts", [-1, 1 << 30])
@settings(max_examples=150)
@given(st.lists(piecewise_mask(), min_size=2, max_size=3), binding(max_len=300), tile_shape)
def test_piecewise_path_is_exact_unioning_before_or_after_the_q_block_cuts(union_before_cuts, rules, bind_args, shape):
    """runs_from_pieces unions the regions at the refined pieces and extrapolates the slots to the q_block cuts
    (pieces.slots_at_cuts) where the cuts add more than _UNION_BEFORE_CUTS pieces, else unions at every piece:
    forced each way (-1: always before, 2**30: never), the classes are the brute-force ones."""
    _exact_with_pieces_setting("_UNION_BEFORE_CUTS", union_before_cuts, rules, bind_args, shape)
