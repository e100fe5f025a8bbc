"""Score modifiers (``score = ...``): the language's errors, the numpy reference against independent
implementations and finite differences, the generated device code (compiled by g++ on the CPU) against the
reference on random modifiers, the Flex score_mod, and what the kernels are given."""
import ctypes
import math
import re

import numpy as np
import pytest
from hypothesis import assume, given, settings, strategies as st

import maskc
from maskc.analysis.score import ScoreEvaluator
from maskc.runtime.reference import reference_attention, reference_attention_backward
from conftest import EXAMPLES, example_score_mod
from host_cxx import build_library, needs_gxx



def compile_text(text: str, name=None):
    return maskc.compile_mask(text, name, path="t.mask")


# ---- errors: file:line:col, a caret, plain words ------------------------------------------------------

@pytest.mark.parametrize("text,where,words", [
    ("mask a()\n  allow k <= q\n  x = 3\n", "t.mask:3:3", "only 'score' can be assigned"),
    ("mask a()\n  allow k <= 2.5\n", "t.mask:2:14", "masks compute on integers"),
    ("mask a()\n  allow k <= q / 2\n", "t.mask:2:14", "'/' divides floats"),
    ("mask a(c: float)\n  allow k <= c\n", "t.mask:2:14", "float parameter: only a score modifier"),
    ("mask a()\n  allow k <= q\n  score = softcap(score)\n", "t.mask:3:11", "softcap() takes 2 argument"),
    ("mask a()\n  allow k <= q\n  score = score / score\n", "t.mask:3:19", "right side of '/' cannot read"),
    ("mask a()\n  allow k <= q\n  score = score // 2\n", "t.mask:3:11", "'//' takes integers"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, score)\n", "t.mask:3:26", "cap cannot read the score"),
    ("mask a(d: segments)\n  allow k <= q\n  score = score + d.start(q)\n", "t.mask:3:19",
     "do not read segments"),
    ("mask a(t: table)\n  allow k <= q, t[0] >= 0\n  score = score + t[q]\n", "t.mask:3:19", "do not read int tables"),
    ("mask a()\n  allow k <= q\n  score = score + (q & k)\n", "t.mask:3:20", "bit operations"),
    ("mask a(d: segments, s: float per d)\n  allow k <= q\n", "t.mask:1:21", "float per d"),
    ("mask a(score: int)\n  allow k <= q\n  score = score * 2.0\n", "t.mask:1:8", "'score' names the score"),
    ("mask a(t: float table)\n  allow k <= q\n  score = score + t\n", "t.mask:3:19", "a float table, not a number"),
    ("mask a(c: float = q)\n  allow k <= q\n", "t.mask:1:19", "a float default must be a number"),
    ("mask a(t: float table)\n  allow k <= q\n  score = score + t[q, k]\n", "t.mask:3:19", "takes one index"),
    ("mask a()\n  allow k <= q\n  score = score + (k < 2)\n", "t.mask:3:20", "found a condition"),
    # softcap's cap divides the score: a number <= 0 is refused where it is written (parameters: at bind)
    ("mask a()\n  allow k <= q\n  score = softcap(score, 0)\n", "t.mask:3:26", "softcap's cap is 0"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, 0.0)\n", "t.mask:3:26", "must be positive"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, -30.0)\n", "t.mask:3:26", "softcap's cap is -30"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, 2 * 3 - 6)\n", "t.mask:3:26", "softcap's cap is 0"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, 1.5 - 2.5)\n", "t.mask:3:26", "softcap's cap is -1"),
    ("mask a()\n  allow k <= q\n  score = softcap(score, q - k + 1)\n", "t.mask:3:26",
     "softcap's cap cannot depend on q or k"),
    # a float division by a number that is 0 (inf or NaN on every pair)
    ("mask a()\n  allow k <= q\n  score = score / 0.0\n", "t.mask:3:19", "division by zero"),
    ("mask a()\n  allow k <= q\n  score = score * (1.0 / (2 - 2))\n", "t.mask:3:27", "division by zero"),
    # a divisor that is 0 at a pair every binding computes, visible or hidden (kernels compute whole tiles)
    ("mask a()\n  allow k <= q\n  score = score / (q - k)\n", "t.mask:3:20", "is 0 at q = 0, k = 0"),
    ("mask a()\n  allow k < q\n  score = score / (q - k)\n", "t.mask:3:20", "is 0 at q = 0, k = 0"),
    ("mask a()\n  allow k <= q\n  score = score / (q - 2 * k + 3)\n", "t.mask:3:20", "is 0 at q = 1, k = 2"),
    ("mask a()\n  allow k <= q\n  score = score * tanh(1.0 / tanh(k - 7))\n", "t.mask:3:30", "is 0 at k = 7"),
    ("mask a()\n  allow k <= q\n  score = score / h\n", "t.mask:3:19", "is 0 at h = 0"),
    # a literal past float32's range (inf in the kernels, NaN after the softmax), in the section and as a default
    ("mask a()\n  allow k <= q\n  score = score * 1e40\n", "t.mask:3:19", "outside float32's range"),
    ("mask a(c: float = -1e39)\n  allow k <= q\n  score = score * c\n", "t.mask:1:20", "outside float32's range"),
])
def test_errors_point_at_the_text(text, where, words):
    with pytest.raises(maskc.MaskError) as err:
        compile_text(text)
    message = str(err.value)
    assert message.startswith(where), message
    assert words in message, message
    assert "^" in message and "Traceback" not in message


