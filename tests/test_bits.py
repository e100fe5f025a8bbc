"""Bit operations (& | ^ ~ << >>): parsed at Python's precedence and computed as Python computes them, in the
dense reference, in the normal form and in tile bounds; shift amounts checked where the file says them, and
at bind otherwise."""
from __future__ import annotations

import ast
import operator

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

import maskc
from maskc.analysis import bitops
from maskc.analysis import forms as F
from maskc.analysis import linear as L
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.rows import RowValues, TileIntervals

from conftest import tile_truth
from host_cxx import needs_gxx
from test_predicate import check_bound

OPS = ["+", "-", "*", "//", "%", "&", "|", "^", "<<", ">>"]


@st.composite
def python_expr(draw, depth: int = 3) -> str:
    """An integer expression in the syntax .mask shares with Python: a flat chain of operators (so that
    precedence decides the grouping), whose operands are positions, a parameter, literals, unary minus and
    invert, and parenthesized chains. Divisors are positive literals."""
    def operand(d):
        kind = draw(st.integers(0, 7 if d > 0 else 4))
        if kind <= 1:
            return draw(st.sampled_from(["q", "k", "a"]))
        if kind <= 3:
            return str(draw(st.sampled_from([0, 1, 2, 3, 5, 7, 8, 12, 15, 16, 31, 64])))
        if kind == 4:
            return draw(st.sampled_from(["-", "~"])) + draw(st.sampled_from(["q", "k", "a", "3"]))
        if kind == 5:
            return draw(st.sampled_from(["-", "~"])) + f"({chain(d - 1)})"
        return f"({chain(d - 1)})"

    def chain(d):
        out = operand(d)
        for _ in range(draw(st.integers(0, 3))):
            op = draw(st.sampled_from(OPS))
            right = str(draw(st.integers(1, 9))) if op in ("//", "%") else operand(d)
            out += f" {op} {right}"
        return out

    return chain(depth)


class _Huge(Exception):
    """A left shift whose result Python would build with more than ``_HUGE_SHIFT`` bits."""


_HUGE_SHIFT = 4096
_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod, ast.BitAnd: operator.and_, ast.BitOr: operator.or_, ast.BitXor: operator.xor,
           ast.LShift: operator.lshift, ast.RShift: operator.rshift}
_UNARY = {ast.USub: operator.neg, ast.Invert: operator.invert}


def _python(text: str, q: int, k: int, a: int):
    """Python's own value of ``text`` (its parser and its operators: the reference), None where Python refuses a
    negative shift count. A shift so wide that Python would allocate gigabytes raises _Huge instead."""
    names = {"q": q, "k": k, "a": a}

    def value(node):
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.Name):
            return names[node.id]
        if isinstance(node, ast.UnaryOp):
            return _UNARY[type(node.op)](value(node.operand))
        left, right = value(node.left), value(node.right)
        if isinstance(node.op, ast.LShift) and right > _HUGE_SHIFT and left != 0:
            raise _Huge(text)
        return _BINARY[type(node.op)](left, right)

    try:
        return value(ast.parse(text, mode="eval"))
    except ValueError:            # a negative shift count
        return None


def _bound_expr(text: str, seq_len: int, kv_len: int, a: int):
    """The resolved expression and the bound parameters, or None where maskc refuses the mask or the values
    (a constant shift past 62; bind: an intermediate or a shift amount that could leave its range)."""
    try:
        mask = maskc.compile_mask(f"mask m(a: int)\n  allow ({text}) == 0\n")
        bound = mask.bind(seq_len, kv_len, a=a)
    except maskc.MaskError:
        return None
    return mask.resolved.rules[0].cond.left, bound


