"""64-bit safety (issue 17, item 1): every integer the predicate computes fits the width it is computed in.

The generated predicate, compiled by g++, must agree with ``bound.dense()`` for parameter values within
2**10 of the int32 boundaries; where a value cannot be represented at all, bind refuses with a BindError
that names the parameter.
"""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.errors import BindError

from conftest import EXAMPLES
from mask_strategies import HEADER, binding, chunk_binding, chunk_mask_text, mask_text
from host_cxx import needs_gxx
from test_predicate import check_bound

INT32_MAX = 2 ** 31 - 1
OVERFLOW = "mask ov(a: int, c: int, w: int)\n  allow k <= q + a - c, q - w <= k\n"


def edge_int():
    """Integers within 2**10 of an int32 boundary (or of 0), as bind accepts them."""
    near = st.integers(0, 2 ** 10)
    return st.one_of(near.map(lambda j: INT32_MAX - j), near.map(lambda j: -INT32_MAX + j),
                     st.integers(-2 ** 10, 2 ** 10))


@needs_gxx
def test_issue_reproducer_partial_rows_match_dense():
    """a - c = 2**31 + 99 wrapped in 32 bits: the rows of PARTIAL tiles saw nothing."""
    compiled = maskc.compile_mask(OVERFLOW)
    bound = compiled.bind(256, a=INT32_MAX, c=-100, w=100)
    assert bound.dense().any()
    check_bound(compiled, bound)


# Masks whose bounds add, scale and divide several parameters: each intermediate can pass 2**31.
EDGE_MASKS = [
    OVERFLOW,
    "mask m(a: int, c: int, w: int)\n  allow k >= q - a - c, k <= q + w\n",
    "mask m(a: int, c: int, w: int)\n  allow 2 * k <= q + a + c + w, k >= q - a - w\n",
    "mask m(a: int, c: int, w: int)\n  allow k <= (q + a + c) // 3, k >= min(q - w, a + c)\n",
    "mask m(a: int, c: int, w: int)\n  allow k <= q\n  deny k > q + a - c - w, k <= max(a, c)\n",
    "mask m(a: int, c: int, w: int)\n  allow (k + a) % 7 <= 3, k <= q + c - w\n",
    "mask m(a: int, c: int, w: int)\n  allow k * 3 <= q + a, q - c <= k + w\n",
]


@needs_gxx
@settings(max_examples=60, deadline=None)
@given(text=st.sampled_from(EDGE_MASKS), a=edge_int(), c=edge_int(), w=edge_int(),
       n=st.integers(1, 40), kv=st.integers(1, 40))
def test_predicate_matches_dense_at_int32_edges(text, a, c, w, n, kv):
    compiled = maskc.compile_mask(text)
    try:
        bound = compiled.bind(n, kv, a=a, c=c, w=w)
    except BindError as e:
        assert any(f"'{p}'" in str(e) for p in "acw"), str(e)
        return
    check_bound(compiled, bound)


@needs_gxx
@settings(max_examples=40, deadline=None)
@given(text=mask_text(exact=False), b=binding(max_len=24), c=edge_int())
def test_random_masks_match_dense_with_c_at_int32_edges(text, b, c):
    seq_len, kv_len, params = b
    compiled = maskc.compile_mask(text)
    try:
        bound = compiled.bind(seq_len, kv_len, **{**params, "c": c})
    except BindError:
        return
    check_bound(compiled, bound)


def test_bind_refuses_a_product_past_64_bits_naming_the_parameter():
    """a**3 at a = 2**31 - 1 wrapped in numpy int64: dense() and the kernel both saw a wrong bound."""
    compiled = maskc.compile_mask("mask m(a: int)\n  allow k <= q + a * a * a\n")
    with pytest.raises(BindError) as err:
        compiled.bind(64, a=INT32_MAX)
    assert "'a' = 2147483647" in str(err.value) and "2:3" in str(err.value)
    assert compiled.bind(64, a=2 ** 20).dense().all()      # (2**20)**3 = 2**60 fits


def test_bind_refuses_an_overflowing_segment_origin():
    compiled = maskc.compile_mask("mask m(a: int, s: segments from a * a * a - a * a * a)\n  allow same(s)\n")
    with pytest.raises(BindError, match="'a' = 2147483647"):
        compiled.bind(8, a=INT32_MAX, s=[8])
    assert compiled.bind(8, a=3, s=[8]).dense().all()