def test_a_call_of_a_mask_with_a_modifier_takes_its_rules_alone():
    m = compile_text("mask soft(c: float = 2.0)\n  allow k <= q\n  score = softcap(score, c)\n"
                     "mask user()\n  allow soft()\n", "user")
    assert m.resolved.score is None
    with pytest.raises(maskc.MaskError, match="is a float: only its score modifier reads it"):
        compile_text("mask soft(c: float = 2.0)\n  allow k <= q\n  score = softcap(score, c)\n"
                     "mask user()\n  allow soft(c=3)\n", "user")


@pytest.mark.parametrize("params,words", [
    ({}, "with num_heads="),
    ({"num_heads": 2, "slope": [0.5]}, "one per head, but num_heads = 2"),
    ({"num_heads": 1, "slope": [math.inf]}, "finite number"),
    ({"num_heads": 1, "slope": ["a"]}, "finite number"),
    ({"num_heads": 1, "slope": 0.5}, "a list of floats"),
])
def test_bind_checks_float_values(params, words):
    with pytest.raises(maskc.BindError, match=words):
        maskc.load(EXAMPLES / "alibi.mask").bind(seq_len=8, **params)


@pytest.mark.parametrize("header,cap,values,words", [
    ("c: float = 50.0", "c", {"c": 0.0}, "'c' = 0.0"),
    ("c: float = 50.0", "c", {"c": -2.5}, "'c' = -2.5"),
    ("c: int", "c", {"c": 0}, "'c' = 0"),
    ("c: float per h = 1.0", "c", {"num_heads": 3, "c": [1.0, 2.0, -1.0]}, "'c' = -1.0 at head 2"),
    ("c: float, d: float", "c - d", {"c": 1.0, "d": 1.0}, "'c' = 1.0, 'd' = 1.0"),
])
def test_bind_refuses_a_cap_that_is_not_positive(header, cap, values, words):
    """A cap read from parameters is checked when they are known: a BindError naming them and their values,
    pointing at the cap in the source."""
    m = compile_text(f"mask a({header})\n  allow k <= q\n  score = softcap(score, {cap})\n")
    with pytest.raises(maskc.BindError) as err:
        m.bind(seq_len=8, **values)
    message = str(err.value)
    assert words in message and "softcap's cap" in message and "must be positive" in message, message
    assert message.startswith("t.mask:3:26"), message


@settings(max_examples=60, deadline=None)
@given(st.one_of(st.floats(-100, 100, allow_nan=False), st.sampled_from([0.0, -0.0, 1e-30, -1e-30])))
def test_a_cap_binds_exactly_when_positive_and_the_reference_is_then_finite(cap):
    m = maskc.load(EXAMPLES / "softcap.mask")
    if cap <= 0:
        with pytest.raises(maskc.BindError, match="must be positive"):
            m.bind(seq_len=16, cap=cap)
        return
    bound = m.bind(seq_len=16, cap=cap)
    rng = np.random.default_rng(0)
    q, k, v = (rng.normal(size=(1, 1, 16, 8)) for _ in range(3))
    assert np.isfinite(reference_attention(q, k, v, bound)).all()


@pytest.mark.parametrize("header,divisor,values,words", [
    ("c: float", "c", {"c": 0.0}, "is 0 with 'c' = 0.0; a divisor must not be 0"),
    ("c: float", "(c - 1.5)", {"c": 1.5}, "is 0 with 'c' = 1.5"),
    ("w: int", "w", {"w": 0}, "is 0 with 'w' = 0"),
    ("s: float per h", "s", {"num_heads": 3, "s": [1.0, 0.0, 2.0]}, "is 0 with 's' = 0.0 at head 1"),
    ("w: int", "(q - w)", {"w": 5}, "may be 0: it spans [-5, 259] for q in [0, 264] and k in [0, 264]"),
    ("t: float table", "t[q - k]", {"t": [1.0, 0.0, 2.0]}, "may be 0"),
    ("", "(seq_len - q)", {}, "may be 0"),
])
def test_bind_refuses_a_divisor_that_can_be_0(header, divisor, values, words):
    """A divisor read from parameters or lengths is checked at bind, over every position the kernels compute (a
    tile past the ends), hidden pairs included: a BindError at the divisor."""
    m = compile_text(f"mask a({header})\n  allow k <= q\n  score = score / {divisor}\n")
    with pytest.raises(maskc.BindError) as err:
        m.bind(seq_len=8, **values)
    message = str(err.value)
    assert message.startswith(f"t.mask:3:{19 + divisor.startswith('(')}"), message    # inside the parentheses
    assert words in message and "right side of '/'" in message and "^" in message, message


