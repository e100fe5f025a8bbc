"""Resolve: names, arity and kinds checked at the user's text; lets and mask calls inlined."""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, strategies as st

import maskc
from maskc import ir
from maskc.errors import MaskError, MaskNameError, MaskTypeError

H = "mask m(window: int, docs: segments, t: per docs, e: segments)\n"


def _err(text, cls=MaskError, name=None, path="r.mask", **kw):
    with pytest.raises(cls) as info:
        maskc.compile_mask(text, name=name, path=path, **kw)
    err = info.value
    assert err.message and "Traceback" not in str(err)
    return err


def _at(err, line, col):
    assert err.span is not None, str(err)
    assert (err.span.line, err.span.col) == (line, col), str(err)
    assert str(err).startswith(f"{err.span.file}:{line}:{col}: error: ")


# -- unknown names, with hints ------------------------------------------------------------------

@pytest.mark.parametrize("text,line,col,unknown,suggest", [
    (H + "  allow k <= q, q - k < windw\n", 2, 25, "windw", "window"),
    (H + "  allow maxx(k, q) <= q\n", 2, 9, "maxx", "max"),
    (H + "  allow k < seq_lne\n", 2, 13, "seq_lne", "seq_len"),
    (H + "  let span = q - k\n  allow spn < window\n", 3, 9, "spn", "span"),
    (H + "  let f(i) = i + 1\n  allow fx(k) < q\n", 3, 9, "fx", "f"),
    (H + "  allow same(docz)\n", 2, 14, "docz", "docs"),
    ("mask sliding(w: int)\n  allow q - k < w\nmask m()\n  allow slidng(3)\n", 4, 9, "slidng", "sliding"),
    (H + "  allow t(k) < tt(q)\n", 2, 16, "tt", "t"),
])
def test_unknown_names_with_did_you_mean(text, line, col, unknown, suggest):
    err = _err(text, name="m")
    if line is not None:
        _at(err, line, col)
    if suggest is None:
        return
    assert isinstance(err, MaskNameError)
    assert f"'{unknown}'" in err.message
    assert err.hint == f"did you mean '{suggest}'?"
    assert str(err).endswith(f"hint: did you mean '{suggest}'?")


def test_an_unknown_name_in_same_is_an_unknown_name_and_the_hint_lists_the_segments():
    err = _err("mask a(d: segments)\n  allow same(docs)\n", MaskNameError)
    _at(err, 2, 14)
    assert err.message == "unknown name 'docs'" and err.hint == "its segments parameters: d"
    err = _err("mask a(w: int)\n  allow same(docs)\n", MaskNameError)
    assert "declares none" in err.hint
    assert "same() takes a segments parameter" in _err(H + "  allow same(q)\n", MaskTypeError).message


def test_no_hint_for_a_name_like_nothing():
    err = _err(H + "  allow k < zzzzzzzz\n", MaskNameError)
    assert err.hint is None


def test_segment_attribute_typo_hint():
    err = _err(H + "  allow docs.strat(q) <= k\n", MaskNameError)
    assert err.hint == "did you mean 'start'?"
    _at(err, 2, 9)


def test_method_on_non_segments_hint():
    err = _err(H + "  allow dcs.start(q) <= k\n", MaskNameError)
    assert err.hint == "did you mean 'docs'?"


# -- arity ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("call,fn", [
    ("min(k) <= q", "min"), ("max(k) <= q", "max"), ("abs(k, q) <= q", "abs"), ("abs() <= q", "abs"),
    ("clamp(k, q) <= q", "clamp"), ("clamp(k, 0, 1, 2) <= q", "clamp"),
    ("ceildiv(k) <= q", "ceildiv"), ("ceildiv(k, 2, 3) <= q", "ceildiv"),
    ("same(docs, docs, docs)", "same"), ("same()", "same"),
])
def test_builtin_arity(call, fn):
    err = _err(H + f"  allow {call}\n", MaskTypeError)
    assert f"{fn}()" in err.message
    _at(err, 2, 9)


def test_min_max_take_many_arguments():
    d = maskc.compile_mask("mask m()\n  allow k <= min(q, 5, q - 1 + 3, 7)\n").bind(10).dense()
    q, k = np.indices((10, 10))
    assert np.array_equal(d, k <= np.minimum(np.minimum(q, 5), np.minimum(q + 2, 7)))