@settings(max_examples=300, deadline=None)
@given(text=python_expr(), seq_len=st.integers(1, 12), kv_len=st.integers(1, 12), a=st.integers(-40, 40))
def test_expressions_evaluate_as_in_python(text, seq_len, kv_len, a):
    """Where maskc accepts the mask and the values, the dense reference and the normal form (what the range
    analysis and the kernels compute from) give Python's value at every pair; where Python refuses a pair (a
    negative shift count), maskc refuses the mask or the values."""
    try:
        want = [[_python(text, q, k, a) for k in range(kv_len)] for q in range(seq_len)]
    except _Huge:                 # a value of thousands of bits: maskc must refuse it (int64 at most)
        assert _bound_expr(text, seq_len, kv_len, a) is None, f"maskc accepted {text!r}, a value past int64"
        return
    found = _bound_expr(text, seq_len, kv_len, a)
    if any(v is None for row in want for v in row):
        assert found is None, f"maskc accepted {text!r}, where Python refuses a negative shift count"
        return
    assume(found is not None)
    expr, bound = found
    q, k = np.arange(seq_len)[:, None], np.arange(kv_len)[None, :]
    params = bound.params.batch[0]
    dense = np.broadcast_to(Evaluator(bound.mask.resolved, params, seq_len, kv_len).int(expr, q, k),
                            (seq_len, kv_len))
    assert dense.tolist() == want, text
    form = L.from_expr(expr)
    normal = np.broadcast_to(RowValues(params, seq_len, kv_len, 0, 0, q, k).lin(form), (seq_len, kv_len))
    assert normal.tolist() == want, f"{text} as {F.render(form)}"


@settings(max_examples=200, deadline=None)
@given(text=python_expr(), seq_len=st.integers(1, 30), kv_len=st.integers(1, 30), a=st.integers(-40, 40),
       bm=st.integers(1, 9), bn=st.integers(1, 9))