@pytest.mark.parametrize("header,divisor,values", [
    ("", "max(q - k, 1)", {}),
    ("", "(abs(q - k) + 1)", {}),
    ("", "(q * k + 1)", {}),
    ("", "(q - 300)", {}),                           # 0 only at q = 300, past this binding's last tile
    ("s: float per h", "s", {"num_heads": 2, "s": [0.5, -0.5]}),   # each head's own value, not their range
    ("t: float table", "t[q - k]", {"t": [1.0, 3.0, 2.0]}),
    ("c: float", "softcap(q + 1, c)", {"c": 2.0}),
])
def test_bind_takes_a_divisor_that_is_never_0(header, divisor, values):
    compile_text(f"mask a({header})\n  allow k <= q\n  score = score / {divisor}\n").bind(seq_len=8, **values)


def _divisors():
    """(text, numpy function of q, k and c) of random divisors: linear forms, wrapped."""
    linear = st.tuples(st.integers(-3, 3), st.integers(-3, 3), st.integers(-4, 300)).map(
        lambda t: (f"({t[0]} * q + {t[1]} * k + {t[2]})", lambda q, k, c, t=t: t[0] * q + t[1] * k + t[2]))
    return st.one_of(
        linear,
        linear.map(lambda f: (f"(abs{f[0]} + 1)", lambda q, k, c, f=f: np.abs(f[1](q, k, c)) + 1)),
        linear.map(lambda f: (f"max({f[0]}, 1)", lambda q, k, c, f=f: np.maximum(f[1](q, k, c), 1))),
        linear.map(lambda f: (f"({f[0]} // 4)", lambda q, k, c, f=f: f[1](q, k, c) // 4)),
        linear.map(lambda f: (f"({f[0]} + c)", lambda q, k, c, f=f: f[1](q, k, c) + c)),
        linear.map(lambda f: (f"tanh{f[0]}", lambda q, k, c, f=f: np.tanh(f[1](q, k, c)))))


@settings(max_examples=80, deadline=None)
@given(_divisors(), st.sampled_from([0.0, 0.5, -1.0, 2.0]), st.integers(1, 40))
def test_a_divisor_is_taken_only_where_no_computed_pair_makes_it_0(divisor, c, seq_len):
    """Against brute force over every position the kernels may compute (a tile past the ends): a divisor that is
    0 anywhere there is refused (at compile time with a pair where it is 0, or at bind); one that is taken is 0
    nowhere there, so no pair, hidden or visible, divides by 0."""
    text, f = divisor
    q, k = np.arange(seq_len + 257)[:, None], np.arange(seq_len + 257)[None, :]
    zero_somewhere = bool(np.any(f(q, k, c) == 0))
    try:
        compile_text(f"mask a(c: float)\n  allow k <= q\n  score = score / {text}\n").bind(seq_len=seq_len, c=c)
    except maskc.MaskError as err:
        message = str(err)
        assert "right side of '/'" in message and "^" in message, message
        witness = re.search(r"is 0 at q = (\d+), k = (\d+)", message)
        if witness:
            assert f(int(witness[1]), int(witness[2]), c) == 0, message
        return
    assert not zero_somewhere, text


def test_bind_refuses_integer_parts_past_32_bits():
    m = compile_text("mask a()\n  allow k <= q\n  score = score + q * k * 1000\n")
    m.bind(seq_len=100)
    with pytest.raises(maskc.BindError, match="past 32 bits"):
        m.bind(seq_len=5000)


# ---- the reference against independent implementations ----------------------------------------------

def independent_attention(q, k, v, visible, mod, scale):
    """softmax(mod(scale q k^T) | visible) v for one head, from the definition."""
    s = q @ k.T * scale
    rows, cols = np.arange(s.shape[0])[:, None], np.arange(s.shape[1])[None, :]
    s = np.where(visible, mod(s, rows, cols), -np.inf)
    p = np.exp(s - s.max(1, keepdims=True))
    return (p / p.sum(1, keepdims=True)) @ v


BIAS_MASK = """mask biased(bias: float table, cap: float = 4.0, w: int = 3)
  allow k <= q, q - k < 40
  score = softcap(score + bias[(q - k) // w], cap) * 0.5 - score * score / 8.0
"""


def cases():
    rng = np.random.default_rng(5)
    bias = rng.normal(size=7).tolist()         # (q - k) // 3 reaches 13: indices past 6 read the last entry
    return [
        ("alibi", maskc.load(EXAMPLES / "alibi.mask"), {"num_heads": 2, "slope": [0.5, 0.125]},
         example_score_mod("alibi", {"slope": [0.5, 0.125]})),
        ("softcap", maskc.load(EXAMPLES / "softcap.mask"), {"cap": 1.5}, example_score_mod("softcap", {"cap": 1.5})),
        ("biased", compile_text(BIAS_MASK), {"bias": bias},
         lambda s, h, q, k: np.tanh((s + np.asarray(bias)[np.minimum((q - k) // 3, 6).clip(0)]) / 4.0) * 2.0
         - s * s / 8.0),
    ]


@pytest.mark.parametrize("case", range(3))
def test_reference_forward_is_the_definition(case):
    name, mask, params, mod = cases()[case]
    S, D = 45, 8
    bound = mask.bind(seq_len=S, **params)
    rng = np.random.default_rng(case)
    q, k, v = (rng.normal(size=(1, 2, S, D)) for _ in range(3))
    got = reference_attention(q, k, v, bound, scale=0.7)
    for h in range(2):
        want = independent_attention(q[0, h], k[0, h], v[0, h], bound.dense(0, h if bound.num_heads else 0),
                                     lambda s, r, c: mod(s, h, r, c), 0.7)
        np.testing.assert_allclose(got[0, h], want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("case", range(3))
def test_reference_backward_is_the_derivative(case):
    """Central finite differences of <dO, attention(q, k, v)> at random entries of q, k and v."""
    name, mask, params, _ = cases()[case]
    S, D = 23, 4
    bound = mask.bind(seq_len=S, **params)
    rng = np.random.default_rng(10 + case)
    q, k, v, dout = (rng.normal(size=(1, 2, S, D)) for _ in range(4))
    grads = reference_attention_backward(q, k, v, dout, bound, scale=0.6)
    loss = lambda q, k, v: float((reference_attention(q, k, v, bound, scale=0.6) * dout).sum())  # noqa: E731
    eps = 1e-6
    for which in range(3):
        for _ in range(12):
            at = tuple(int(rng.integers(0, n)) for n in q.shape)
            args = [q, k, v]
            plus, minus = [a.copy() for a in args], [a.copy() for a in args]
            plus[which][at] += eps
            minus[which][at] -= eps
            numeric = (loss(*plus) - loss(*minus)) / (2 * eps)
            assert abs(grads[which][at] - numeric) <= 1e-6 * max(1.0, abs(numeric)), (name, which, at)


# ---- random modifiers: derivative, generated C (g++), Flex -------------------------------------------

def _expr(depth):
    leaves = st.sampled_from(["score", "score", "c", "sl", "t[q - k]", "(q - k)", "1.5", "((q - 2 * k) // 3)"])
    if depth == 0:
        return leaves
    sub = _expr(depth - 1)
    return st.one_of(
        leaves,
        st.tuples(sub, st.sampled_from(["+", "-", "*"]), sub).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
        st.tuples(sub, st.sampled_from(["c", "2.0", "(1.0 + sl)"])).map(lambda t: f"({t[0]} / {t[1]})"),
        sub.map(lambda e: f"softcap({e}, c)"),
        sub.map(lambda e: f"tanh({e})"),
        sub.map(lambda e: f"-{e}"))


RANDOM_HEADER = "mask r(c: float = 2.5, sl: float per h = 0.25, t: float table)\n  allow k <= q + 3\n"
RANDOM_VALUES = {"num_heads": 2, "sl": [0.25, 0.75], "t": [0.5, -1.0, 0.25, 2.0]}


def _random_mask(statements):
    return compile_text(RANDOM_HEADER + "".join(f"  score = {s}\n" for s in statements))


@settings(max_examples=40, deadline=None)
@given(st.lists(_expr(3), min_size=1, max_size=2))
def test_reference_derivative_is_the_slope(statements):
    bound = _random_mask(statements).bind(seq_len=9, **RANDOM_VALUES)
    x = np.random.default_rng(0).uniform(-2, 2, (9, 9))
    q, k = np.arange(9)[:, None], np.arange(9)[None, :]
    ev = ScoreEvaluator(bound.mask.resolved, bound.params.batch[0], 9, 9, 1, 0)
    value, slope = ev(x, q, k)
    eps = 1e-6
    numeric = (ev(x + eps, q, k)[0] - ev(x - eps, q, k)[0]) / (2 * eps)
    np.testing.assert_allclose(slope, numeric, rtol=1e-5, atol=1e-5)
    assert value.shape == (9, 9)


SHIM = """\
#include <algorithm>
#include <cmath>
#include <cstring>
#define __device__
#define __forceinline__ inline
#define __restrict__
using std::min; using std::max;
static inline float __int_as_float(int x) { float f; std::memcpy(&f, &x, 4); return f; }
static inline float maskc_tanh(float x) { return std::tanh(x); }
"""
LOOP = """
extern "C" void score_fill(const int* mask, int b, int h, float scale, int seq_len, int kv_len, const float* s,
                           float* out, float* slope, float* plain) {
    const ScoreHead c = score_head(mask, b, h, scale);
    for (int q = 0; q < seq_len; ++q)
        for (int k = 0; k < kv_len; ++k) {
            const int i = q * kv_len + k;
            out[i] = score_mod_grad(c, mask, s[i], q, k, (float)q, (float)k, slope[i]);
            plain[i] = score_mod(c, mask, s[i], q, k, (float)q, (float)k);
        }
}
"""
LOOP_FORWARD = """
extern "C" void score_fill_forward(const int* mask, int b, int h, float scale, int seq_len, int kv_len, int origin,
                                   const float* s, float* forward, float* row) {
    const ScoreHead c = score_head(mask, b, h, scale);
    for (int q = 0; q < seq_len; ++q) {
        row[q] = score_row(c, mask, q, (float)q, (float)origin);
        for (int k = 0; k < kv_len; ++k)
            forward[q * kv_len + k] = score_mod_fwd(c, mask, s[q * kv_len + k], q, k, (float)q, (float)k,
                                                    (float)(k - origin)) * score_unit(c);
    }
}
extern "C" float unit_of(const int* mask, int b, int h, float scale) {
    return score_unit(score_head(mask, b, h, scale));
}
"""
def compile_score(source: str):
    forward = "score_mod_fwd" in source
    lib = build_library(SHIM + source + LOOP + (LOOP_FORWARD if forward else ""), "the score code")
    f32 = np.ctypeslib.ndpointer(np.float32, flags="C_CONTIGUOUS")
    lib.score_fill.argtypes = [np.ctypeslib.ndpointer(np.int32), ctypes.c_int, ctypes.c_int, ctypes.c_float,
                               ctypes.c_int, ctypes.c_int, f32, f32, f32, f32]
    if forward:
        lib.score_fill_forward.argtypes = [np.ctypeslib.ndpointer(np.int32), ctypes.c_int, ctypes.c_int, ctypes.c_float,
                                           ctypes.c_int, ctypes.c_int, ctypes.c_int, f32, f32, f32]
        lib.unit_of.argtypes = [np.ctypeslib.ndpointer(np.int32), ctypes.c_int, ctypes.c_int, ctypes.c_float]
        lib.unit_of.restype = ctypes.c_float
    return lib


def forward_scores(lib, table, x_raw: np.ndarray, head: int, scale: float, origin: int) -> np.ndarray:
    """What the forward's softmax sees, in natural units: score_mod_fwd's scores times score_unit (the factor the
    softmax's scale takes) plus score_row per row (the generated code through g++)."""
    S, K = x_raw.shape
    forward, row = np.zeros((S, K), np.float32), np.zeros(S, np.float32)
    lib.score_fill_forward(table, 0, head, scale, S, K, origin, np.ascontiguousarray(x_raw, np.float32), forward, row)
    return forward.astype(np.float64) * scale + row.astype(np.float64)[:, None]


def device_scores(bound, offsets: bool, x: np.ndarray, head: int, scale: float):
    """(mod, mod') from the generated code run by g++, in the kernels' units (raw s in; x = scale * s)."""
    spec = bound.kernel_spec(head_dim=64)
    source = spec.predicate.source + spec.score.code          # helpers but tanh.approx: the shim's
    lib = compile_score(source)
    data, starts = bound.descriptor(64, 64).mask_data, bound.descriptor(64, 64).mask_offsets
    S, K = x.shape
    s = np.ascontiguousarray(x / scale, np.float32)
    out, slope, plain = (np.zeros((S, K), np.float32) for _ in range(3))
    lib.score_fill(np.ascontiguousarray(data[starts[0]:], np.int32), 0, head, scale, S, K, s, out, slope, plain)
    np.testing.assert_array_equal(out, plain)                   # score_mod and score_mod_grad agree
    return out.astype(np.float64) * scale, slope.astype(np.float64)


@needs_gxx
@settings(max_examples=25, deadline=None)
@given(st.lists(_expr(2), min_size=1, max_size=2), st.sampled_from([0.125, 0.3, 1.0]))
def test_generated_code_computes_the_reference(statements, scale):
    bound = _random_mask(statements).bind(seq_len=11, **RANDOM_VALUES)
    x = np.random.default_rng(1).uniform(-2, 2, (11, 11)).astype(np.float32).astype(np.float64)
    x = (x / scale).astype(np.float32).astype(np.float64) * scale     # what a float32 raw score can be
    q, k = np.arange(11)[:, None], np.arange(11)[None, :]
    for head in (0, 1):
        want, want_slope = ScoreEvaluator(bound.mask.resolved, bound.params.batch[0], 11, 11, head, 0)(x, q, k)
        got, got_slope = device_scores(bound, False, x, head, scale)
        size = max(1.0, np.abs(want).max())
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * size)
        np.testing.assert_allclose(got_slope, want_slope, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want_slope).max()))


@needs_gxx
@settings(max_examples=25, deadline=None)
@given(_expr(2), st.lists(st.tuples(st.sampled_from(["+", "-"]), st.sampled_from(
           ["sl * (q - k)", "(k - q) * c", "(q - k)", "sl * (2 * q - 3 * k + 1)", "sl * q", "c", "1.5", "t[q - k]",
            "((q - 2 * k) // 3)", "sl * (q + 2)"])), min_size=1, max_size=3),
       st.sampled_from([0.125, 0.3, 1.0]), st.integers(0, 10))
def test_forward_scores_and_row_terms_add_up_to_the_modifier(first, shifts, scale, origin):
    """Where the forward leaves a modifier's per-row terms out of its scores (score_mod_fwd), the terms it adds
    back per row (score_row) make up the modified score exactly as the reference computes it, from any origin."""
    statements = [first, "score" + "".join(f" {op} {term}" for op, term in shifts)]   # a top chain of shifts
    bound = _random_mask(statements).bind(seq_len=11, **RANDOM_VALUES)
    spec = bound.kernel_spec(head_dim=64)
    assume(spec.score.row_terms)
    _check_forward_scores(bound, spec, scale, origin)


@needs_gxx
@settings(max_examples=25, deadline=None)
@given(_expr(2), st.sampled_from(["+", "-", "*"]), st.sampled_from(["c", "2.0", "sl", "(sl + 1.0)"]),
       st.sampled_from([0.125, 0.3, 1.0]), st.integers(0, 10))
def test_forward_scores_of_a_softcap_leave_its_factor_to_the_softmax(inner, op, cap, scale, origin):
    """Where the whole modifier is softcap(...) of the score, the forward's scores leave out its factor
    cap / scale, which score_unit gives back; together they are the modified score as the reference computes it."""
    bound = _random_mask([f"softcap(score {op} {inner}, {cap})"]).bind(seq_len=11, **RANDOM_VALUES)
    spec = bound.kernel_spec(head_dim=64)
    assert spec.score.unit and not spec.score.row_terms
    _check_forward_scores(bound, spec, scale, origin)


@needs_gxx
def test_a_negative_cap_written_on_the_device_keeps_the_softcap():
    """A device update can write any float into a cap (bind checks it, the device does not): cap * tanh(x / cap)
    is the same for -cap, and so must be what the forward's softmax sees (its row maxima need a positive
    score_unit: a negative one would turn them into minima)."""
    from maskc.codegen.cwriter import TableLayout
    bound = maskc.load(EXAMPLES / "softcap.mask").bind(seq_len=11, cap=2.5)
    spec = bound.kernel_spec(head_dim=64)
    lib = compile_score(spec.predicate.source + spec.score.code)
    desc = bound.descriptor(64, 64)
    table = np.ascontiguousarray(desc.mask_data[desc.mask_offsets[0]:], np.int32)
    slot = TableLayout.of(bound.mask.resolved.params).float_slot("cap")
    assert table[slot:slot + 1].view(np.float32)[0] == 2.5
    table[slot:slot + 1] = np.array([-2.5], np.float32).view(np.int32)
    x = np.random.default_rng(4).uniform(-8, 8, (11, 11))
    want = 2.5 * np.tanh(x / 2.5)
    np.testing.assert_allclose(forward_scores(lib, table, x / 0.3, 0, 0.3, 0), want, rtol=1e-4, atol=1e-4)
    assert lib.unit_of(table, 0, 0, 0.3) == pytest.approx(2.5 / 0.3)


def _check_forward_scores(bound, spec, scale, origin):
    lib = compile_score(spec.predicate.source + spec.score.code)
    desc = bound.descriptor(64, 64)
    table = np.ascontiguousarray(desc.mask_data[desc.mask_offsets[0]:], np.int32)
    x = np.random.default_rng(3).uniform(-2, 2, (11, 11)).astype(np.float32).astype(np.float64)
    q, k = np.arange(11)[:, None], np.arange(11)[None, :]
    for head in (0, 1):
        want = ScoreEvaluator(bound.mask.resolved, bound.params.batch[0], 11, 11, head, 0)(x, q, k)[0]
        got = forward_scores(lib, table, x / scale, head, scale, origin)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * max(1.0, np.abs(want).max()))


@needs_gxx
def test_sub_block_code_sees_the_parents_positions():
    """A restricted (context-parallel) block's kernels take local positions and read the origin from the table."""
    bound = maskc.load(EXAMPLES / "alibi.mask").bind(seq_len=40, num_heads=2, slope=[0.5, 0.25])
    sub = bound.restrict((16, 32), (8, 24))
    spec = sub.kernel_spec(head_dim=64)
    lib = compile_score(spec.predicate.source + spec.score.code)
    data, starts = sub.descriptor(64, 64).mask_data, sub.descriptor(64, 64).mask_offsets
    x = np.random.default_rng(2).uniform(-2, 2, (16, 16)).astype(np.float32)
    out, slope, plain = (np.zeros((16, 16), np.float32) for _ in range(3))
    lib.score_fill(np.ascontiguousarray(data[starts[0]:], np.int32), 0, 1, 1.0, 16, 16, x, out, slope, plain)
    want = sub.modified_scores(x.astype(np.float64), 0, 1)[0]
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(want, bound.modified_scores(np.pad(x.astype(np.float64), ((16, 8), (8, 16))), 0, 1)[0]
                               [16:32, 8:24])
    table = np.ascontiguousarray(data[starts[0]:], np.int32)       # the forward's scores, from local origins
    for origin in (0, 5):
        np.testing.assert_allclose(forward_scores(lib, table, x, 1, 1.0, origin), want, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("case", range(3))
def test_flex_score_mod_is_the_reference(case):
    torch = pytest.importorskip("torch")
    import warnings
    from torch.nn.attention.flex_attention import flex_attention
    name, mask, params, _ = cases()[case]
    S = 70
    bound = mask.bind(seq_len=S, **params)
    g = torch.Generator().manual_seed(case)
    q, k, v = (torch.randn(1, 2, S, 16, generator=g, dtype=torch.float64) for _ in range(3))
    score_mod = bound.flex_score_mod()
    x = torch.randn(S, S, generator=g, dtype=torch.float64)
    rows, cols = torch.arange(S)[:, None], torch.arange(S)[None, :]
    for h in range(2):        # elementwise, as Flex calls it (scalars per pair, vmapped; here broadcast)
        got = score_mod(x, 0, torch.tensor(h), rows, cols).numpy()
        head = h if bound.num_heads else 0          # a binding without num_heads has one head
        np.testing.assert_allclose(got, bound.modified_scores(x.numpy(), 0, head)[0], rtol=1e-12, atol=1e-12)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # Flex's note about running uncompiled
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=bound.to_flex_block_mask(64), scale=0.5)
    np.testing.assert_allclose(out.numpy(), reference_attention(q, k, v, bound, scale=0.5), rtol=1e-10, atol=1e-10)
    assert maskc.load(EXAMPLES / "causal.mask").bind(seq_len=4).flex_score_mod() is None


# ---- what the kernels are given -----------------------------------------------------------------------

def test_modifier_is_part_of_the_kernel_and_its_cache_key():
    causal = maskc.load(EXAMPLES / "causal.mask").kernel_source(head_dim=64)
    soft = maskc.load(EXAMPLES / "softcap.mask")
    a, b = soft.kernel_source(head_dim=64), compile_text(
        "mask softcap(cap: float = 50.0)\n  allow k <= q\n  score = softcap(score, cap) * 2.0\n").kernel_source(head_dim=64)
    assert causal.spec.score is None and "score_mod" not in causal.source
    assert a.spec.score is not None and a.spec != b.spec and a.source != b.source
    assert "modify_scores(s, sh, mask" in a.source and "tanh.approx.f32" in a.source
    back = soft.backward_source(head_dim=64)
    assert "score_mod_grad" in back.source and "p[nt][e] *= slope[nt][e]" in back.source


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0.01, 200.0), min_size=1, max_size=3), st.booleans())
def test_a_fixed_softmax_maximum_exactly_where_every_cap_allows_one(caps, per_head):
    """BoundMask.fixed_max: a modifier that is softcap(..., cap) at the top bounds every score by the cap, and the
    forward runs its softmax against a fixed maximum exactly when every batch element's and head's cap is at most
    FIXED_MAX_CAP; other modifiers, and none, never do."""
    from maskc.codegen.plan import FIXED_MAX_CAP

    if per_head:
        bound = compile_text("mask a(c: float per h)\n  allow k <= q\n  score = softcap(score * 2.0, c)\n").bind(
            seq_len=8, num_heads=len(caps), c=caps)
    else:
        bound = compile_text("mask a(c: float)\n  allow k <= q\n  score = softcap(score, c)\n").bind(
            seq_len=8, c=caps if len(caps) > 1 else caps[0])
    assert bound.fixed_max == (max(caps) <= FIXED_MAX_CAP)
    assert bound.kernel_spec(head_dim=64, engine="wgmma_tma").fixed_max == bound.fixed_max
    assert not compile_text("mask a(c: float = 1.0)\n  allow k <= q\n  score = softcap(score, c) * 2.0\n").bind(
        seq_len=8).fixed_max
    assert not maskc.load(EXAMPLES / "causal.mask").bind(seq_len=8).fixed_max


