"""Bounded work (issue 17, item 4): inputs that used to take exponential time or unbounded memory are
either handled by an algorithm that does not blow up, or refused by a budget with a located error.
The budgets count work (nodes, cases), never time, so these tests assert errors and results only."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.errors import ComplexityError
from maskc.analysis.linear import MAX_TERM_NODES
from maskc.frontend.resolve import MAX_EXPANDED_NODES

from conftest import tile_truth


def _compile_error(text: str) -> ComplexityError:
    with pytest.raises(ComplexityError) as info:
        maskc.compile_mask(text, path="limits.mask")
    err = info.value
    assert err.span is not None and err.span.file == "limits.mask"
    assert "Traceback" not in str(err) and "^" in str(err)
    return err


def _agrees(text: str, oracle, n: int = 40, **params):
    """The compiled mask's tiles and dense mask against a numpy oracle of (q, k)."""
    bound = maskc.compile_mask(text).bind(n, **params)
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    expected = oracle(q, k)
    np.testing.assert_array_equal(bound.dense(), expected)
    np.testing.assert_array_equal(bound.tiles(8, 8), tile_truth(expected.astype(np.int8), 8, 8))


def test_nested_abs_from_the_issue_is_refused_at_its_rule():
    # 13 nested abs: abs(x) is max(x, -x), so the term doubles per level (over 30 s before the budget)
    text = "mask m()\n  allow k <= q\n  allow " + "abs(" * 13 + "k - q" + ")" * 13 + " <= 3\n"
    err = _compile_error(text)
    assert (err.span.line, err.span.col) == (3, 3)
    assert str(MAX_TERM_NODES) in err.message and "abs" in err.hint


def test_nested_abs_within_the_budget_is_exact():
    text = "mask m()\n  allow " + "abs(" * 6 + "k - q" + ")" * 6 + " <= 3\n"
    _agrees(text, lambda q, k: np.abs(k - q) <= 3)


def test_a_let_chain_that_doubles_is_refused_at_its_rule():
    lets = "".join(f"  let a{i} = a{i - 1} + a{i - 1}\n" for i in range(1, 30))
    err = _compile_error("mask m()\n  let a0 = k - q\n" + lets + "  allow a29 <= 3\n")
    assert err.span.line == 32 and str(MAX_EXPANDED_NODES) in err.message and "let" in err.hint


def test_a_let_function_nested_into_itself_is_refused():
    # its argument is shared, so resolving is quick, but written out it doubles per call
    _compile_error("mask m()\n  let f(x) = x + x\n  allow " + "f(" * 20 + "k" + ")" * 20 + " <= q\n")


def test_a_short_let_chain_still_compiles_and_is_exact():
    lets = "".join(f"  let a{i} = a{i - 1} + a{i - 1}\n" for i in range(1, 6))
    _agrees("mask m()\n  let a0 = k - q\n" + lets + "  allow a5 <= 64, k <= q\n",
            lambda q, k: (32 * (k - q) <= 64) & (k <= q))


def test_powers_of_powers_are_refused():
    _compile_error("mask m()\n  allow " + "(" * 5 + "k" + "**8)" * 5 + " <= q\n")


@pytest.mark.parametrize("n", [3, 40])
def test_many_inequalities_no_longer_double_the_work(n):
    # each '!=' has two cases; 40 of them were 2**40 combinations before partial conjunctions were merged
    _agrees("mask m()\n  allow " + " and ".join(["k != q"] * n) + ", k <= q\n", lambda q, k: k < q)
    _agrees("mask m()\n  allow k <= q, " + " and ".join(f"k != q - {i}" for i in range(n)) + "\n",
            lambda q, k: k <= q - n)


def test_inequalities_in_many_directions_hit_the_region_budget():
    # genuinely 2**12 regions: refused, at the rule, with a hint
    err = _compile_error("mask m()\n  allow " + " and ".join(f"{i + 2} * k != q" for i in range(12)) + "\n")
    assert err.span.line == 2 and err.hint


# -- run-time sizes: lengths, heads, tile grids, dense masks ---------------------------------------

import tracemalloc  # noqa: E402

from maskc.analysis import evaluate  # noqa: E402
from maskc.analysis.bind import MAX_HEADS  # noqa: E402
from maskc.analysis.classify import MAX_TILES  # noqa: E402
from maskc.errors import BindError  # noqa: E402
from maskc.analysis.evaluate import MAX_DENSE_CELLS  # noqa: E402

