"""Bind: every documented BindError, at the declaration's file:line:col, and valid values bound right."""
import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import maskc
from maskc.errors import BindError, MaskError

from conftest import EXAMPLES


def load(name):
    return maskc.load(EXAMPLES / f"{name}.mask")


def _decl_line(name, needle):
    """(line, col) of the first occurrence of ``needle`` in an example file."""
    for i, line in enumerate((EXAMPLES / f"{name}.mask").read_text().splitlines(), 1):
        if needle in line:
            return i, line.index(needle) + 1
    raise AssertionError(needle)


def _bind_error(mask, *args, **kwargs) -> BindError:
    with pytest.raises(BindError) as info:
        mask.bind(*args, **kwargs)
    err = info.value
    text = str(err)
    assert err.message and "Traceback" not in text
    return err


def _at(err, example, needle):
    line, col = _decl_line(example, needle)
    assert err.span is not None, str(err)
    assert err.span.file == str(EXAMPLES / f"{example}.mask")
    assert (err.span.line, err.span.col) == (line, col), str(err)
    assert str(err).startswith(f"{err.span.file}:{line}:{col}: error: ")
    assert "^" in str(err)


# -- segments --------------------------------------------------------------------------------------

@pytest.mark.parametrize("docs,total", [([3, 4], 7), ([10, 1], 11), ([], 0), ([0], 0)])
def test_segments_not_summing_to_their_range(docs, total):
    err = _bind_error(load("document"), 10, docs=docs)
    assert f"segments 'docs' sum to {total}" in err.message
    assert "[0, 10)" in err.message            # names the range it must cover
    _at(err, "document", "docs: segments")


def test_segments_from_origin_must_cover_the_rest():
    err = _bind_error(load("shared_prompt"), 10, prompt=4, responses=[3, 4])
    assert "'responses'" in err.message and "[4, 10)" in err.message and "6 tokens" in err.message
    _at(err, "shared_prompt", "responses: segments")


def test_negative_lengths():
    err = _bind_error(load("document"), 10, docs=[12, -2])
    assert "negative" in err.message and "'docs'" in err.message
    _at(err, "document", "docs: segments")


@pytest.mark.parametrize("origin", [11, -1, 100])
def test_segments_from_origin_outside_range(origin):
    err = _bind_error(load("shared_prompt"), 10, prompt=origin, responses=[max(0, 10 - origin)])
    assert f"start at {origin}" in err.message and "[0, seq_len = 10]" in err.message
    _at(err, "shared_prompt", "responses: segments")


def test_origin_at_either_end_is_fine():
    m = load("shared_prompt")
    assert m.bind(10, prompt=10, responses=[]).dense().sum() == 55
    d = m.bind(10, prompt=0, responses=[4, 6]).dense()
    q, k = np.indices((10, 10))
    assert np.array_equal(d, (k <= q) & ((q >= 4) == (k >= 4)))


@pytest.mark.parametrize("value", [[5.0, 5], "55", [True, 9], None, [[5], 5]])
def test_segments_must_be_integer_lists(value):
    m = load("document")
    with pytest.raises(BindError) as info:
        m.bind(10, docs=value)
    assert "'docs'" in info.value.message


def test_segments_type_error_carries_the_declaration():
    err = _bind_error(load("document"), 10, docs=[5.0, 5])
    _at(err, "document", "docs: segments")


def test_segments_as_numpy_array():
    d = load("document").bind(10, docs=np.array([4, 6])).dense()
    assert d.sum() == 10 + 21



def test_segments_and_per_arrays_as_torch_tensors():
    """1-D integer tensors are taken where numpy arrays are (their values read with .tolist()), one per batch
    element too; tensors of floats, bools or two dimensions are refused as such arrays are."""
    torch = pytest.importorskip("torch")
    doc = load("document")
    assert np.array_equal(doc.bind(10, docs=torch.tensor([4, 6])).dense(), doc.bind(10, docs=[4, 6]).dense())
    two = doc.bind(10, docs=[torch.tensor([4, 6]), torch.tensor([10], dtype=torch.int32)])
    assert two.batch == 2 and np.array_equal(two.dense(1), doc.bind(10, docs=[10]).dense())
    hstu = load("hstu")
    assert np.array_equal(hstu.bind(10, users=torch.tensor([5, 5]), targets=torch.tensor([1, 2])).dense(),
                          hstu.bind(10, users=[5, 5], targets=[1, 2]).dense())
    shared = load("shared_prompt")       # no responses: an empty tensor of integers
    assert shared.bind(8, prompt=8, responses=torch.zeros(0, dtype=torch.int64)).dense().sum() == 36
    for bad in (torch.tensor([4.0, 6.0]), torch.tensor([True, False]), torch.tensor([[4, 6]])):
        assert "must be a list of integers" in _bind_error(doc, 10, docs=bad).message