@pytest.mark.parametrize("cap", [1e-3, 1.0, 30.0, 50.0])
def test_every_exponent_of_a_fixed_maximum_lands_in_normal_floats(cap):
    """The fixed maximum's arithmetic at the largest cap it is used for and below: for every forward score
    t = tanh(.) in [-1, 1], P = exp2(t * cap * log2(e) - FIXED_EXPONENT) in float32 is a normal float (ex2.approx
    flushes subnormals) no larger than 2**P_HIGH, and P's ratios are the softmax's."""
    from maskc.codegen.plan import FIXED_EXPONENT, FIXED_MAX_CAP, FIXED_MAX_K, P_HIGH

    assert FIXED_MAX_CAP * math.log2(math.e) == pytest.approx(FIXED_MAX_K)
    for c in (cap, FIXED_MAX_CAP):
        t = np.linspace(-1.0, 1.0, 20001, dtype=np.float32)
        x = t * np.float32(c * math.log2(math.e)) - np.float32(FIXED_EXPONENT)
        p = np.exp2(x)
        assert (p >= np.finfo(np.float32).tiny).all() and (p <= 2.0 ** P_HIGH).all()
        softmax = np.exp((t.astype(np.float64) - 1.0) * c)
        ours = p.astype(np.float64) / p.astype(np.float64).sum()
        assert np.allclose(ours, softmax / softmax.sum(), rtol=1e-4, atol=0)