from conftest import EXAMPLES  # noqa: E402

INT32_MAX = 2**31 - 1
LONGEST = {"causal": {}, "sliding_window": {"window": 100}, "prefix_lm": {"prefix": 5},
           "document": {"docs": [2**30, INT32_MAX - 2**30]},
           "hstu": {"users": [7, INT32_MAX - 7], "targets": [1, 5], "context": 1, "max_attn_len": 3}}


def _peak_bytes(fn) -> int:
    tracemalloc.start()
    try:
        fn()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", sorted(LONGEST))
def test_binding_the_longest_sequence_takes_little_memory(name):
    # the require checks and segment lookups built seq_len-sized tables: 16 GiB at 2**31 - 1
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    peak = _peak_bytes(lambda: mask.bind(INT32_MAX, **LONGEST[name]))
    assert peak < 64 << 20, peak


@pytest.mark.parametrize("kw, name", [(dict(seq_len=INT32_MAX + 1), "seq_len"),
                                      (dict(seq_len=8, kv_len=INT32_MAX + 1), "kv_len"),
                                      (dict(seq_len=8, num_heads=MAX_HEADS + 1), "num_heads"),
                                      (dict(seq_len=8, num_heads=10**12), "num_heads")])
def test_lengths_and_heads_past_their_range_name_the_parameter_and_the_bound(kw, name):
    with pytest.raises(BindError) as info:
        maskc.load(EXAMPLES / "causal.mask").bind(**kw)
    message = info.value.message
    assert message.startswith(name) and str(INT32_MAX if "len" in name else MAX_HEADS) in message
    assert info.value.hint


def test_the_largest_lengths_and_heads_are_accepted():
    bound = maskc.compile_mask("mask m()\n  allow k <= q + h\n").bind(INT32_MAX, INT32_MAX, num_heads=MAX_HEADS)
    assert (bound.seq_len, bound.kv_len, bound.num_heads) == (INT32_MAX, INT32_MAX, MAX_HEADS)


@pytest.mark.parametrize("name", sorted(LONGEST))
def test_a_descriptor_past_the_memory_cap_is_refused_before_any_work(name):
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(INT32_MAX, **LONGEST[name])

    def refused():
        with pytest.raises(BindError) as info:
            bound.descriptor(128, 128, max_bytes=1 << 20)   # its offsets alone take 128 MiB
        message = info.value.message
        assert "max_bytes = 1048576" in message and "seq_len = 2147483647" in message and info.value.hint
    assert _peak_bytes(refused) < 1 << 20


def test_the_memory_cap_counts_runs_as_they_are_made():
    # 2**24 tokens: 131072 row blocks, whose offsets and work order take 1 MiB and whose runs take 3 MiB;
    # the dense tile grid would take 16 GiB
    bound = maskc.load(EXAMPLES / "causal.mask").bind(1 << 24)
    peak = []

    def refused():
        with pytest.raises(BindError, match="max_bytes = 2097152"):
            bound.tile_map(128, 128, max_bytes=2 << 20)
    peak.append(_peak_bytes(refused))
    desc = bound.descriptor(128, 128, max_bytes=8 << 20)        # raised: accepted, then cached
    assert desc.runs.shape == (2 * (1 << 17) - 1, 3) and desc.nbytes < 8 << 20
    with pytest.raises(BindError, match="max_bytes = 4194304"):   # a smaller cap refuses the cached one too
        bound.descriptor(128, 128, max_bytes=4 << 20)
    assert bound.descriptor(128, 128) is desc
    assert peak[0] < 64 << 20, peak      # chunks of q_blocks: never near the grid


