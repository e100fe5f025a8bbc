"""Segments over the keys (``images: segments over k``, ``same(text, images)``) and tables with declared sizes
and two indices (``anc: table[n, n]``, ``t: per h table[n]``): every consumer of a bound mask (dense reference,
tiles, the g++-compiled predicate, Flex) against numpy written from the definition, and lint's compile-time
reports of what bind would refuse."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.lint import lint_file

from conftest import tile_truth
from host_cxx import needs_gxx
from test_predicate import check_bound

CROSS = "mask m(text: segments, images: segments over k)\n  allow same(text, images)\n"
CROSS_MORE = ("mask m(text: segments, images: segments over k, w: int)\n"
              "  allow same(text, images), k - images.start(k) < w\n"
              "  deny not same(text, images), k < 3\n"
              "  allow images.index(k) == text.index(q) + 1, k >= images.end(k) - w\n")


def _index(lengths, origin, n):
    out = np.full(n, -1)
    at = origin
    for i, length in enumerate(lengths):
        out[at:at + length] = i
        at += length
    return out


def cross_reference(seq_len, kv_len, text, images, w=None, more=False):
    """Brute force over (q, k) from the segment numbers of each position."""
    tq, ik = _index(text, 0, seq_len), _index(images, 0, kv_len)
    start = {i: sum(images[:i]) for i in range(len(images))}
    out = np.zeros((seq_len, kv_len), bool)
    for q in range(seq_len):
        for k in range(kv_len):
            same = tq[q] >= 0 and tq[q] == ik[k]
            if not more:
                out[q, k] = same
                continue
            first = same and k - start[ik[k]] < w
            denied = (not same) and k < 3
            third = ik[k] >= 0 and ik[k] == tq[q] + 1 and k >= start[ik[k]] + images[ik[k]] - w
            out[q, k] = (first or third) and not denied
    return out


@st.composite
def cross_case(draw):
    seq_len, kv_len = draw(st.integers(1, 40)), draw(st.integers(1, 40))
    def split(total):
        cuts = sorted(draw(st.lists(st.integers(0, total), max_size=5)))
        return [b - a for a, b in zip([0] + cuts, cuts + [total])]
    return seq_len, kv_len, split(seq_len), split(kv_len), draw(st.integers(0, 12))


@settings(max_examples=120, deadline=None)
@given(case=cross_case(), more=st.booleans(), bm=st.integers(1, 9), bn=st.integers(1, 9))
def test_same_across_query_and_key_segments(case, more, bm, bn):
    seq_len, kv_len, text, images, w = case
    mask = maskc.compile_mask(CROSS_MORE if more else CROSS)
    bound = mask.bind(seq_len, kv_len=kv_len, text=text, images=images, **({"w": w} if more else {}))
    want = cross_reference(seq_len, kv_len, text, images, w, more)
    np.testing.assert_array_equal(bound.dense(), want)
    got, truth = bound.tiles(bm, bn), tile_truth(want, bm, bn)
    assert not np.any((got != maskc.PARTIAL) & (got != truth))
    if not more:       # one interval of keys per row: exact
        assert mask.exact
        np.testing.assert_array_equal(got, truth)


def test_more_text_runs_than_images_see_nothing():
    bound = maskc.compile_mask(CROSS).bind(6, kv_len=4, text=[2, 2, 2], images=[1, 3])
    np.testing.assert_array_equal(bound.dense(), cross_reference(6, 4, [2, 2, 2], [1, 3]))
    assert not bound.dense()[4:].any()


def test_segments_over_k_bind_to_kv_len_and_hint_the_side():
    mask = maskc.compile_mask(CROSS)
    with pytest.raises(maskc.BindError, match=r"must cover \[0, 8\) \(the keys"):
        mask.bind(5, kv_len=8, text=[5], images=[5])
    wrong = maskc.compile_mask("mask m(text: segments, images: segments)\n  allow same(text, images)\n")
    with pytest.raises(maskc.BindError) as err:
        wrong.bind(5, kv_len=8, text=[5], images=[3, 5])
    assert "segments over k" in err.value.hint
    with pytest.raises(maskc.MaskError, match="over q .* or k"):
        maskc.compile_mask("mask m(s: segments over h)\n  allow same(s)\n")


def test_lint_reports_segments_read_on_the_other_side(tmp_path):
    path = tmp_path / "m.mask"
    path.write_text("mask m(text: segments, images: segments)\n  allow same(text, images)\n"
                    "mask n(a: segments over k)\n  allow a.start(q) <= k\n")
    found = [d for d in lint_file(path) if "partition" in d.message]
    assert [(d.line, d.col) for d in found] == [(1, 24), (3, 8)]
    assert "segments over k" in found[0].hint and "only at k" in found[0].message
    assert "only at q" in found[1].message
    path.write_text(CROSS)
    assert not lint_file(path)


@needs_gxx
@pytest.mark.parametrize("text,values", [
    (CROSS, {"text": [3, 0, 17, 20], "images": [9, 30, 11]}),
    (CROSS_MORE, {"text": [13, 27], "images": [25, 25], "w": 4}),
    ("mask m(lead: int, t: segments from lead, i: segments over k from lead)\n"
     "  allow same(t, i), i.length(k) - (k - i.start(k)) > 2\n",
     {"lead": 6, "t": [10, 24], "i": [20, 24]}),
])
def test_predicate_looks_keys_up_in_their_segments(text, values):
    """The generated C (g++) against dense(), at kv_len != seq_len."""
    compiled = maskc.compile_mask(text)
    check_bound(compiled, compiled.bind(40, kv_len=50, **values))


# -- tables with declared sizes and two indices ----------------------------------------------------

TREE = ("mask m(anc: table[seq_len, seq_len])\n  let p0 = kv_len - seq_len\n"
        "  allow k < p0\n  allow k >= p0, anc[q, clamp(k - p0, 0, seq_len - 1)] != 0\n")
PER_HEAD = "mask m(n: int, off: per h table[n])\n  allow k <= q, q - k <= off[q % n]\n"


def test_two_indices_read_row_major_and_are_proved_per_index():
    anc = np.random.default_rng(1).integers(0, 2, (6, 6))
    bound = maskc.compile_mask(TREE).bind(6, kv_len=9, anc=anc)
    q, k = np.arange(6)[:, None], np.arange(9)[None, :]
    want = (k < 3) | ((k >= 3) & (anc[q, np.clip(k - 3, 0, 5)] != 0))
    np.testing.assert_array_equal(bound.dense(), want)
    bad = maskc.compile_mask("mask m(t: table[seq_len, 3])\n  allow t[q, k] != 0\n")
    with pytest.raises(maskc.BindError, match="second index of table 't' .* can reach 4, but 't' has 3 columns"):
        bad.bind(4, kv_len=5, t=[[1, 1, 1]] * 4)
    with pytest.raises(maskc.BindError, match="rows of 't' differ in length"):
        bad.bind(2, kv_len=3, t=[[1, 1, 1], [1]])
    with pytest.raises(maskc.BindError, match=r"'t' must be a list of rows \(lists of integers\), got a list of int"):
        bad.bind(2, kv_len=3, t=[1, 1, 1, 1, 1, 1])        # flattened: it said 'must be a list of integers'
    with pytest.raises(maskc.BindError, match=r"'off' must be a list of rows \(lists of integers\), one per head"):
        maskc.compile_mask(PER_HEAD).bind(12, num_heads=2, n=3, off=[0, 1, 2])
    with pytest.raises(maskc.BindError, match="declared with size"):
        maskc.compile_mask("mask m(n: int, t: table[n])\n  allow t[0] <= k\n").bind(2, n=0, t=[1])


def test_per_head_table_reads_this_heads_row():
    off = [[0, 1, 2], [3, 0, 0]]
    bound = maskc.compile_mask(PER_HEAD).bind(12, num_heads=2, n=3, off=off)
    q, k = np.arange(12)[:, None], np.arange(12)[None, :]
    for h in range(2):
        np.testing.assert_array_equal(bound.dense(0, h), (k <= q) & (q - k <= np.asarray(off[h])[q % 3]))
    with pytest.raises(maskc.BindError, match="'off' has 2 rows, one per head, but num_heads = 3"):
        maskc.compile_mask(PER_HEAD).bind(12, num_heads=3, n=3, off=off)


@pytest.mark.parametrize("text,match", [
    ("mask m(t: table[seq_len, seq_len])\n  allow t[q] <= k\n", "'t' takes 2 indices, got 1"),
    ("mask m(t: table)\n  allow t[q, k] <= k\n", "'t' takes 1 index, got 2"),
    ("mask m(t: per h table)\n  allow t[q] <= k\n", "needs its length declared"),
    ("mask m(t: table[q])\n  allow t[0] <= k\n", "a table's size reads"),
    ("mask m(t: table[2, 2, 2])\n  allow t[0, 0, 0] <= k\n", "one or two indices"),
])
def test_table_declaration_errors(text, match):
    with pytest.raises(maskc.MaskError, match=match):
        maskc.compile_mask(text)


def test_lint_proves_indices_against_declared_sizes(tmp_path):
    path = tmp_path / "m.mask"
    path.write_text(TREE.replace("mask m", "mask a") + "mask b(t: table[seq_len])\n  allow t[k] <= q\n"
                    "mask c(t: table[seq_len])\n  require kv_len <= seq_len\n  allow t[k] <= q\n"
                    "mask d(n: int, t: table[n])\n  allow t[q - 1] <= k\n")
    ranges = sorted((d.line, d.message) for d in lint_file(path) if "bind refuses" in d.message)
    assert [line for line, _ in ranges] == [6, 11, 11]       # a (clamped) and c (required) are proved
    assert "can reach kv_len - 1, past the last entry seq_len - 1" in ranges[0][1]
    assert any("can be as low as -1" in m for _, m in ranges[1:])
    assert any("can reach seq_len - 2, past the last entry n - 1" in m for _, m in ranges[1:])


@needs_gxx
@pytest.mark.parametrize("text,values", [
    (TREE, {"anc": np.random.default_rng(2).integers(0, 3, (40, 40))}),
    (PER_HEAD, {"num_heads": 3, "n": 4, "off": [[0, 1, 2, 3], [5, 0, 0, 1], [9, 9, 0, 2]]}),
])
def test_predicate_reads_tables_with_two_indices(text, values):
    compiled = maskc.compile_mask(text)
    bound = compiled.bind(40, kv_len=47 if "anc" in values else None, **values)
    check_bound(compiled, bound, heads=range(bound.num_heads or 1))


def test_flex_mask_mod_reads_key_segments_and_two_indices():
    torch = pytest.importorskip("torch")
    for text, values, kv_len in ((CROSS, {"text": [[4, 6], [10]], "images": [[3, 9], [12]]}, 12),
                                 (TREE, {"anc": [np.eye(10, dtype=int), np.ones((10, 10), int)]}, 15)):
        bound = maskc.compile_mask(text).bind(10, kv_len=kv_len, **values)
        mod = bound.flex_mask_mod()
        q, k = torch.arange(10)[:, None], torch.arange(kv_len)[None, :]
        for b in range(2):
            got = mod(torch.tensor(b), torch.tensor(0), q, k)
            np.testing.assert_array_equal(np.broadcast_to(got.numpy(), (10, kv_len)), bound.dense(b))