@given(st.integers(-9, 9), st.integers(-9, 9), st.integers(1, 7), st.booleans(), st.integers(1, 40))
def test_ceildiv_is_the_ceiling_of_the_quotient(k_off, q_off, divisor, as_param, seq_len):
    """ceildiv(a, b) is the ceiling of a / b for every sign of a (the oracle: exact fractions), with b a number
    or a parameter; and over k by a constant its tiles are exact."""
    d = "d" if as_param else str(divisor)
    mask = maskc.compile_mask(f"mask m(d: int)\n  allow ceildiv(k + {k_off}, {d}) <= ceildiv(q + {q_off}, {d})\n")
    got = mask.bind(seq_len, d=divisor).dense()
    ceil = [math.ceil(Fraction(i + k_off, divisor)) for i in range(seq_len)], \
        [math.ceil(Fraction(i + q_off, divisor)) for i in range(seq_len)]
    assert np.array_equal(got, np.array(ceil[0])[None, :] <= np.array(ceil[1])[:, None])
    assert maskc.compile_mask(f"mask m()\n  allow ceildiv(k + {k_off}, {divisor}) == ceildiv(q, 4)\n").exact


def test_ceildiv_divisor_depending_on_position_rejected():
    err = _err(H + "  allow ceildiv(k, q + 1) <= q\n", MaskTypeError)
    assert "ceildiv()" in err.message and err.hint
    _at(err, 2, 20)


def test_builtin_keyword_argument_message_is_not_self_contradictory():
    err = _err("mask m(x: segments)\n  allow same(s=x)\n", MaskTypeError)
    assert "got 1" not in err.message


@pytest.mark.parametrize("body,line", [
    ("  let f(i) = i + 1\n  allow f(k, q) <= q\n", 3),
    ("  let f(i) = i + 1\n  allow f() <= q\n", 3),
    ("  let f(i, j) = i - j\n  allow f(k) <= q\n", 3),
    ("  let f(i) = i + 1\n  allow f(i=k) <= q\n", 3),
])
def test_let_function_arity(body, line):
    err = _err(H + body, MaskTypeError)
    assert "'f' takes" in err.message
    _at(err, line, 9)


def test_let_function_used_without_arguments():
    err = _err(H + "  let f(i) = i + 1\n  allow f <= q\n", MaskTypeError)
    assert err.hint == "write f(i)"


def test_let_value_called_is_an_error():
    _err(H + "  let x = 3\n  allow x(q) <= k\n", MaskError)


def test_lets_inline_with_lexical_scope():
    # the let's `w` is the parameter, not the function argument of the same name in the caller
    text = "mask m(w: int)\n  let d(i) = q - i\n  let f(w) = w + 1\n  allow k <= q, d(f(k) - 1) < w\n"
    d = maskc.compile_mask(text).bind(12, w=3).dense()
    q, k = np.indices((12, 12))
    assert np.array_equal(d, (k <= q) & (q - k < 3))


# -- segments attributes and per-arrays --------------------------------------------------------

@pytest.mark.parametrize("arg,col", [("q + 1", 20), ("window", 20), ("0", 20), ("docs.start(q)", 20)])
def test_segment_attribute_takes_a_position(arg, col):
    err = _err(H + f"  allow docs.start({arg}) <= k\n", MaskTypeError)
    assert "q or k" in err.message
    _at(err, 2, col)


@pytest.mark.parametrize("args", ["", "q, k", "p=q"])
def test_segment_attribute_arity(args):
    err = _err(H + f"  allow docs.end({args}) <= k\n", MaskTypeError)
    assert "one position" in err.message


def test_per_array_takes_a_position():
    err = _err(H + "  allow t(q + 1) <= k\n", MaskTypeError)
    assert "q or k" in err.message


def test_per_array_of_the_wrong_segments():
    text = ("mask inner(s: segments, v: per s)\n  allow same(s), v(q) <= k\n"
            "mask m(x: segments, y: segments, t: per x)\n  allow inner(y, t)\n")
    err = _err(text, MaskTypeError, name="m")
    assert "'t' is per x" in err.message and "per y" in err.message
    _at(err, 4, 9)


