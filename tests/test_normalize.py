"""Normalize and range analysis denote exactly the resolved mask (checked densely, by brute force)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc import ir
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis.rows import RowValues, k_bound_rows

from conftest import EXAMPLE_NAMES, EXAMPLES, example_params
from mask_strategies import HEADER, binding, condition, mask_text


def _rows(bound):
    s, kv = bound.seq_len, bound.kv_len
    q, k = np.arange(s, dtype=np.int64), np.arange(kv, dtype=np.int64)
    return RowValues(bound.params.batch[0], s, kv, 0, 0, q[:, None], k[None, :])


def _grid(value, shape):
    return np.broadcast_to(np.asarray(value), shape)


def normal_dense(normal: ir.NormalMask, bound) -> np.ndarray:
    rows, shape = _rows(bound), (bound.seq_len, bound.kv_len)

    def region(r):
        out = np.ones(shape, bool)
        for a in r.atoms:
            out &= _grid(rows.lin(a.lin) <= 0, shape)
        return out
    return _union_minus(normal.allow, normal.deny, region, shape)


def range_dense(ranges: ir.RangeMask, bound) -> np.ndarray:
    rows, shape = _rows(bound), (bound.seq_len, bound.kv_len)
    k = np.arange(bound.kv_len, dtype=np.int64)[None, :]

    def region(r: ir.RegionBounds):
        out = np.ones(shape, bool)
        for g in r.static_guards + r.guards:
            assert not F.depends_on_k(g.lin)
            out &= _grid(rows.lin(g.lin) <= 0, shape)
        for b in r.lower:
            assert not F.depends_on_k(b.lin) and b.den >= 1
            out &= _grid(k >= k_bound_rows(b, rows, True), shape)
        for b in r.upper:
            assert not F.depends_on_k(b.lin) and b.den >= 1
            out &= _grid(k <= k_bound_rows(b, rows, False), shape)
        for a in r.opaque:
            assert F.split_k(a.lin) is None
            out &= _grid(rows.lin(a.lin) <= 0, shape)
        return out
    return _union_minus(ranges.allow, ranges.deny, region, shape)


def _union_minus(allow_regions, deny_regions, region, shape) -> np.ndarray:
    """any(allow) and not any(deny), each region drawn densely by ``region``."""
    allow = np.zeros(shape, bool)
    for r in allow_regions:
        allow |= region(r)
    deny = np.zeros(shape, bool)
    for r in deny_regions:
        deny |= region(r)
    return allow & ~deny


def _check(c, bound):
    truth = bound.dense()
    assert np.array_equal(normal_dense(c.normal, bound), truth), "normal form differs from the resolved mask"
    assert np.array_equal(range_dense(c.ranges, bound), truth), "range bounds differ from the resolved mask"


@given(text=mask_text(exact=False), b=binding())
def test_normal_form_and_ranges_denote_the_resolved_mask(text, b):
    seq_len, kv_len, params = b
    c = maskc.compile_mask(text)
    _check(c, c.bind(seq_len, kv_len, **params))


@settings(max_examples=30)
@given(text=mask_text(exact=True), b=binding())
def test_exact_fragment_has_no_opaque_atoms_and_denotes_the_mask(text, b):
    c = maskc.compile_mask(text)
    assert c.exact
    for r in c.ranges.allow + c.ranges.deny:
        assert r.opaque == () and r.exact
        for a in r.static_guards + r.guards:
            assert not F.depends_on_k(a.lin)
    _check(c, c.bind(b[0], b[1], **b[2]))


@settings(max_examples=40)
@given(cond=condition(exact=False), extra=st.sampled_from(["", ", k <= q", ", t(k) <= docs.length(k)"]))
def test_same_regions_mention_no_k_side_attribute_of_that_segments(cond, extra):
    text = HEADER + f"\n  allow same(docs), {cond}{extra}\n"
    c = maskc.compile_mask(text)

    def k_side_docs(t):
        return isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "k" and t.seg == "docs"
    for r in c.normal.allow:
        for a in r.atoms:
            assert not F.lin_mentions(a.lin, k_side_docs), F.render(a.lin)
        # same(docs) itself is there, made linear: docs.index(q) >= 0
        idx = ir.SegAttr("docs", "index", "q")
        assert any(a.lin.coef(idx) < 0 for a in r.atoms)


def test_same_rewrites_k_attributes_to_q():
    c = maskc.compile_mask("mask m(d: segments, t: per d)\n  allow same(d), k >= d.start(k) + t(k)\n")
    for r in c.normal.allow:
        for a in r.atoms:
            assert not F.lin_mentions(a.lin, lambda t: isinstance(t, (ir.SegAttr, ir.SegValue)) and t.pos == "k")
    assert c.exact


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_examples_normal_form_and_ranges(name):
    rng = np.random.default_rng(7)
    c = maskc.load(EXAMPLES / f"{name}.mask")
    for _ in range(4):
        s = int(rng.integers(1, 60))
        try:
            bound = c.bind(s, **example_params(name, s, rng))
        except maskc.errors.BindError:
            continue
        _check(c, bound)


def test_k_min_max_is_split_not_opaque():
    c = maskc.compile_mask("mask m(a: int)\n  allow max(k, a) <= q, abs(q - k) < 3\n")
    assert c.exact
    bound = c.bind(20, a=5)
    _check(c, bound)


def test_square_of_k_is_opaque_but_exact():
    """The atom stays opaque (the kernel's predicate checks it per pair), but its keys per row are one
    interval, |q - k| <= isqrt(8), so tile classes are exact."""
    c = maskc.compile_mask("mask m()\n  allow (q - k) ** 2 < 9\n")
    assert c.exact and not c.ranges.linear
    (region,) = c.ranges.allow
    assert region.opaque and region.chunks is not None and len(region.chunks.levels) == 1
    _check(c, c.bind(15))


def test_contradictory_region_dropped():
    c = maskc.compile_mask("mask m()\n  allow k <= q\n  allow k < 3, k > 5\n")
    assert len(c.normal.allow) == 1


def test_divisors_collected():
    c = maskc.compile_mask("mask m(w: int)\n  allow k // w == q // w\n")
    assert c.normal.divisors == (L.of_term(ir.ParamRef("w")),)


def test_atoms_are_canonical_lin_le_zero():
    c = maskc.compile_mask("mask m()\n  allow 2 * k + 3 <= q + k, k != q\n")
    for r in c.normal.allow:
        for a in r.atoms:
            assert all(coef != 0 for _, coef in a.lin.terms)
            keys = [L._term_key(t) for t, _ in a.lin.terms]
            assert keys == sorted(keys) and len(set(keys)) == len(keys)
    _check(c, c.bind(9))