def test_the_fixed_maximum_is_in_the_bf16_wgmma_tma_kernel_alone():
    """The plan runs the fixed maximum where the spec allows it, for bf16 (P passes to P V in bf16, fp32's range;
    fp16's would flush it) and without the FMA exponentials; the kernel then has no row maxima and no rescale."""
    from maskc.codegen.emit import emit_kernel

    bound = maskc.load(EXAMPLES / "softcap.mask").bind(seq_len=512, cap=30.0)
    fixed = emit_kernel(bound.kernel_spec(head_dim=128, dtype="bf16", engine="wgmma_tma"))
    assert fixed.plan.fixed_max and "softmax_fixed(s, l, softmax_scale_log2)" in fixed.source
    assert "softmax_update(" not in fixed.source.split("extern \"C\"")[1] and "rescale_rows(acc" not in \
        fixed.source.split("extern \"C\"")[1]
    for spec, options in ((bound.kernel_spec(head_dim=128, dtype="fp16", engine="wgmma_tma"), maskc.Options()),
                          (bound.kernel_spec(head_dim=128, dtype="bf16", engine="wgmma_tma"),
                           maskc.Options(exp2_emulation=2)),
                          (bound.mask.kernel_spec(head_dim=128, dtype="bf16", engine="wgmma_tma"), maskc.Options())):
        source = emit_kernel(spec, options)
        assert not source.plan.fixed_max and "softmax_fixed" not in source.source


