"""Table parameters (``t: table``, read ``t[i]``) and per-head parameters (``w: per h``, read ``w``): resolve's
errors, bind's checks (lengths, indices proved in range, naming the table), and every consumer of a bound
mask (dense reference, classification, the g++-compiled predicate, Flex) against numpy written from the
definition."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.explain import ranges_text

from conftest import tile_truth
from host_cxx import needs_gxx
from test_predicate import check_bound


def _sound(bound, bm, bn, heads=(0,)):
    got = bound.tiles(bm, bn)
    for h in heads:
        truth = tile_truth(bound.dense(0, h), bm, bn)
        assert not np.any((got != maskc.PARTIAL) & (got != truth)), f"unsound class at head {h}"
    return got


# -- per h ------------------------------------------------------------------------------------------

def test_per_head_parameter_is_this_heads_value():
    mask = maskc.compile_mask("mask m(w: per h, lag: per h = 0)\n  allow k <= q - lag, q - k < w\n")
    assert mask.ranges.uses_head and mask.exact
    windows, lags = [1, 3, 7], [0, 2, 1]
    bound = mask.bind(30, num_heads=3, w=windows, lag=lags)
    q, k = np.arange(30)[:, None], np.arange(30)[None, :]
    for h in range(3):
        np.testing.assert_array_equal(bound.dense(0, h), (k <= q - lags[h]) & (q - k < windows[h]))
    _sound(bound, 4, 4, heads=range(3))
    defaults = mask.bind(30, num_heads=2, w=[2, 2])
    np.testing.assert_array_equal(defaults.dense(0, 1), (k <= q) & (q - k < 2))


def test_per_head_values_per_batch_element():
    mask = maskc.compile_mask("mask m(w: per h)\n  allow k <= q, q - k < w\n")
    bound = mask.bind(10, num_heads=2, w=[[1, 2], [5, 10]])
    assert bound.batch == 2
    q, k = np.arange(10)[:, None], np.arange(10)[None, :]
    np.testing.assert_array_equal(bound.dense(1, 0), (k <= q) & (q - k < 5))
    classes = bound.tile_map(2, 2).classes
    for b in range(2):
        for h in range(2):
            truth = tile_truth(bound.dense(b, h), 2, 2)
            assert not np.any((classes[b] != maskc.PARTIAL) & (classes[b] != truth))


@pytest.mark.parametrize("values,match", [
    ({"w": [1, 2]}, "num_heads"),                                           # the mask reads h
    ({"w": [1, 2], "num_heads": 3}, "'w' has 2 entries, one per head, but num_heads = 3"),
    ({"w": [1, 2.5], "num_heads": 2}, "list of integers"),
    ({"w": [1, 2 ** 31], "num_heads": 2}, "32 bits"),
    ({"num_heads": 2}, "needs 'w' .one integer per head."),
])
def test_per_head_bind_errors(values, match):
    mask = maskc.compile_mask("mask m(w: per h)\n  allow k <= q, q - k < w\n")
    with pytest.raises(maskc.BindError, match=match) as err:
        mask.bind(10, **values)
    assert err.value.span is not None and err.value.span.line == 1


def test_per_h_in_the_grammar_needs_no_segments_named_h():
    """'per h' used to reach the 'per SEG' rule and fail for want of segments named h."""
    with pytest.raises(maskc.MaskError) as err:
        maskc.compile_mask("mask m(t: per hh)\n  allow k <= q\n")
    assert "per h" in (err.value.hint or "")


# -- table ------------------------------------------------------------------------------------------

MEDIA = "mask m(img_len: int, first: table)\n  allow k < q, q >= first[k // img_len]\n"


def media_reference(seq_len, img_len, first):
    q, k = np.arange(seq_len)[:, None], np.arange(seq_len)[None, :]
    owner = np.asarray(first)[np.arange(seq_len) // img_len]
    return (k < q) & (q >= owner[None, :])


def test_table_read_at_an_index_of_k():
    mask = maskc.compile_mask(MEDIA)
    assert not mask.exact and not mask.ranges.uses_head
    bound = mask.bind(40, img_len=8, first=[3, 10, 9, 30, 35])
    np.testing.assert_array_equal(bound.dense(), media_reference(40, 8, [3, 10, 9, 30, 35]))
    _sound(bound, 8, 8)
    assert "first[J1]: a table entry at an index that depends on J1 (where J1 = (k) // img_len)" in \
        ranges_text(mask.ranges)


def test_table_entry_that_bounds_k_within_a_chunk_is_exact():
    """Within a chunk of d keys, t[k // d] is one number: k <= q - t[k // d] is an interval per chunk."""
    mask = maskc.compile_mask("mask m(d: int, t: table)\n  allow k <= q - t[k // d]\n")
    assert mask.exact
    t = [0, 3, -2, 5, 1, 0, 2]
    bound = mask.bind(24, d=4, t=t)
    q, k = np.arange(24)[:, None], np.arange(24)[None, :]
    np.testing.assert_array_equal(bound.dense(), k <= q - np.asarray(t)[k // 4])
    assert bound.tile_map(3, 5).exact
    np.testing.assert_array_equal(bound.tiles(3, 5), tile_truth(bound.dense(), 3, 5))


def test_table_read_at_an_index_of_q_is_exact():
    mask = maskc.compile_mask("mask m(start: table)\n  allow start[q // 4] <= k <= q\n")
    assert mask.exact
    bound = mask.bind(16, start=[0, 2, 8, 8])
    q, k = np.arange(16)[:, None], np.arange(16)[None, :]
    np.testing.assert_array_equal(bound.dense(), (np.asarray([0, 2, 8, 8])[q // 4] <= k) & (k <= q))
    np.testing.assert_array_equal(bound.tiles(3, 5), tile_truth(bound.dense(), 3, 5))


def test_index_out_of_range_is_refused_naming_the_table():
    mask = maskc.compile_mask(MEDIA)
    with pytest.raises(maskc.BindError) as err:
        mask.bind(40, img_len=8, first=[3, 10, 9, 30])           # k // 8 reaches 4
    assert "table 'first'" in err.value.message and "reach 4" in err.value.message and "4 entries" in err.value.message
    assert err.value.span.line == 2
    clamped = maskc.compile_mask("mask m(img_len: int, first: table)\n"
                                 "  allow k < q, q >= first[clamp(k // img_len, 0, 3)]\n")
    clamped.bind(40, img_len=8, first=[3, 10, 9, 30])            # the index proved in range: accepted
    with pytest.raises(maskc.BindError, match="table 'first' is empty"):
        mask.bind(40, img_len=8, first=[])
    with pytest.raises(maskc.BindError, match="can reach -1"):
        maskc.compile_mask("mask m(t: table)\n  allow t[k - 1] < q\n").bind(5, t=[0] * 5)


@pytest.mark.parametrize("text,match", [
    ("mask m(t: table = 3)\n  allow k <= q\n", "a table takes no default"),
    ("mask m(n: int)\n  allow n[q] <= k\n", "'n' is a int parameter, not a table"),
    ("mask m(t: table)\n  allow t(q) <= k\n", "cannot be called"),
    ("mask m(t: table)\n  allow t <= k\n", "is a table parameter, not a number"),
    ("mask m(t: table, s: segments from t[0])\n  allow same(s)\n", "where segments start"),
    ("mask m(w: per h, s: segments from w)\n  allow same(s)\n", "where segments start"),
    ("mask m()\n  allow zz[q] <= k\n", "'zz' is not a parameter"),
])
def test_resolve_errors(text, match):
    with pytest.raises(maskc.MaskError, match=match):
        maskc.compile_mask(text)


def test_tables_pass_through_mask_calls():
    text = ("mask inner(t: table, w: per h)\n  allow t[q % 2] <= k <= q, q - k < w\n"
            "mask outer(a: table, c: per h)\n  allow inner(a, c)\n"
            "mask wrong(a: per h)\n  allow inner(a, a)\n")
    bound = maskc.compile_mask(text, "outer").bind(12, num_heads=2, a=[0, 3], c=[2, 5])
    q, k = np.arange(12)[:, None], np.arange(12)[None, :]
    np.testing.assert_array_equal(bound.dense(0, 1), (np.asarray([0, 3])[q % 2] <= k) & (k <= q) & (q - k < 5))
    with pytest.raises(maskc.MaskError, match="is table: pass a table parameter"):
        maskc.compile_mask(text, "wrong")


def test_cli_reads_tables_as_comma_lists(tmp_path):
    from click.testing import CliRunner
    from maskc.cli import cli
    path = tmp_path / "m.mask"
    path.write_text(MEDIA)
    result = CliRunner().invoke(cli, ["explain", str(path), "--seq-len", "40", "--param", "img_len=8",
                                      "--param", "first=3,10,9,30,35"])
    assert result.exit_code == 0, result.output
    assert "first: 5 entries [3, 10, 9, 30, 35]" in result.output


# -- random tables and indices -------------------------------------------------------------------------

INDICES = ["k // d", "q // d", "(q + k) % n", "(k ^ q) & 7", "clamp(k - q, 0, n - 1)", "h", "abs(q - k) % n",
           "min(k, n - 1)", "t[q % n] % n", "q // d + k // d", "q % 2 + k % 2 * 2 + h"]


@st.composite
def table_case(draw):
    """A mask reading a table at a random index expression, with values that keep the index in range."""
    index = draw(st.sampled_from(INDICES))
    form = draw(st.sampled_from(["t[{i}] <= q - k", "k + t[{i}] >= q", "t[{i}] == k % 3", "(t[{i}] & k) == 0"]))
    seq_len, d = draw(st.integers(1, 40)), draw(st.integers(1, 8))
    heads = draw(st.integers(1, 3))
    n = max(8, heads, -(-seq_len // d) + 1, 2 * seq_len)
    values = draw(st.lists(st.integers(-3, 12), min_size=n, max_size=n))
    text = f"mask m(d: int, n: int, t: table)\n  allow {form.format(i=index)}, k <= q + 2\n"
    return text, seq_len, heads, {"d": d, "n": n, "t": values}, index, form


def table_reference(seq_len, head, p, index, form):
    """The mask, pair by pair, in Python."""
    t, d, n = p["t"], p["d"], p["n"]
    out = np.zeros((seq_len, seq_len), bool)
    for q in range(seq_len):
        for k in range(seq_len):
            i = eval(index.replace("clamp(k - q, 0, n - 1)", "min(max(k - q, 0), n - 1)"),
                     {"abs": abs, "min": min, "max": max, "t": t},
                     {"q": q, "k": k, "d": d, "n": n, "h": head})
            v = t[i]
            hold = {"t[{i}] <= q - k": v <= q - k, "k + t[{i}] >= q": k + v >= q, "t[{i}] == k % 3": v == k % 3,
                    "(t[{i}] & k) == 0": (v & k) == 0}[form]
            out[q, k] = hold and k <= q + 2
    return out


@settings(max_examples=150, deadline=None)
@given(case=table_case(), bm=st.integers(1, 9), bn=st.integers(1, 9))
def test_random_table_reads_match_python_and_tiles_are_sound(case, bm, bn):
    text, seq_len, heads, params, index, form = case
    mask = maskc.compile_mask(text)
    bound = mask.bind(seq_len, num_heads=heads if mask.ranges.uses_head else None, **params)   # indices in range
    for h in range(bound.num_heads or 1):
        np.testing.assert_array_equal(bound.dense(0, h), table_reference(seq_len, h, params, index, form))
    _sound(bound, bm, bn, heads=range(bound.num_heads or 1))
    if bound.tile_map(bm, bn).exact:       # (t[k // d] at d = 1 is t[k]: exact for the mask, not this binding)
        np.testing.assert_array_equal(bound.tiles(bm, bn), tile_truth(bound.dense(), bm, bn))


def test_block_map_tiles_are_bounded_row_by_row():
    """A 2-D block map read at (q // 16, k // 16) on tiles of 32 x 32 (two rows and two columns of it): each
    tile bounded over its four entries, not over the run of entries between them, is classified exactly."""
    rng = np.random.default_rng(3)
    n = 9
    block_map = rng.integers(0, 2, (n, n))
    block_map[::2] = 0                              # whole rows hidden: tiles EMPTY only if the bound is per row
    mask = maskc.compile_mask("mask m(n: int, map: table[n, n])\n  allow map[q // 16, k // 16] != 0\n")
    bound = mask.bind(16 * n, n=n, map=block_map.tolist())
    q, k = np.arange(16 * n)[:, None], np.arange(16 * n)[None, :]
    np.testing.assert_array_equal(bound.dense(), block_map[q // 16, k // 16] != 0)
    assert not bound.tile_map(32, 32).exact
    for bm, bn in ((32, 32), (48, 32), (32, 48), (20, 20)):
        np.testing.assert_array_equal(bound.tiles(bm, bn), tile_truth(bound.dense(), bm, bn))


def test_entries_read_at_a_floor_of_k_are_bounded_chunk_by_chunk():
    """Flamingo's media intervals: keys in images of 100 tokens, q sees image i when first[i] <= q < stop[i].
    A tile of 128 keys holds parts of two or three images; bounded image by image (sub-tiles cut where k // 100
    steps), not over the tile (where first's least and stop's greatest join images that no row sees both
    of), the classes are the truth."""
    rng = np.random.default_rng(1)
    seq_len, img, n = 1000, 100, 12
    first = rng.integers(0, seq_len, n)
    stop = first + rng.integers(0, 400, n)
    mask = maskc.compile_mask("mask m(img: int, first: table, stop: table)\n"
                              "  allow q >= first[k // img], q < stop[k // img]\n")
    bound = mask.bind(seq_len, kv_len=n * img, img=img, first=first.tolist(), stop=stop.tolist())
    q, k = np.arange(seq_len)[:, None], np.arange(n * img)[None, :]
    np.testing.assert_array_equal(bound.dense(), (q >= first[k // img]) & (q < stop[k // img]))
    assert not bound.tile_map(128, 128).exact
    for bm, bn in ((128, 128), (64, 64), (128, 80), (50, 30)):
        np.testing.assert_array_equal(bound.tiles(bm, bn), tile_truth(bound.dense(), bm, bn))


def test_small_grids_bound_a_table_row_by_row():
    """An ancestor matrix read at (q, k - prefix), one row of it per query: on a grid of few tiles each row's
    entries are bounded over the tile's keys, so that tiles above the diagonal (no query has an ancestor after
    it) are EMPTY, not PARTIAL: the classes are the truth, while lint still calls them sound."""
    rng = np.random.default_rng(5)
    n, prefix = 300, 70
    anc = np.eye(n, dtype=int)
    for i in range(1, n):
        anc[i] |= anc[int(rng.integers(max(0, i - 6), i))]
    mask = maskc.compile_mask("mask m(p: int, anc: table[seq_len, seq_len])\n"
                              "  allow k < p\n  allow k >= p, anc[q, clamp(k - p, 0, seq_len - 1)] != 0\n")
    bound = mask.bind(n, kv_len=prefix + n, p=prefix, anc=anc.tolist())
    q, k = np.arange(n)[:, None], np.arange(prefix + n)[None, :]
    np.testing.assert_array_equal(bound.dense(), (k < prefix) | (anc[q, np.clip(k - prefix, 0, n - 1)] != 0))
    assert not bound.tile_map(64, 64).exact
    for bm, bn in ((64, 64), (128, 80), (50, 70)):
        np.testing.assert_array_equal(bound.tiles(bm, bn), tile_truth(bound.dense(), bm, bn))


@needs_gxx
@pytest.mark.parametrize("text,values", [
    (MEDIA, {"img_len": 8, "first": [3, 10, 9, 30, 35]}),
    ("mask m(w: per h, t: table)\n  allow k <= q, q - k < w + t[k % 3]\n", {"num_heads": 3, "w": [1, 4, 9],
                                                                               "t": [0, 2, -1]}),
    ("mask m(docs: segments, w: per h, t: table)\n  allow same(docs), t[docs.index(q)] <= k - docs.start(q) < w\n",
     {"num_heads": 2, "docs": [7, 20, 13], "w": [3, 40], "t": [0, 4, 1]}),
])
def test_predicate_reads_tables(text, values):
    """The generated C (g++) reads each table from mask_data, per head, as dense() does."""
    compiled = maskc.compile_mask(text)
    bound = compiled.bind(40, **values)
    check_bound(compiled, bound, heads=range(bound.num_heads or 1))


def test_flex_mask_mod_reads_tables_per_head_and_batch_element():
    torch = pytest.importorskip("torch")
    mask = maskc.compile_mask("mask m(w: per h, t: table)\n  allow k <= q, q - k < w + t[k % 3]\n")
    bound = mask.bind(20, num_heads=2, w=[[1, 4], [2, 6]], t=[[0, 1, 2], [5, 0, 0, 7]])
    mod = bound.flex_mask_mod()
    q, k = torch.arange(20)[:, None], torch.arange(20)[None, :]
    for b in range(2):
        for h in range(2):
            got = mod(torch.tensor(b), torch.tensor(h), q, k)
            np.testing.assert_array_equal(np.broadcast_to(got.numpy(), (20, 20)), bound.dense(b, h))