def test_a_long_sequence_classifies_in_memory_linear_in_its_runs():
    bound = maskc.load(EXAMPLES / "document.mask").bind(1 << 24, docs=[1 << 22] * 4)
    peak = _peak_bytes(lambda: bound.descriptor(128, 128))
    desc = bound.descriptor(128, 128)
    assert peak < 16 * desc.nbytes + (32 << 20), (peak, desc.nbytes)
    assert int(desc.tile_map.counts()["FULL"]) == 4 * ((1 << 15) * ((1 << 15) - 1) // 2)


def test_the_transposed_view_counts_against_the_cap():
    bound = maskc.load(EXAMPLES / "causal.mask").bind(128, kv_len=1 << 24)
    desc = bound.descriptor(128, 128, max_bytes=256 << 10)      # one row block: a few bytes
    with pytest.raises(BindError, match="max_bytes = 262144"):
        desc.col_offsets                                          # 131072 column blocks: 1 MiB of offsets


@pytest.mark.parametrize("bad", [0, -1, 1.5, "1GiB", True])
def test_the_cap_must_be_a_positive_integer(bad):
    bound = maskc.load(EXAMPLES / "causal.mask").bind(256)
    with pytest.raises(BindError, match="max_bytes"):
        bound.descriptor(128, 128, max_bytes=bad)


OPAQUE = "mask m()\n  allow (k * q) % 7 == 0\n"       # k times q: bounded tile by tile


def test_a_tile_grid_of_a_mask_bounded_per_tile_past_the_cap_is_refused_before_any_work():
    mask = maskc.compile_mask(OPAQUE)
    assert not mask.exact
    bound = mask.bind(INT32_MAX)

    def classify():
        with pytest.raises(BindError, match=str(MAX_TILES)) as info:
            bound.tile_map(128, 128)
        assert "seq_len = 2147483647" in info.value.message and info.value.hint
    assert _peak_bytes(classify) < 1 << 20


def test_heads_count_against_the_tile_cap_when_the_mask_reads_h():
    mask = maskc.compile_mask("mask m()\n  allow (k * q) % 7 == h\n")
    side = 128 * 4096                                     # 4096 x 4096 tiles = 2**24: under the cap alone
    with pytest.raises(BindError, match="32 heads"):
        mask.bind(side, num_heads=32).tile_map(128, 128)


def test_a_dense_mask_past_the_cap_is_refused():
    bound = maskc.load(EXAMPLES / "causal.mask").bind(1 << 16)
    with pytest.raises(BindError, match=str(MAX_DENSE_CELLS)):
        bound.dense()
    assert bound.restrict((0, 64), (0, 1 << 16)).dense().shape == (64, 1 << 16)   # a sub-block is fine


def test_the_dense_mask_is_the_same_evaluated_in_chunks(monkeypatch):
    bound = maskc.load(EXAMPLES / "hstu.mask").bind(50, users=[20, 30], targets=[3, 4], context=2, max_attn_len=5)
    whole = bound.dense()
    monkeypatch.setattr(evaluate, "_CHUNK_CELLS", 7)       # fewer pairs than one row: a row at a time
    np.testing.assert_array_equal(bound.dense(), whole)


def test_a_requirement_is_checked_past_the_first_chunk_of_positions():
    mask = maskc.compile_mask("mask m(n: int)\n  require q < n\n  allow k <= q\n")
    mask.bind(70_001, n=70_001)
    with pytest.raises(BindError, match="q = 70000"):
        mask.bind(70_001, n=70_000)


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 6), min_size=1, max_size=6), origin=st.integers(0, 5),
       data=st.data())
def test_a_requirement_checked_per_segment_piece_fails_where_a_check_of_every_position_does(lengths, origin, data):
    seq_len = origin + sum(lengths) or 1
    origin = seq_len - sum(lengths)
    values = data.draw(st.lists(st.integers(-2, 8), min_size=len(lengths), max_size=len(lengths)))
    mask = maskc.compile_mask("mask m(o: int, s: segments from o, v: per s)\n"
                              "  require v(q) <= s.length(q) + s.index(q), s.end(q) - s.start(q) >= v(q) - 3\n"
                              "  allow k <= q\n")
    # the oracle: every position, one at a time, straight from the segment lengths
    bounds = np.cumsum([origin] + lengths)
    first_bad = None
    for q in range(seq_len):
        i = int(np.searchsorted(bounds, q, side="right")) - 1
        inside = 0 <= i < len(lengths)
        start, end = (bounds[i], bounds[i + 1]) if inside else ((0, origin) if q < origin else (bounds[-1], seq_len))
        v, index = (values[i], i) if inside else (0, -1)
        if not (v <= end - start + index and end - start >= v - 3):
            first_bad = q
            break
    if first_bad is None:
        mask.bind(seq_len, o=origin, s=lengths, v=values)
    else:
        with pytest.raises(BindError) as info:
            mask.bind(seq_len, o=origin, s=lengths, v=values)
        assert f"requirement not met at q = {first_bad}: " in info.value.message