def test_additive_modifiers_cost_one_fma_and_no_backward_factor():
    spec = maskc.load(EXAMPLES / "alibi.mask").kernel_spec(head_dim=64)
    body = spec.score.code.split("float score_mod(")[1].split("}")[0]
    assert body.count("const float") == 1 and "fmaf(c.f0, (qf - kf), s)" in body
    assert spec.score.unit_slope
    # the forward's: the row's share (slope * q) left for the LSE, one FMA on the key's offset from the origin
    forward = spec.score.code.split("float score_mod_fwd(")[1].split("}")[0]
    assert spec.score.row_terms and forward.count("const float") == 1 and "qf" not in forward.split("kfo;")[1]
    back = maskc.load(EXAMPLES / "alibi.mask").backward_source(head_dim=64).source
    assert "score_mod(sh, mask" in back and "slope[nt]" not in back
    soft = maskc.load(EXAMPLES / "softcap.mask").kernel_spec(head_dim=64).score
    body = soft.code.split("float score_mod(")[1].split("}")[0]
    assert body.count("maskc_tanh(") == 1 and body.count("const float") == 2 and not soft.unit_slope


def test_float_parameters_travel_as_bits_in_the_mask_table():
    bound = compile_text("mask a(n: int = 3, c: float = 2.5, s: float per h, t: float table)\n"
                         "  allow k <= q, k >= n\n  score = score * c + s + t[0]\n").bind(
        seq_len=4, num_heads=2, s=[0.5, -1.0], t=[7.0])
    data = bound.descriptor(64, 64).mask_data
    assert list(data[:3]) == [4, 4, 3]
    bits_c, offset_s, offset_t = data[3:4].view(np.float32)[0], int(data[4]), int(data[5])   # declaration order
    assert bits_c == 2.5
    assert data[offset_s] == 2 and list(data[offset_s + 1:offset_s + 3].view(np.float32)) == [0.5, -1.0]
    assert data[offset_t] == 1 and data[offset_t + 1:offset_t + 2].view(np.float32)[0] == 7.0


def test_a_mask_without_modifier_renders_as_before():
    """No modifier, no trace of one (tests/test_golden.py holds every example's kernels byte for byte)."""
    for name in ("causal", "document", "per_head_window"):
        src = maskc.load(EXAMPLES / f"{name}.mask").kernel_source(head_dim=64).source
        assert "ScoreHead" not in src and "score_mod" not in src