# -- per-segment arrays ---------------------------------------------------------------------------

@pytest.mark.parametrize("targets", [[1], [1, 1, 1], []])
def test_wrong_count_of_per_array_entries(targets):
    err = _bind_error(load("hstu"), 10, users=[5, 5], targets=targets)
    assert f"'targets' has {len(targets)} entries but 'users' has 2 segments" in err.message
    _at(err, "hstu", "targets: per users")


def test_targets_longer_than_the_user_fail_the_require_line():
    err = _bind_error(load("hstu"), 10, users=[5, 5], targets=[1, 6])
    assert "requirement not met at q = 5" in err.message and "is 6 <= 5" in err.message
    _at(err, "hstu", "require 0 <= targets(q)")


def test_per_array_default_fills_every_segment():
    m = maskc.compile_mask("mask m(d: segments, t: per d = 2)\n  allow same(d), k <= q, q - k < t(q)\n")
    a = m.bind(9, d=[4, 5]).dense()
    b = m.bind(9, d=[4, 5], t=[2, 2]).dense()
    assert np.array_equal(a, b) and a.sum() > 0


def test_missing_per_array_without_default():
    err = _bind_error(load("hstu"), 10, users=[10])
    assert "needs 'targets'" in err.message
    _at(err, "hstu", "targets: per users")


# -- ints, names, values ------------------------------------------------------------------------

def test_missing_params():
    err = _bind_error(load("prefix_lm"), 10)
    assert "needs parameter 'prefix'" in err.message
    _at(err, "prefix_lm", "prefix: int")
    err = _bind_error(load("document"), 10)
    assert "needs segments 'docs'" in err.message
    _at(err, "document", "docs: segments")


def test_unknown_param_with_hint():
    err = _bind_error(load("prefix_lm"), 10, prefx=3)
    assert "no parameter 'prefx'" in err.message and err.hint == "did you mean 'prefix'?"
    _at(err, "prefix_lm", "prefix_lm(")
    err = _bind_error(load("causal"), 10, x=1)
    assert err.hint == "it takes no parameters"
    err = _bind_error(load("global_local"), 10, zzz=1)
    assert "globals" in err.hint and "window" in err.hint


@pytest.mark.parametrize("typo,meant", [("num_head", "num_heads"), ("kvlen", "kv_len"), ("numheads", "num_heads")])
def test_a_misspelt_length_keyword_is_named(typo, meant):
    # the hint listed only the mask's own parameters ("its parameters: window")
    err = _bind_error(load("per_head_window"), 8, window=[1, 2], **{typo: 2})
    assert err.hint == f"did you mean '{meant}'?", str(err)


@pytest.mark.parametrize("value", [3.0, "3", True, object(), 2.5, [1.0]])
def test_non_integer_values(value):
    err = _bind_error(load("prefix_lm"), 10, prefix=value)
    assert "'prefix'" in err.message
    if not isinstance(value, list):
        assert "must be an integer" in err.message
        _at(err, "prefix_lm", "prefix: int")


def test_numpy_integers_are_integers():
    a = load("prefix_lm").bind(10, prefix=np.int32(3)).dense()
    assert np.array_equal(a, load("prefix_lm").bind(10, prefix=3).dense())


@pytest.mark.parametrize("kw", [dict(seq_len=0), dict(seq_len=-3), dict(seq_len=2.0), dict(seq_len=True),
                                dict(seq_len=4, kv_len=0), dict(seq_len=4, kv_len="4"),
                                dict(seq_len=4, num_heads=0)])
def test_lengths_must_be_positive_integers(kw):
    err = _bind_error(load("causal"), **kw)
    assert "must be a positive integer" in err.message