@settings(max_examples=60, deadline=None)
@given(a=edge_int(), e=st.integers(1, 4), n=st.integers(1, 30))
def test_accepted_products_match_exact_integers(a, e, n):
    """Whatever bind accepts, dense() is exact: compared with Python's unbounded integers."""
    power = " * ".join(["a"] * e)
    compiled = maskc.compile_mask(f"mask m(a: int)\n  allow k <= q + {power} - {power} // 2\n")
    try:
        bound = compiled.bind(n, a=a)
    except BindError as err:
        assert "'a'" in str(err)
        assert abs(a) ** e > 2 ** 62 // 4          # refused only near the limit
        return
    want = np.array([[k <= q + a ** e - a ** e // 2 for k in range(n)] for q in range(n)])
    assert np.array_equal(bound.dense(), want)


def test_constant_folded_past_64_bits_is_a_located_error():
    with pytest.raises(maskc.errors.MaskError) as err:
        maskc.compile_mask("mask m()\n  allow k <= q * 65536 * 65536 * 65536 * 65536 * 65536 - 1\n")
    assert "2:3" in str(err.value) and "64-bit" in str(err.value)


def test_bindings_within_32_bits_get_the_narrow_predicate():
    """The benchmark's shapes compute in int; a value near 2**31, or positions whose last tile passes
    2**31 - 1, keep the 64-bit predicate."""
    compiled = maskc.compile_mask(OVERFLOW)
    assert compiled.bind(32768, a=5, c=3, w=100).narrow
    assert not compiled.bind(256, a=INT32_MAX, c=-100, w=100).narrow
    assert not compiled.bind(256, a=2 ** 30, c=-2 ** 30, w=100).narrow      # a - c = 2**31
    assert not maskc.compile_mask("mask m()\n  allow k <= q\n").bind(INT32_MAX - 100).narrow
    for name, params in (("clear", {"radius": 16}), ("causal", {}), ("document", {"docs": [16384, 16384]})):
        bound = maskc.load(EXAMPLES / f"{name}.mask").bind(32768, **params)
        assert bound.narrow
        predicate = bound.kernel_spec(engine="mma").predicate
        # after mask_visible: the root tables' entries (64 bits, once per work item) and the chunk nests
        starts = [predicate.code.find(s) for s in ("// Root tables", "template <class Emit>")]
        per_row_and_key = predicate.code[:min(i for i in starts if i >= 0)] if predicate.tile_bits else predicate.code
        assert "typedef int maskc_int;" in predicate.helpers and "long long" not in per_row_and_key


def test_a_binding_whose_folded_forms_leave_32_bits_is_not_narrow(monkeypatch):
    """CompiledMask.bind keeps a binding narrow only where the forms with its const parameters folded in (clear's
    text and width) fit 32 bits too: made to fail here, the binding comes back wide; passing, narrow as before."""
    import maskc.compiled as compiled_module
    mask = maskc.load(EXAMPLES / "clear.mask")
    assert mask.bind(32768, radius=16).narrow
    monkeypatch.setattr(compiled_module, "fits_32_bits", lambda *args, **kwargs: False)
    assert not mask.bind(32768, radius=16).narrow


def test_the_width_is_part_of_the_kernel():
    """Two bindings of one mask at different widths get different kernels (a kernel cached by the mask
    alone would run a 32-bit predicate on values that need 64)."""
    compiled = maskc.compile_mask(OVERFLOW)
    narrow = compiled.bind(64, a=5, c=3, w=10).kernel_spec(engine="mma")
    wide = compiled.bind(64, a=INT32_MAX, c=-100, w=10).kernel_spec(engine="mma")
    assert narrow.predicate.source != wide.predicate.source


# Masks that add, scale and square per-segment values (t) and segment counts: their widened bounds cross
# the limits where the exact ones do not.
T_MASKS = [HEADER + "\n  allow k <= q + t(q) + c\n", HEADER + "\n  allow k >= 2 * t(q) - c, k <= q + docs.index(q)\n",
           HEADER + "\n  allow (k - t(q)) // 3 <= c, k <= q * 2 + t(q) - a\n",
           HEADER + "\n  allow k <= q + (t(q) - c) ** 2\n  deny k < min(t(q), c) + docs.index(q)\n"]


@settings(max_examples=80, deadline=None)
@given(text=st.one_of(st.sampled_from(T_MASKS), mask_text(exact=False)),
       binds=st.lists(binding(max_len=40), min_size=2, max_size=4), c=edge_int(),
       t=st.lists(edge_int(), min_size=1, max_size=4))
def test_remembered_width_proofs_agree_with_the_walk(text, binds, c, t):
    """The widened proofs a mask remembers (widths._Program.first_failing) pass exactly where the walk over
    the bound values passes, for the 64-bit and the 32-bit limits, bind after bind (later binds hit what
    earlier ones remembered; per-segment values near the int32 edges widen past them)."""
    from maskc.analysis.bounds import LIMIT, NARROW_LIMIT, Bounds
    from maskc.analysis.widths import _REFUSED, TILE_PADDING, _checked_forms, _program

    compiled = maskc.compile_mask(text)
    program = _program(compiled.resolved, compiled.ranges)
    for seq_len, kv_len, params in binds:
        params = {**params, "c": c, "t": [t[i % len(t)] for i in range(len(params["docs"]))]}
        try:
            bound = compiled.bind(seq_len, kv_len, **params)
        except BindError:
            continue
        element = bound.params.batch[0]
        for limit, padding, forms_only in ((LIMIT, 0, False), (NARROW_LIMIT, TILE_PADDING, True)):
            bounds = Bounds(element, seq_len, kv_len, 1, 0, limit, padding)
            end = (program.roots[program.forms - 1] if program.forms else 0) if forms_only else len(program.steps)
            assert program.first_failing(bounds, forms_only) == program._walk(bounds, end, None)
        # the forms alone (fits_32_bits without the resolved mask): the same answer as walking every form
        forms = _program(None, compiled.ranges)
        for limit, padding in ((LIMIT, 0), (NARROW_LIMIT, TILE_PADDING)):
            walk = Bounds(element, seq_len, kv_len, 1, 0, limit, padding)
            try:
                for lin, _ in _checked_forms(compiled.ranges):
                    walk.lin(lin)
                walked = True
            except _REFUSED:
                walked = False
            bounds = Bounds(element, seq_len, kv_len, 1, 0, limit, padding)
            assert (forms.first_failing(bounds, forms_only=True) is None) == walked


@settings(max_examples=60, deadline=None)
@given(text=chunk_mask_text(), binds=st.lists(chunk_binding(max_len=60), min_size=2, max_size=5),
       offsets=st.lists(st.one_of(st.integers(-5, 20), edge_int()), min_size=1, max_size=3))
def test_remembered_nest_proofs_agree_with_the_walk(text, binds, offsets):
    """The chunk nests' 32-bit proof a mask remembers per leaf bounds (widths._check_nests) passes exactly where
    walking every nest with the bound values passes, bind after bind (offsets near the int32 edges make some
    fail; binds that repeat values hit what earlier ones remembered)."""
    from maskc.analysis.bounds import NARROW_LIMIT, Bounds
    from maskc.analysis.widths import _REFUSED, TILE_PADDING, _check_nest, _check_nests

    compiled = maskc.compile_mask(text)
    ranges = compiled.ranges
    for i, (seq_len, kv_len, params) in enumerate(binds + binds):
        params = {**params, "o": offsets[i % len(offsets)]}
        try:
            bound = compiled.bind(seq_len, kv_len, **params)
        except BindError:
            continue
        element = bound.params.batch[0]

        def passes(check) -> bool:
            try:
                check(Bounds(element, seq_len, kv_len, 1, 0, NARROW_LIMIT, TILE_PADDING))
            except _REFUSED:
                return False
            return True

        walked = passes(lambda b: [_check_nest(r.chunks, b) for r in ranges.allow + ranges.deny
                                   if r.chunks is not None])
        assert passes(lambda b: _check_nests(ranges, b)) == walked


def test_a_remembered_pass_is_of_the_widened_bounds():
    """The memo of _Program.first_failing keeps a pass of the widened leaves (per-segment values rounded up to
    2**n - 1), never of the exact ones: a first bind whose exact values fit 32 bits but whose widened ones do not,
    then a second whose values (in the same power of two) do not fit, gets the narrow flag a fresh mask gives."""
    text = "mask m(docs: segments, t: per docs, c: int)\n  allow same(docs), k <= q + t(q) + c\n"
    remembering = maskc.compile_mask(text)
    seq_len = 64
    c = INT32_MAX - (2 ** 29 + 1) - (seq_len - 1 + 256) - (2 ** 28)   # q + t + c fits for t = 2**29 + 1 only
    for t in (2 ** 29 + 1, 2 ** 30 - 1):
        fresh = maskc.compile_mask(text).bind(seq_len, docs=[seq_len], t=[t], c=c)
        assert remembering.bind(seq_len, docs=[seq_len], t=[t], c=c).params.narrow == fresh.params.narrow
    assert not fresh.params.narrow
