"""Token orders (issue 15 item 2): a mask over an image run in patch order. Oracles: numpy permutations of the
original mask's dense grid (bound.dense(), the interpreter), brute-force tile classes, the generated predicate
compiled by g++, and the float64 reference attention of the original mask."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc import ir
from maskc.analysis import linear as L
from maskc.analysis.classify import classify
from maskc.analysis.order import TokenOrder, candidates, image_grid, parse_order
from maskc.analysis.normalize import specialize
from maskc.audit import audit_tiles
from maskc.errors import MaskError
from maskc.options import Options
from maskc.ordered import in_order, token_order

from conftest import EXAMPLES, tile_truth
from host_cxx import needs_gxx
from test_predicate import check_bound

_masks: dict = {}


def load(name: str):
    if name not in _masks:
        _masks[name] = maskc.load(EXAMPLES / f"{name}.mask")
    return _masks[name]


# ---- the order itself --------------------------------------------------------------------------------------

def _eval(e, p: int) -> int:
    """An independent evaluation of a resolved integer expression of one position ``p`` (Python integers)."""
    if isinstance(e, ir.Const):
        return e.value
    if isinstance(e, ir.Pos):
        return p
    a, b = _eval(e.left, p), _eval(e.right, p)
    ops = {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "//": lambda: a // b, "%": lambda: a % b}
    return ops[e.op]()


@st.composite
def orders(draw):
    width = draw(st.integers(1, 40))
    cols = draw(st.sampled_from([c for c in range(1, width + 1) if width % c == 0]))
    return TokenOrder(draw(st.integers(0, 50)), width, draw(st.integers(1, 9)), cols)


@given(orders(), st.integers(1, 900))
def test_order_is_a_permutation_with_its_inverse_and_expression(order, seq_len):
    perm = order.permutation(seq_len)
    assert np.array_equal(np.sort(perm), np.arange(seq_len))
    assert np.array_equal(order.index(perm, seq_len), np.arange(seq_len))
    end = order.end(seq_len)
    assert np.array_equal(perm[:order.origin], np.arange(min(order.origin, seq_len)))
    assert np.array_equal(perm[end:], np.arange(end, seq_len))
    expr = order.raster_expr(ir.Pos("q"))
    for i in range(order.origin, end, max(1, (end - order.origin) // 50)):
        assert _eval(expr, i) == perm[i]
    # a patch's tokens are rows x cols of the image
    if order.applies(seq_len):
        patch = perm[order.origin:order.origin + order.rows * order.cols] - order.origin
        ys, xs = patch // order.width, patch % order.width
        assert len(set(ys)) == order.rows and len(set(xs)) == order.cols


def test_order_names_and_bad_shapes():
    assert TokenOrder(512, 128, 8, 16).name == "8x16" and parse_order("8x16") == (8, 16)
    assert parse_order("auto") is None and parse_order("8x") is None and parse_order("0x4") is None
    with pytest.raises(ValueError):
        TokenOrder(0, 181, 8, 16)            # 16 does not divide 181


@given(st.integers(-60, 60), st.integers(-60, 60), st.integers(1, 7), st.integers(1, 7), st.integers(2, 9),
       st.integers(0, 3), st.integers(-30, 30), st.integers(-30, 30))
def test_bounded_floor_split_matches_python(a, b, m1, m2, d, shift, x, y):
    """floor_op's bounded split (maskc.analysis.linear): a floor of c*A + B, B bounded by its % terms, folds to a
    floor of A; the folded form evaluates as Python's // and % of the original sum."""
    X, Y = ir.Pos("q"), ir.Pos("k")
    rx, ry = L.floor_op("%", L.of_term(X), L.const(m1)), L.floor_op("%", L.of_term(Y), L.const(m2))
    c = d * (m1 + m2 + 1) * 2 ** shift
    num = L.add(L.add(L.scale(L.of_term(X), a * c), L.scale(rx, 1)), L.add(L.scale(ry, 2), L.const(b)))
    env = {X: x, Y: y}

    def value(lin):
        total = lin.const
        for t, coef in lin.terms:
            if t in env:
                v = env[t]
            else:
                inner, den = value(t.num), value(t.den)
                v = inner // den if t.op == "//" else inner % den
            total += coef * v
        return total

    raw = a * c * x + x % m1 + 2 * (y % m2) + b
    for den in (c * d, c, d):
        for op in ("//", "%"):
            assert value(L.floor_op(op, num, L.const(den))) == (raw // den if op == "//" else raw % den)
    # the rows of an image position rebuilt from them: (W*y + x) // W is y, (W*y + x) % W is x
    W = m1 + m2
    rebuilt = L.add(L.scale(L.of_term(X), W), L.floor_op("%", L.of_term(Y), L.const(W)))
    assert L.floor_op("//", rebuilt, L.const(W)) == L.of_term(X)
    assert L.floor_op("%", rebuilt, L.const(W)) == L.floor_op("%", L.of_term(Y), L.const(W))


# ---- the rewritten mask ---------------------------------------------------------------------------------------

@st.composite
def clear_cases(draw):
    width = draw(st.integers(2, 24))
    text = draw(st.integers(0, 40))
    rows = draw(st.sampled_from([1, 2, 3, 4, 8]))
    cols = draw(st.sampled_from([c for c in range(1, width) if width % c == 0] or [1]))
    bands = draw(st.integers(1, 4))
    extra = draw(st.integers(0, 2 * width * rows))      # a short last band, a last row it does not fill
    seq_len = text + bands * rows * width + extra
    return {"text": text, "width": width, "radius": draw(st.integers(0, 7))}, (rows, cols), seq_len


def _twin(name, params, shape, seq_len):
    mask = load(name)
    constants = {n: v for n, v in params.items() if n in mask.const_params}
    twin = in_order(mask, f"{shape[0]}x{shape[1]}", constants)
    original = mask.bind(seq_len, **params)
    return original, twin.bind(seq_len, **params), twin.order


@settings(max_examples=25)
@given(clear_cases())
def test_clear_in_order_is_the_permuted_dense_mask_with_exact_tiles(case):
    params, shape, seq_len = case
    if shape[1] == params["width"]:
        return
    original, ordered, order = _twin("clear", params, shape, seq_len)
    perm = order.permutation(seq_len)
    want = original.dense()[np.ix_(perm, perm)]
    assert np.array_equal(ordered.dense(), want)
    assert ordered.mask.exact
    for bm, bn in ((128, 128), (64, 128), (32, 16)):
        truth = tile_truth(want, bm, bn)
        assert np.array_equal(ordered.tile_map(bm, bn).classes[0], truth)        # from the raster rows
        own = classify([ordered.mask.specialized(ordered.params.batch[0].ints)], ordered.params, bm, bn)
        assert np.array_equal(own.classes[0], truth)                                 # from its own ranges


NEIGHBOURHOODS = [({"width": 13, "window": 5}, (4, 1), 13 * 11), ({"width": 12, "window": 3}, (2, 4), 12 * 9 + 5),
                  ({"width": 9, "window": 9}, (3, 3), 9 * 7)]
VIDEOS = [({"width": 8, "height": 4, "radius": 1, "past": 1}, (2, 4), 8 * 4 * 5 + 7),
          ({"width": 6, "height": 6, "radius": 2, "past": 2}, (3, 2), 6 * 6 * 4),
          ({"width": 5, "height": 4, "radius": 3, "past": 0}, (4, 1), 5 * 4 * 3 + 2)]


@pytest.mark.parametrize("name,params,shape,seq_len", [("neighborhood", *c) for c in NEIGHBOURHOODS]
                         + [("video", *c) for c in VIDEOS])
def test_neighbourhood_and_video_in_order(name, params, shape, seq_len):
    original, ordered, order = _twin(name, params, shape, seq_len)
    perm = order.permutation(seq_len)
    want = original.dense()[np.ix_(perm, perm)]
    assert np.array_equal(ordered.dense(), want)
    for bm, bn in ((16, 16), (32, 8)):
        assert np.array_equal(ordered.tile_map(bm, bn).classes[0], tile_truth(want, bm, bn))
    assert audit_tiles(ordered, 16, 16).really_full == 0


def test_benchmark_shapes_classify_exactly_and_fast_enough():
    """The benchmark's masks at 4K in their orders: classes from the raster rows equal those of the rewritten
    mask's own analysis (which enumerates every band), and the audit finds no excess PARTIAL tile."""
    for name, shape, seq_len in (("clear", "8x16", 4096), ("neighborhood", "8x1", 181 * 22), ("video", "8x16", 4096)):
        bound = load(name).bind(seq_len)
        ordered = token_order(bound, shape)
        tiles = ordered.inner.tile_map(128, 128)
        own = classify([ordered.inner.mask.specialized(ordered.inner.params.batch[0].ints)], ordered.inner.params,
                       128, 128)
        assert np.array_equal(tiles.classes, own.classes)
        audit = audit_tiles(ordered.inner, 128, 128)
        assert audit.really_full == audit.really_empty == audit.unsound == 0


@needs_gxx
@pytest.mark.parametrize("name,params,shape,seq_len",
                         [("clear", {"text": 7, "width": 10, "radius": 3}, (2, 5), 7 + 10 * 9 + 4),
                          ("clear", {"text": 0, "width": 8, "radius": 2}, (4, 1), 8 * 8)]
                         + [("neighborhood", *NEIGHBOURHOODS[0]), ("video", *VIDEOS[0])])
def test_generated_predicate_in_order_matches_dense(name, params, shape, seq_len):
    """mask_visible and mask_bits of the rewritten mask, compiled with g++, at the binding's width."""
    _, ordered, _ = _twin(name, params, shape, seq_len)
    assert ordered.narrow
    check_bound(ordered.mask, ordered)


def test_regions_of_the_order_are_few():
    """CLEAR's text rules are cut only in the pieces of the position they read: 2 regions for them, 4 for the
    disc (q and k each in the bands or after them)."""
    twin = in_order(load("clear"), "8x16")
    assert len(twin.normal.allow) == 6 and not twin.normal.deny and twin.exact


# ---- which masks get an order ---------------------------------------------------------------------------------

def test_image_grid_of_the_examples():
    for name, want in (("clear", (512, 128)), ("neighborhood", (0, 181)), ("video", (0, 32))):
        mask = load(name)
        grid = image_grid(mask.resolved, specialize(mask.normal, dict(mask.const_values())))
        assert (grid.origin, grid.width) == want
    for name in ("causal", "document", "sliding_window"):
        mask = load(name)
        assert isinstance(image_grid(mask.resolved, mask.normal), str)
    assert [o.name for o in candidates(image_grid(load("clear").resolved, specialize(
        load("clear").normal, {"text": 512, "width": 128})))] == ["4x32", "8x16", "16x8"]


def test_auto_chooses_patches_where_they_save_work():
    assert token_order(load("clear").bind(32768)).order.name == "8x16"
    # NATTEN 13 x 13 at 32K: 8 x 1 bands halve its PARTIAL tiles; with torch's gathers that did not pay (run 53:
    # 1.93 ms in the order with 0.8 ms of gathers, 1.85 raster), with the moves kernel's 0.265 ms it does
    assert token_order(load("neighborhood").bind(181 * 181)).order.name == "8x1"
    assert token_order(load("neighborhood").bind(181 * 181, window=31)).order.name == "16x1"
    # a 9 x 9 window on 32-wide frames: a raster tile is already 4 rows of a frame (bench/NOTES.md)
    assert token_order(load("video").bind(32768, radius=4)) is None
    assert token_order(load("clear").bind(32768, radius=2)) is None
    assert token_order(load("clear").bind(1000)) is None               # no whole band after the text
    assert token_order(load("causal").bind(4096)) is None
    assert token_order(load("clear").bind(32768), "raster") is None


def test_orders_refused_with_reasons():
    with pytest.raises(MaskError, match="no position through"):
        token_order(load("causal").bind(4096), "8x16")
    with pytest.raises(MaskError, match="holds no whole band"):
        token_order(load("clear").bind(1000), "8x16")
    with pytest.raises(MaskError, match="must divide"):
        token_order(load("neighborhood").bind(4000), "8x16")
    with pytest.raises(MaskError, match="sub-block"):
        token_order(load("clear").bind(4096).restrict((0, 2048), (0, 4096)), "8x16")
    with pytest.raises(MaskError, match="kv_len = 5000 differs"):
        token_order(load("clear").bind(4096, kv_len=5000), "8x16")
    assert token_order(load("clear").bind(32768, kv_len=32000)) is None           # auto: raster, quietly
    with pytest.raises(MaskError, match="segments"):
        token_order(load("document").bind(4096, docs=[1000, 3096]), "8x16")


def test_options_token_order():
    assert Options().token_order == "auto"
    assert Options.from_environment({"MASKC_TOKEN_ORDER": "8x16"}).token_order == "8x16"
    with pytest.raises(ValueError, match="MASKC_TOKEN_ORDER"):
        Options.from_environment({"MASKC_TOKEN_ORDER": "patches"})


# ---- the runtime's permutation (CPU reference path) ------------------------------------------------------------

def test_attention_in_order_equals_the_original_reference():
    """Forward, LSE and gradients in every order equal the raster run, and the float64 reference of the original
    mask: the permutation round-trips, GQA and a batch of two parameter values included."""
    torch = pytest.importorskip("torch")
    bound = load("clear").bind(700, text=60, width=32, radius=[5, 3])
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 700, 16, dtype=torch.float64, generator=gen, requires_grad=True)
    k, v = (torch.randn(2, 2, 700, 16, dtype=torch.float64, generator=gen, requires_grad=True) for _ in range(2))
    ref = maskc.reference_attention(q.detach().numpy(), k.detach().numpy(), v.detach().numpy(), bound)
    runs = {}
    for order in ("raster", "8x16", "16x8", "4x1"):
        out, lse = maskc.attention(q, k, v, bound, enable_gqa=True, return_lse=True,
                                   options=Options(token_order=order))
        if order != "raster":      # the graph keeps q as the forward moved it, for the backward not to move it again
            perm = torch.from_numpy(maskc.ordered.token_order(bound, order).permutation)
            assert torch.equal(out.grad_fn.saved_tensors[0], q.detach()[:, :, perm])
        grads = torch.autograd.grad((out * out).sum() + lse.sum(), (q, k, v))
        runs[order] = (out, lse, grads)
        assert np.abs(out.detach().numpy() - ref).max() < 1e-10
    for order, (out, lse, grads) in runs.items():
        assert torch.allclose(lse, runs["raster"][1], atol=1e-12)
        for g, r in zip(grads, runs["raster"][2]):
            assert torch.allclose(g, r, atol=1e-10)