def test_divisor_not_positive():
    m = maskc.compile_mask("mask m(w: int)\n  allow k // w == q // w\n", path="div.mask")
    for w in (0, -3):
        err = _bind_error(m, 10, w=w)
        assert "divisor 'w'" in err.message and "not positive" in err.message
        assert str(err).startswith("div.mask:1:6: error:")
    assert m.bind(10, w=1).dense().sum() == 10


def test_require_checked_at_every_q():
    err = _bind_error(load("prefix_lm"), 10, prefix=-1)
    assert "requirement not met: prefix >= 0 is -1 >= 0" in err.message     # no position: it reads none
    _at(err, "prefix_lm", "require prefix >= 0")
    m = maskc.compile_mask("mask m()\n  require q < 5 or seq_len < 5\n  allow k <= q\n")
    assert m.bind(5).dense().sum() == 15
    err = _bind_error(m, 7)
    assert "q = 5" in err.message


def test_mask_reading_h_needs_num_heads():
    m = maskc.compile_mask("mask m()\n  allow k <= q + h\n")
    err = _bind_error(m, 5)
    assert "num_heads" in err.message
    b = m.bind(5, num_heads=3)
    q, k = np.indices((5, 5))
    assert np.array_equal(b.dense(head=2), k <= q + 2)


# -- defaults, jagged batches ------------------------------------------------------------------

def test_defaults_used():
    m = load("global_local")
    a = m.bind(40).dense()
    b = m.bind(40, globals=4, window=512).dense()
    assert np.array_equal(a, b)
    p = m.bind(40).params.batch[0]
    assert p.int("globals") == 4 and p.int("window") == 512


def test_jagged_batch_binds_per_element():
    m = load("shared_prompt")
    bound = m.bind(12, prompt=[2, 5, 0], responses=[[10], [3, 4], [6, 6]])
    assert bound.batch == 3
    for b, (prompt, resp) in enumerate([(2, [10]), (5, [3, 4]), (0, [6, 6])]):
        single = m.bind(12, prompt=prompt, responses=resp)
        assert np.array_equal(bound.dense(b), single.dense())
        assert bound.params.batch[b].int("prompt") == prompt


def test_jagged_batch_with_shared_scalar():
    m = load("document")
    bound = m.bind(8, docs=[[8], [4, 4]])
    assert bound.batch == 2
    assert not np.array_equal(bound.dense(0), bound.dense(1))
    assert np.array_equal(bound.dense(1), m.bind(8, docs=[4, 4]).dense())


def test_jagged_batch_mismatched_sizes():
    err = _bind_error(load("shared_prompt"), 10, prompt=[2, 3], responses=[[8], [7], [10]])
    assert "3 batch entries" in err.message and "2" in err.message
    _at(err, "shared_prompt", "responses: segments")


def test_jagged_batch_error_names_the_element():
    err = _bind_error(load("shared_prompt"), 10, prompt=[2, 3], responses=[[8], [6]])
    assert "(batch element 1)" in err.message
    _at(err, "shared_prompt", "responses: segments")


def test_empty_batch_is_a_bind_error():
    _bind_error(load("prefix_lm"), 10, prefix=[])


def test_values_beyond_int32_rejected_at_bind():
    with pytest.raises(BindError):
        load("prefix_lm").bind(10, prefix=2 ** 40).descriptor()


def test_every_bind_error_str_has_no_traceback_and_has_a_place():
    m = load("hstu")
    attempts = [dict(users=[5, 4]), dict(users=[5, 5], targets=[1]), dict(users=[-1, 11]),
                dict(users=[10], context=-1), dict(users=[10], nope=1), dict(users=[10], context=1.5)]
    for kw in attempts:
        err = _bind_error(m, 10, **kw)
        assert err.span is not None and err.span.file.endswith("hstu.mask"), str(err)
        assert str(err).split(":")[1].isdigit()


def test_batch_params_look_up_every_name_as_the_tuples_hold_it():
    """BatchParams' lookups by name (dicts made once) give the values the tuples hold, per batch element, and a
    KeyError for a name it does not have."""
    bound = load("hstu").bind(seq_len=40, users=[[10, 30], [25, 15]], targets=[[2, 3], [0, 4]], max_attn_len=[0, 5])
    for element in bound.params.batch:
        for name, value in element.ints:
            assert element.int(name) == value
        for name, table in element.segments:
            assert element.segment(name) is table
        with pytest.raises(KeyError):
            element.int("no_such_parameter")
    assert [e.int("max_attn_len") for e in bound.params.batch] == [0, 5]
    assert [e.segment("users").bounds.tolist() for e in bound.params.batch] == [[0, 10, 40], [0, 25, 40]]