def test_per_array_of_the_right_segments_inlines():
    text = ("mask inner(s: segments, v: per s)\n  allow same(s), k <= q, q - k < v(q)\n"
            "mask m(x: segments, y: segments, t: per y)\n  allow inner(y, t)\n")
    c = maskc.compile_mask(text, name="m")
    d = c.bind(10, x=[10], y=[4, 6], t=[2, 3]).dense()
    q, k = np.indices((10, 10))
    seg = (q >= 4).astype(int)
    w = np.where(seg == 1, 3, 2)
    assert np.array_equal(d, (((k >= 4) == (q >= 4)) & (k <= q) & (q - k < w)))


def test_per_needs_segments_declared_before():
    err = _err("mask m(w: int, t: per w)\n  allow k <= q\n", MaskNameError)
    _at(err, 1, 16)
    err = _err("mask m(t: per dcs, docs: segments)\n  allow k <= q\n", MaskNameError)
    assert "'dcs'" in err.message


def test_segments_and_per_are_not_numbers():
    err = _err(H + "  allow docs <= k\n", MaskTypeError)
    assert "same(docs)" in err.hint
    err = _err(H + "  allow t <= k\n", MaskTypeError)
    assert err.hint == "use t(q)"


def test_same_takes_a_segments_parameter():
    err = _err(H + "  allow same(window)\n", MaskTypeError)
    _at(err, 2, 14)


# -- mask calls: self, imports, keywords, defaults ------------------------------------------------

def test_mask_calling_itself():
    err = _err("mask m()\n  allow k <= q or m()\n", MaskNameError)
    assert "'m' uses itself" in err.message


def test_masks_calling_each_other():
    err = _err("mask a()\n  allow b()\nmask b()\n  allow k <= q or a()\n", MaskNameError, name="a")
    assert "uses itself" in err.message


def test_let_cannot_recurse():
    _err("mask m()\n  let f(i) = f(i) + 1\n  allow f(k) <= q\n", MaskNameError)


def _files(tmp_path, **files):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def test_calling_a_mask_from_an_imported_file(tmp_path):
    _files(tmp_path,
           **{"other.mask": "mask win(w: int = 3, lag: int = 0)\n  require w >= 1\n  allow k <= q - lag, q - k < w\n",
              "main.mask": 'import "other.mask"\nmask m(a: int)\n  allow win(lag=1, w=a)\n',
              "dflt.mask": 'import "other.mask"\nmask m()\n  allow win()\n',
              "pos.mask": 'import "other.mask"\nmask m()\n  allow win(5)\n'})
    q, k = np.indices((20, 20))
    d = maskc.load(tmp_path / "main.mask").bind(20, a=4).dense()
    assert np.array_equal(d, (k <= q - 1) & (q - k < 4))
    d = maskc.load(tmp_path / "dflt.mask").bind(20).dense()
    assert np.array_equal(d, (k <= q) & (q - k < 3))
    d = maskc.load(tmp_path / "pos.mask").bind(20).dense()
    assert np.array_equal(d, (k <= q) & (q - k < 5))


def test_callee_require_is_not_inherited(tmp_path):
    _files(tmp_path, **{"other.mask": "mask win(w: int = 3)\n  require w >= 1\n  allow k <= q, q - k < w\n",
                        "main.mask": 'import "other.mask"\nmask m(a: int)\n  allow win(w=a)\n'})
    c = maskc.load(tmp_path / "main.mask")
    assert not c.resolved.requires
    assert not c.bind(8, a=0).dense().any()


def test_transitive_imports_and_relative_paths(tmp_path):
    (tmp_path / "lib").mkdir()
    _files(tmp_path, **{"lib/base.mask": "mask causal()\n  allow k <= q\n",
                        "lib/mid.mask": 'import "base.mask"\nmask doc(d: segments)\n  allow same(d), causal()\n',
                        "main.mask": 'import "lib/mid.mask"\nmask m(x: segments)\n  allow doc(x)\n  deny causal(), k == 0\n'})
    d = maskc.load(tmp_path / "main.mask").bind(9, x=[4, 5]).dense()
    q, k = np.indices((9, 9))
    assert np.array_equal(d, ((q >= 4) == (k >= 4)) & (k <= q) & ~(k == 0))