def test_cli_compile_in_order(tmp_path):
    from click.testing import CliRunner

    from maskc.cli import cli
    out = tmp_path / "x.cu"
    res = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "clear.mask"), "--token-order", "8x16", "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "maskc_fwd_clear_p8x16" in out.read_text() and "token order: patches of 8 x 16" in out.read_text()
    res = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "causal.mask"), "--token-order", "8x16", "-o", str(out)])
    assert res.exit_code == 1 and "no position through" in res.output and "Traceback" not in res.output


@pytest.mark.parametrize("name,params,shape,seq_len", [
    ("clear", {"text": 7, "width": 10, "radius": 3}, "2x5", 7 + 10 * 9 + 4),
    ("clear", {"text": 0, "width": 8, "radius": 2}, "4x1", 8 * 8),
    ("video", {"width": 8, "height": 4, "radius": 1, "past": 1}, "2x4", 8 * 4 * 5 + 7)])
def test_runtime_moves_tokens_as_the_permutation_says(name, params, shape, seq_len):
    """The runtime's reshape-and-transpose (maskc.runtime.permute) is x[:, :, permutation] and back, for (B, H, S, D)
    data and (B, H, S) rows, strided inputs too."""
    torch = pytest.importorskip("torch")
    from maskc.runtime.permute import from_order, to_order
    ordered = token_order(load(name).bind(seq_len, **params), shape)
    perm, inverse = (torch.from_numpy(a) for a in (ordered.permutation, ordered.inverse))
    x = torch.randn(2, 3, seq_len, 5)
    for data in (x, x.transpose(0, 1), x[..., 0]):
        moved = to_order(data, ordered)
        assert torch.equal(moved, data[:, :, perm])
        assert torch.equal(from_order(moved, ordered), data)
        assert torch.equal(from_order(data, ordered), data[:, :, inverse])