def test_tile_bounds_hold_every_value(text, seq_len, kv_len, a, bm, bn):
    """The interval bounds classification puts on a form over a tile contain its value at every pair."""
    found = _bound_expr(text, seq_len, kv_len, a)
    assume(found is not None)
    expr, bound = found
    params = bound.params.batch[0]
    form = L.from_expr(expr)
    lo, hi = TileIntervals(params, seq_len, kv_len, (0, 0), 0, bm, bn).lin(form)
    q, k = np.arange(seq_len)[:, None], np.arange(kv_len)[None, :]
    values = np.broadcast_to(RowValues(params, seq_len, kv_len, 0, 0, q, k).lin(form), (seq_len, kv_len))
    qt, kt = -(-seq_len // bm), -(-kv_len // bn)
    lo, hi = np.broadcast_to(lo, (qt, kt)), np.broadcast_to(hi, (qt, kt))
    for i in range(qt):
        for j in range(kt):
            tile = values[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            assert lo[i, j] <= tile.min() and tile.max() <= hi[i, j], (text, i, j)


_PY = {"&": lambda x, y: x & y, "|": lambda x, y: x | y, "^": lambda x, y: x ^ y, "<<": lambda x, y: x << y,
       ">>": lambda x, y: x >> y}


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(["&", "|", "^", "<<", ">>"]), st.integers(-2**20, 2**20), st.integers(0, 300),
       st.integers(-2**20, 2**20), st.integers(0, 300))
def test_interval_of_one_operation_is_sound(op, a0, da, b0, db):
    if op in ("<<", ">>"):
        b0, db = abs(b0) % 30, db % 8
    lo, hi = bitops.interval(op, (a0, a0 + da), (b0, b0 + db))
    rng = np.random.default_rng(abs(a0 * 31 + b0))
    xs = np.concatenate([[a0, a0 + da], rng.integers(a0, a0 + da + 1, 40)])
    ys = np.concatenate([[b0, b0 + db], rng.integers(b0, b0 + db + 1, 40)])
    values = [_PY[op](int(x), int(y)) for x in xs for y in ys]
    assert lo <= min(values) and max(values) <= hi
    if da == db == 0:
        assert lo == hi == values[0]


def test_constant_shifts_and_low_bit_masks_are_floors():
    """k >> 2, k & 3, k & -4, k | 3, k ^ 3 and k << 1 need no bit operation: the range analysis solves them."""
    for rule in ("k >> 2 == q >> 2", "k & 3 == q & 3", "k & -4 == q & -4", "k | 3 == q | 3", "k ^ 3 == q",
                 "k << 1 <= q", "(k >> 1) >> 2 == q >> 3"):
        mask = maskc.compile_mask(f"mask m()\n  allow {rule}\n")
        assert mask.exact, rule
        assert not any(isinstance(t, maskc.ir.Bits) for r in mask.normal.allow for a in r.atoms
                       for t in F.terms_of(a.lin)), rule
        bound = mask.bind(37, 29)
        np.testing.assert_array_equal(bound.tiles(4, 8), tile_truth(bound.dense(), 4, 8))


def test_other_bit_operations_of_k_are_sound_and_lint_says_why(tmp_path):
    from maskc.lint import lint_file
    text = "mask m()\n  allow (q ^ k) < 4, k & 5 != 0\n"
    mask = maskc.compile_mask(text)
    assert not mask.exact
    bound = mask.bind(64)
    got, truth = bound.tiles(8, 8), tile_truth(bound.dense(), 8, 8)
    assert not np.any((got != maskc.PARTIAL) & (got != truth))
    (tmp_path / "m.mask").write_text(text)
    [warning] = lint_file(tmp_path / "m.mask")
    assert warning.severity == "warning" and "a bit operation on k" in warning.message
    assert (warning.line, warning.col) in ((2, 9), (2, 22))          # at one of the two conditions


@pytest.mark.parametrize("text,amount,col", [("k >> 63", "63", 14), ("q << -1", "-1", 14),
                                             ("k >> (60 + 3)", "63", 15), ("1 << (2 - 5)", "-3", 15)])
def test_constant_shift_amount_out_of_range_is_a_located_error(text, amount, col):
    with pytest.raises(maskc.MaskError) as err:
        maskc.compile_mask(f"mask m()\n  allow {text} == 0\n")
    assert f"this one is {amount}" in err.value.message
    assert (err.value.span.line, err.value.span.col) == (2, col)


def test_shift_amount_is_proved_at_bind():
    mask = maskc.compile_mask("mask m(s: int)\n  allow k >> s == q >> s\n")
    assert mask.bind(16, s=3).dense().sum() > 0
    for s in (-1, 63, 1000):
        with pytest.raises(maskc.BindError, match="shift amount"):
            mask.bind(16, s=s)
    varying = maskc.compile_mask("mask m()\n  allow 1 << (q - 2) > k\n")
    with pytest.raises(maskc.BindError, match="shift amount .* can be -2"):
        varying.bind(8)
    wide = maskc.compile_mask("mask m(s: int)\n  allow k << s > q\n")
    with pytest.raises(maskc.BindError, match="64-bit"):
        wide.bind(16, s=62)


def test_const_shift_amount_is_checked_before_a_kernel_is_written():
    mask = maskc.compile_mask("mask m(s: const int = 70)\n  allow k >> s == q >> s\n")
    with pytest.raises(maskc.BindError, match="shift amount"):
        mask.kernel_spec()
    assert "(3)" in mask.kernel_spec(constants=(("s", 3),)).predicate.source


@needs_gxx
@pytest.mark.parametrize("text", ["mask m(a: int)\n  allow (k ^ q) & a == 0, k <= q\n",
                                  "mask m(a: int)\n  allow -k >> 1 < q - a, (k | q) % 3 != 0\n",
                                  "mask m(a: int)\n  allow 1 << (k % 40) > q << 30, ~k & q > a\n"])
def test_predicate_computes_bit_operations_in_64_bits(text):
    """The generated C (g++, with the kernels' 64-bit forms) against the dense reference, shifts past 32 bits
    included."""
    compiled = maskc.compile_mask(text)
    for a in (-3, 0, 5):
        check_bound(compiled, compiled.bind(50, 45, a=a))


def test_flex_mask_mod_computes_bit_operations():
    torch = pytest.importorskip("torch")
    bound = maskc.compile_mask("mask m(a: int)\n  allow (k ^ q) & a == 0, -k >> 1 < q\n").bind(40, a=6)
    q, k = torch.arange(40)[:, None], torch.arange(40)[None, :]
    got = bound.flex_mask_mod()(torch.tensor(0), torch.tensor(0), q, k)
    np.testing.assert_array_equal(np.broadcast_to(got.numpy(), (40, 40)), bound.dense())