# Checks of both kinds: a divisor and rules that read only ints and lengths (remembered once they pass), a rule
# that reads segments and one that reads q (checked at every bind), in an order that mixes them.
REMEMBERED_CHECKS = """mask checks(docs: segments, t: per docs, a: int = 1, c: int = 0, w: int = 4)
  require a >= 1, c <= a * 3
  require t(q) <= a + c
  require w - c >= 0 or q < a
  require a + 1 <= seq_len - 1, 2 * a <= kv_len
  allow same(docs), k // w <= q // w
"""


_CHECK_FIELDS = {"seq_len": st.sampled_from([3, 8]), "kv_len": st.sampled_from([3, 8]), "a": st.integers(0, 3),
                 "c": st.integers(-2, 6), "w": st.integers(0, 4), "t": st.integers(-1, 4)}


@settings(max_examples=200)
@given(st.fixed_dictionaries(_CHECK_FIELDS),
       st.lists(st.one_of(*[st.tuples(st.just(f), v) for f, v in _CHECK_FIELDS.items()]), min_size=1, max_size=10))
def test_remembered_checks_fail_where_the_walk_fails(first, changes):
    """A mask remembers passes of its checks that read only ints and lengths (bind._Checks): bind after bind,
    each changing one value of the one before (so that keys that passed are met again with the other values
    changed), then all again (hits), it raises where a mask that forgets them raises, with the same message,
    and binds where that one binds."""
    remembering, forgetting = maskc.compile_mask(REMEMBERED_CHECKS), maskc.compile_mask(REMEMBERED_CHECKS)
    values = [first]
    for field, value in changes:
        values.append({**values[-1], field: value})
    for v in values + values:
        params = {"docs": [1, v["seq_len"] - 1], "t": [v["t"], 0], "a": v["a"], "c": v["c"], "w": v["w"]}
        outcomes = []
        for mask in (remembering, forgetting):
            forgetting.ranges.__dict__.pop("_value_checks", None)
            try:
                mask.bind(v["seq_len"], v["kv_len"], **params)
                outcomes.append(None)
            except BindError as err:
                outcomes.append(str(err))
        event("binds" if outcomes[0] is None else "fails")
        assert outcomes[0] == outcomes[1]


@given(st.lists(st.integers(-2**40, 2**40), max_size=6), st.lists(st.integers(-5, 5), max_size=6))
def test_segment_value_ranges_are_the_arrays_extremes(first, second):
    """SegmentTable.value_range (what the width proofs read, worked out once per table): each array's least and
    greatest value, None for no segments, asked twice and in either order."""
    from maskc.bound_params import SegmentTable

    arrays = (("a", np.array(first, np.int64)), ("b", np.array(second[:len(first)] + [0] * (len(first) - len(second)),
                                                                  np.int64)))
    table = SegmentTable(np.arange(len(first) + 1, dtype=np.int64), arrays)
    for name, values in arrays + arrays[::-1]:
        expected = (int(values.min()), int(values.max())) if len(values) else None
        assert table.value_range(name) == expected


# Requires read through segments only (checked at the segments' starts) and through two tables (their bounds
# merged), over segments from an origin (positions before it outside every segment) and empty segments.
SEGMENT_REQUIRES = """mask reqs(lead: int = 0, docs: segments from lead, t: per docs, parts: segments, u: per parts)
  require docs.index(q) >= 0 or lead <= 2
  require t(q) <= docs.length(q) + 2 or docs.index(q) < 0
  require t(q) + u(q) <= 6
  allow same(docs), k <= q
"""


def _lengths(total: int, cuts: list[int]) -> list[int]:
    bounds = sorted(min(c, total) for c in cuts)
    return [b - a for a, b in zip([0] + bounds, bounds + [total])]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 24), st.integers(0, 5), st.lists(st.integers(0, 24), max_size=5),
       st.lists(st.integers(0, 24), max_size=4), st.lists(st.integers(-2, 8), min_size=6, max_size=6),
       st.lists(st.integers(-2, 5), min_size=5, max_size=5))