def test_token_order_takes_options_or_a_string():
    """``token_order(bound, Options(...))`` is the order those options run in, as the runtime picks it; the
    documented string form stays; anything else is a TypeError naming what it takes."""
    bound = load("clear").bind(32768)
    assert token_order(bound, Options()).order.name == token_order(bound, "auto").order.name == "8x16"
    assert token_order(bound, Options(token_order="16x8")).order.name == "16x8"
    assert token_order(bound, Options(token_order="raster")) is None
    with pytest.raises(TypeError, match=r"token_order\(\) takes .*Options.*not int"):
        token_order(bound, 8)
    with pytest.raises(ValueError, match="expected 'auto', 'raster' or a patch shape"):
        token_order(bound, "patches")


def test_auto_weighs_partial_tiles_as_the_kernels_mask_them():
    """At 4K CLEAR's 8 x 16 patches save 18% of the tile path's weighed work and 9% of the stored path's (bench/NOTES.md,
    session 14), against MIN_SAVING's 10%: "auto" takes them for kernels that mask PARTIAL tiles per tile, not for
    those that load stored words; at 32K they save more than 10% either way. A string choice weighs as the default
    Options do."""
    bound = load("clear").bind(4096)
    assert token_order(bound, Options(partial_tiles="bits")).order.name == "8x16"
    assert token_order(bound, Options(partial_tiles="elements")).order.name == "8x16"
    assert token_order(bound, Options()) is None
    assert token_order(bound, Options(partial_tiles="stored")) is None
    assert token_order(bound, "auto") is None
    assert token_order(bound, "8x16").order.name == "8x16"          # asked for by name: taken whatever the weights
    big = load("clear").bind(32768)
    assert token_order(big, Options(partial_tiles="bits")).order.name == token_order(big, Options()).order.name == "8x16"


def test_auto_weighs_the_stored_path_only_where_the_kernels_take_it():
    """The stored path's words are one set for all heads: a mask that reads h keeps the tile path, so "auto" weighs its
    tiles as the tile path's even when the options leave the path to the kernels."""
    from maskc.ordered import _weighs_stored
    assert _weighs_stored(load("clear").bind(4096), Options())
    assert not _weighs_stored(load("clear").bind(4096), Options(partial_tiles="bits"))
    assert not _weighs_stored(load("clear").bind(4096).restrict((0, 2048), (0, 4096)), Options())
    per_head = load("per_head_window").bind(4096, num_heads=2, window=[64, 128])
    assert per_head.mask.ranges.uses_head and not _weighs_stored(per_head, Options())