def test_import_cycle_terminates(tmp_path):
    _files(tmp_path, **{"a.mask": 'import "b.mask"\nmask m()\n  allow other()\n',
                        "b.mask": 'import "a.mask"\nmask other()\n  allow k <= q\n'})
    assert maskc.load(tmp_path / "a.mask").bind(5).dense().sum() == 15


def test_a_mask_defined_in_two_imported_files_is_ambiguous_where_called(tmp_path):
    # taking the first one found would make the mask depend on the order of the import lines
    _files(tmp_path, **{"future.mask": "mask near()\n  allow k >= q\n",
                        "past.mask": "mask near()\n  allow k <= q\n",
                        "main.mask": 'import "future.mask"\nimport "past.mask"\n\nmask m()\n  allow near()\n',
                        "own.mask": 'import "future.mask"\nimport "past.mask"\n\nmask near()\n  allow k == q\n'
                                    "mask m()\n  allow near()\n"})
    with pytest.raises(MaskNameError) as info:
        maskc.load(tmp_path / "main.mask")
    err = info.value
    assert "mask 'near' is defined in more than one imported file" in err.message, err.message
    assert "future.mask:1:6" in err.message and "past.mask:1:6" in err.message
    _at(err, 5, 9)
    # the importing file's own mask of that name is the one meant: no ambiguity
    assert maskc.load(tmp_path / "own.mask", name="m").bind(4).dense().sum() == 4


def test_an_imported_file_sees_only_what_it_imports(tmp_path):
    # two libraries, each with its own util.mask defining 'near': each library's call is to its own, not an
    # ambiguity (nor, before, whichever util.mask was read first)
    for lib, rule in (("a", "k <= q, q - k < 2"), ("b", "k == q")):
        (tmp_path / lib).mkdir()
        _files(tmp_path / lib, **{"util.mask": f"mask near()\n  allow {rule}\n",
                                  f"{lib}.mask": f'import "util.mask"\nmask {lib}_near()\n  allow near()\n'})
    _files(tmp_path, **{"main.mask": 'import "a/a.mask"\nimport "b/b.mask"\n\nmask m()\n  allow b_near()\n',
                        "lib.mask": "mask uses_main()\n  allow helper()\n",
                        "leak.mask": 'import "lib.mask"\nmask helper()\n  allow k <= q\nmask m()\n'
                                     "  allow uses_main()\n"})
    assert maskc.load(tmp_path / "main.mask").bind(4).dense().sum() == 4        # b's near: the diagonal
    # a library cannot call a mask of the file that imports it: it did not import it
    with pytest.raises(MaskNameError, match="unknown function or mask 'helper'") as info:
        maskc.load(tmp_path / "leak.mask", name="m")
    assert info.value.span.file == str(tmp_path / "lib.mask")
    assert info.value.hint == f"'helper' is a mask of {tmp_path / 'leak.mask'}, which this file does not import"


def test_mask_call_with_denies_inlines_them(tmp_path):
    _files(tmp_path, **{"o.mask": "mask o(w: int)\n  allow k <= q\n  deny q - k >= w\n",
                        "main.mask": 'import "o.mask"\nmask m()\n  allow o(2) or k == 0\n'})
    d = maskc.load(tmp_path / "main.mask").bind(8).dense()
    q, k = np.indices((8, 8))
    assert np.array_equal(d, ((k <= q) & (q - k < 2)) | (k == 0))


@pytest.mark.parametrize("call,cls,words", [
    ("win(wx=2)", MaskNameError, "no parameter 'wx'"),
    ("win(1, 2, 3)", MaskTypeError, "takes 2 argument(s)"),
    ("win(lag=1)", MaskTypeError, "needs its parameter 'w'"),
    ("win(docs)", MaskTypeError, "segments parameter, not a number"),
])
def test_imported_mask_call_errors(tmp_path, call, cls, words):
    _files(tmp_path, **{"other.mask": "mask win(w: int, lag: int = 0)\n  allow k <= q - lag, q - k < w\n",
                        "main.mask": f'import "other.mask"\nmask m(docs: segments)\n  allow {call}\n'})
    with pytest.raises(cls) as info:
        maskc.load(tmp_path / "main.mask")
    err = info.value
    assert words in err.message, err.message
    assert err.span.file == str(tmp_path / "main.mask") and err.span.line == 3
    if cls is MaskNameError:
        assert err.hint == "did you mean 'w'?"