def test_segment_requires_fail_at_the_first_q_a_walk_finds(seq_len, lead, doc_cuts, part_cuts, t, u):
    """bind checks a require that reads q only through segments at their starts (bind._piece_starts, one table's
    bounds unsorted, empty segments repeating a start): it refuses exactly where evaluating the condition at every
    q refuses, and names the first q where it fails."""
    from maskc.analysis.evaluate import Evaluator

    lead = min(lead, seq_len)
    docs, parts = _lengths(seq_len - lead, doc_cuts), _lengths(seq_len, part_cuts)
    params = {"lead": lead, "docs": docs, "t": t[:len(docs)], "parts": parts, "u": u[:len(parts)]}
    mask = maskc.compile_mask(SEGMENT_REQUIRES)
    try:
        mask.bind(seq_len, **params)
        refused = None
    except BindError as err:
        refused = err.message
    # the same values checked at every q, rule by rule, with the checks left out
    known = maskc.compile_mask(SEGMENT_REQUIRES.replace("  require", "  # require")).bind(seq_len, **params)
    ev = Evaluator(mask.resolved, known.params.batch[0], seq_len, seq_len)
    q = np.arange(seq_len, dtype=np.int64)
    expected = None
    for rule in mask.resolved.requires:
        ok = np.broadcast_to(ev.cond(rule.cond, q, None), q.shape)
        if not ok.all():
            expected = f"at q = {int(np.argmin(ok))}:"
            break
    event("refused" if expected else "bound")
    if expected is None:
        assert refused is None
    else:
        assert refused is not None and expected in refused, (refused, expected)


@given(st.lists(st.integers(0, 6), min_size=1, max_size=5), st.lists(st.integers(-3, 30), min_size=1, max_size=8))
def test_the_evaluator_reads_segments_at_each_array_it_is_given(lengths, positions):
    """Evaluator.segment reads at an array again, at a new array of other positions, back at the first, and at the
    first after it was written in place, give what a fresh evaluator gives (an evaluator kept the slots of the last
    array it was given, by identity, and read the written array at its old positions)."""
    from maskc.analysis.evaluate import Evaluator
    from maskc.bound_params import BatchParams, SegmentTable

    bounds = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    params = BatchParams((), (("s", SegmentTable(bounds, (("v", np.arange(len(lengths), dtype=np.int64) * 3),))),))
    n = int(bounds[-1]) + 1
    ev = Evaluator(None, params, n, n)       # type: ignore[arg-type]  # segment reads need no mask
    first, second = np.array(positions, np.int64), np.array(positions[::-1], np.int64) + 1
    for at in (first, first, second, first, None):
        if at is None:              # the first array again, written in place: its positions moved by a segment
            at = first
            at += int(bounds[1]) + 1
        for attr in ("index", "start", "end", "length", "value:v"):
            fresh = Evaluator(None, params, n, n).segment("s", attr, at.copy())     # type: ignore[arg-type]
            assert ev.segment("s", attr, at).tolist() == fresh.tolist()


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(-1, 9), max_size=40), st.integers(0, 6), st.booleans(), st.integers(0, 1))
def test_segment_bounds_are_the_lengths_summed_from_the_origin(lengths, origin, as_array, off):
    """values.segment_table, few lengths (Python ints) and many (numpy) alike: int64 bounds from the origin, the
    lengths' running sums after it; a negative length or a sum that misses the range refused with its message."""
    from maskc.analysis.values import FEW_SEGMENTS, segment_table

    mask = maskc.compile_mask("mask m(o: int = 0, s: segments from o)\n  allow same(s)\n").resolved
    p = next(x for x in mask.params if x.name == "s")
    end = origin + max(sum(lengths), 0) + off
    value = np.array(lengths, np.int64) if as_array else lengths
    event(f"few: {len(lengths) <= FEW_SEGMENTS}")
    if any(v < 0 for v in lengths):
        with pytest.raises(BindError, match="has a negative length"):
            segment_table(mask, p, value, origin, end, "", end, end)
    elif sum(lengths) != end - origin:
        with pytest.raises(BindError, match=f"sum to {sum(lengths)}, but must cover"):
            segment_table(mask, p, value, origin, end, "", end, end)
    else:
        bounds = segment_table(mask, p, value, origin, end, "", end, end).bounds
        assert bounds.dtype == np.int64
        assert bounds.tolist() == [origin + sum(lengths[:i]) for i in range(len(lengths) + 1)]