def test_segments_argument_must_be_segments():
    text = "mask inner(s: segments)\n  allow same(s)\nmask m(w: int)\n  allow inner(s=w)\n"
    err = _err(text, MaskTypeError, name="m")
    _at(err, 4, 15)


# -- require, divisors, exponents ------------------------------------------------------------------

@pytest.mark.parametrize("req", ["k >= 0", "docs.start(k) >= 0", "t(k) < 3", "q - k < window",
                                 "min(k, q) >= 0"])
def test_require_using_k_rejected(req):
    err = _err(H + f"  require {req}\n  allow k <= q\n", MaskTypeError)
    assert "cannot use k" in err.message
    _at(err, 2, 3)


@pytest.mark.parametrize("expr,op", [("k // q", "//"), ("k % (q + 1)", "%"), ("k // docs.length(q)", "//"),
                                     ("k % t(q)", "%"), ("q // (k + 1)", "//")])
def test_divisor_depending_on_position_rejected(expr, op):
    err = _err(H + f"  allow {expr} == 0\n", MaskTypeError)
    assert f"'{op}'" in err.message and err.hint


def test_divisor_may_be_a_parameter():
    c = maskc.compile_mask("mask m(d: int)\n  allow k // d == q // d\n")
    d = c.bind(12, d=4).dense()
    q, k = np.indices((12, 12))
    assert np.array_equal(d, k // 4 == q // 4)


@pytest.mark.parametrize("expo", ["window", "q", "9", "-1", "(1 + 1)"])
def test_exponent_not_literal_rejected(expo):
    err = _err(H + f"  allow k ** {expo} <= q\n", MaskTypeError)
    assert "exponent" in err.message
    assert err.span.line == 2 and err.span.col >= 14


def test_exponent_zero_and_literal():
    d = maskc.compile_mask("mask m()\n  allow (q - k) ** 2 <= 4, k ** 0 == 1\n").bind(9).dense()
    q, k = np.indices((9, 9))
    assert np.array_equal(d, (q - k) ** 2 <= 4)


# -- declarations -----------------------------------------------------------------------------------

def test_duplicate_params():
    err = _err("mask m(a: int, docs: segments, a: int)\n  allow k <= q\n", MaskNameError)
    assert "'a' is declared twice" in err.message
    _at(err, 1, 32)


@pytest.mark.parametrize("p", ["q", "k", "seq_len", "kv_len", "h", "b"])
def test_builtin_cannot_be_a_parameter(p):
    err = _err(f"mask m(w: int, {p}: int)\n  allow k <= q\n", MaskNameError)
    _at(err, 1, 16)


@pytest.mark.parametrize("name", ["num_heads", "self"])
def test_a_parameter_cannot_take_a_name_bind_takes_for_itself(name):
    # bind(num_heads=3) set the heads and the parameter kept its default; bind(self=3) was a TypeError
    err = _err(f"mask m({name}: int = 2)\n  allow k <= q, q - k < {name}\n", MaskNameError)
    assert f"'{name}' is " in err.message and "cannot be a parameter" in err.message
    _at(err, 1, 8)


def test_let_cannot_shadow_a_parameter_or_builtin():
    err = _err("mask m(w: int)\n  let w = 3\n  allow k <= q\n", MaskNameError)
    assert "parameter" in err.message
    err = _err("mask m(w: int)\n  let q = 3\n  allow k <= q\n", MaskNameError)
    assert "built-in" in err.message


def test_a_let_defined_twice_is_an_error():
    # the second one replaced the first for every rule, even those written above it, silently
    err = _err("mask m()\n  let x = 1\n  allow k <= q + x\n  let x = 2\n  allow k == x\n", MaskNameError)
    assert "'x' is defined twice in mask 'm' (first at line 2)" in err.message
    _at(err, 4, 7)
    err = _err("mask m()\n  let f(i, i) = i\n  allow k <= f(q, q)\n", MaskNameError)
    assert "'f' names its argument 'i' twice" in err.message


@pytest.mark.parametrize("call,count", [("same(d, d, d)", "1 to 2"), ("min(q)", "at least 2"),
                                        ("clamp(q, 0)", "3"), ("abs()", "1")])
def test_builtin_arity_errors_give_the_range_taken(call, count):
    # same() with three arguments said it takes 'at least 1'
    err = _err(f"mask m(d: segments)\n  allow k <= q, {call} >= 0\n" if "same" not in call
               else f"mask m(d: segments)\n  allow {call}\n", MaskTypeError)
    assert f"takes {count} positional argument(s)" in err.message, err.message


def test_a_mask_name_not_in_the_file_lists_the_masks_it_has():
    text = "mask causal()\n  allow k <= q\nmask window(w: int)\n  allow k <= q, q - k < w\n"
    assert _err(text, MaskNameError, name="casual").hint == "did you mean 'causal'?"
    assert _err(text, MaskNameError, name="document").hint == "its masks: causal, window"   # had no hint
    assert _err("", MaskNameError, name="m").hint == "it defines no mask"


def test_duplicate_mask():
    err = _err("mask m()\n  allow k<=q\nmask m()\n  allow k<=q\n", MaskNameError, name="m")
    _at(err, 3, 6)


@pytest.mark.parametrize("body", ["  deny k <= q\n", "  require w >= 0\n", "  let x = 3\n  deny k == x\n"])
def test_mask_with_no_allow(body):
    err = _err("mask m(w: int)\n" + body)
    assert "no 'allow'" in err.message
    _at(err, 1, 6)


def test_constant_default_expression_is_folded():
    c = maskc.compile_mask("mask m(a: int = 2 + 3 * 2)\n  allow k <= a\n")
    assert c.params[0].default == 8


@pytest.mark.parametrize("decl,words", [("w: int, a: int = w", "a default must be a number"),
                                        ("s: segments = 3", "no default"),
                                        ("s: segments from q", "cannot depend"),
                                        ("s: segments from a, a: int", "unknown name 'a'")])
def test_parameter_declaration_errors(decl, words):
    err = _err(f"mask m({decl})\n  allow k <= q\n")
    assert words in err.message and err.span.line == 1


def test_negative_default_is_a_plain_number():
    c = maskc.compile_mask("mask m(a: int = -2)\n  allow k <= q + a\n")
    assert c.params[0].default == -2


def test_conditions_and_numbers_are_distinct():
    err = _err(H + "  allow k + 1\n", MaskTypeError)
    assert "not a condition" in err.message
    err = _err(H + "  allow (k < q) + 1 < 3\n", MaskTypeError)
    assert "found a condition" in err.message


def test_several_masks_need_a_name():
    text = "mask a()\n  allow k <= q\nmask c()\n  allow k >= q\n"
    _err(text, MaskNameError)
    err = _err(text, MaskNameError, name="cc")
    assert err.hint == "did you mean 'c'?"
    assert maskc.compile_mask(text, name="c").name == "c"


def test_resolved_has_only_builtins_and_own_params():
    c = maskc.load(maskc.resources.data_dir("examples") / "hstu.mask")
    names = {p.name for p in c.params}

    def walk(n):
        if isinstance(n, ir.ParamRef):
            assert n.name in names
        if isinstance(n, (ir.SegAttr, ir.Same)):
            assert n.seg in names
        for v in getattr(n, "__dict__", {}).values():
            for x in (v if isinstance(v, tuple) else (v,)):
                if hasattr(x, "__dataclass_fields__"):
                    walk(x)
    for r in c.resolved.rules:
        walk(r.cond)


@pytest.mark.parametrize("expr,col", [("k // 0", 14), ("k % -2", 13), ("k // (3 - 3)", 15), ("ceildiv(k, 0)", 20),
                                      ("q // ((1 - 2) * 4)", 15)])
def test_divisor_that_is_a_number_must_be_positive(expr, col):
    err = _err(H + f"  allow {expr} == 0\n", MaskTypeError)
    assert "must be positive" in err.message
    _at(err, 2, col)
