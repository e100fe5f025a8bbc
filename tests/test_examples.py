"""The examples are a public contract: their names, their parameters, and their meaning as the
product defines it, checked against independent implementations written from that definition."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import maskc
from maskc.codegen.emit import compile_to_cubin
from maskc.kernel_ir import BACKWARD_ENGINES
from conftest import EXAMPLES, EXAMPLE_NAMES, example_params

CONTRACT = {
    "causal": [],
    "sliding_window": ["window"],
    "prefix_lm": ["prefix"],
    "document": ["docs"],
    "shared_prompt": ["prompt", "responses"],
    "hstu": ["users", "context", "targets", "max_attn_len"],
    "clear": ["text", "width", "radius"],
    "neighborhood": ["width", "window"],
    "video": ["width", "height", "radius", "past"],
    "morton_local": ["radius"],
    "per_head_window": ["window"],
    "cross_images": ["lead", "text", "images"],
    "tree_verify": ["anc"],
    "alibi": ["slope"],
    "softcap": ["cap"],
    "block_diffusion": ["n", "block"],
    "sliding_tile": ["tile_t", "tile_h", "tile_w", "tiles_t", "tiles_h", "tiles_w", "window_t", "window_h",
                     "window_w", "text"],
}


@pytest.mark.parametrize("name", sorted(CONTRACT))
def test_names_and_parameters(name):
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    assert mask.name == name
    assert [p.name for p in mask.params] == CONTRACT[name]


def _segment_of(lengths, origin, n):
    seg = np.full(n, -1)
    at = origin
    for i, length in enumerate(lengths):
        seg[at:at + length] = i
        at += length
    return seg


def hstu_reference(users, context, targets, max_attn_len, seq_len):
    """Meta's HSTU mask, as the product card words it, pair by pair."""
    out = np.zeros((seq_len, seq_len), bool)
    start = 0
    for length, t in zip(users, targets):
        c, m = context, max_attn_len
        u = length - (c - 1 if c > 0 else 0) - t

        def ident(i):
            v = max(i - c + 1, 0) if c > 0 else i
            return min(v, u) if t > 0 else v
        for i in range(length):
            for j in range(length):
                d = ident(i) - ident(j)
                visible = (i == j or d > 0) and (m == 0 or d <= m)
                if c > 0 and ident(i) == 0 and ident(j) < u:
                    visible = True
                out[start + i, start + j] = visible
        start += length
    return out


def reference(name, seq_len, p, head=0):
    if name == "cross_images":
        return cross_images_reference(seq_len, p["kv_len"], p["lead"], p["text"], p["images"])
    if name == "tree_verify":
        return tree_verify_reference(seq_len, p["kv_len"], p["anc"])
    q = np.arange(seq_len)[:, None]
    k = np.arange(seq_len)[None, :]
    if name in ("causal", "alibi", "softcap"):         # the modifiers change scores, not visibility
        return np.broadcast_to(k <= q, (seq_len, seq_len))
    if name == "sliding_window":
        return (k <= q) & (q - k < p["window"])
    if name == "prefix_lm":
        return np.broadcast_to((k < p["prefix"]) | (k <= q), (seq_len, seq_len))
    if name in ("document", "bidirectional_document"):
        doc = _segment_of(p["docs"], 0, seq_len)
        same = doc[:, None] == doc[None, :]
        return same & (k <= q) if name == "document" else same
    if name == "shared_prompt":
        resp = _segment_of(p["responses"], p["prompt"], seq_len)
        same = (resp[:, None] == resp[None, :]) & (resp[:, None] >= 0)
        return (k <= q) & ((k < p["prompt"]) | same)
    if name == "hstu":
        return hstu_reference(p["users"], p["context"], p["targets"], p["max_attn_len"], seq_len)
    if name == "clear":
        text, width, r = p["text"], p["width"], p["radius"]
        y, x = (np.arange(seq_len) - text) // width, (np.arange(seq_len) - text) % width
        near = (y[:, None] - y[None, :]) ** 2 + (x[:, None] - x[None, :]) ** 2 < r * r
        return (q < text) | (k < text) | near
    if name == "global_local":
        g, w = p["globals"], p["window"]
        return (k < g) | (q < g) | ((k <= q) & (q - k < w))
    if name == "neighborhood":
        return neighborhood_reference(seq_len, p["width"], p["window"])
    if name == "video":
        return video_reference(seq_len, p["width"], p["height"], p["radius"], p["past"])
    if name == "morton_local":
        return morton_reference(seq_len, p["radius"])
    if name == "per_head_window":
        return (k <= q) & (q - k < p["window"][head])
    if name == "block_diffusion":
        return block_diffusion_reference(seq_len, p["n"], p["block"])
    if name == "sliding_tile":
        return sliding_tile_reference(seq_len, p)
    raise KeyError(name)


def block_diffusion_reference(seq_len, n, block):
    """BD3-LM's training mask, pair by pair from the paper's three parts: x_t (positions below n) sees its own
    block of x_t and the earlier blocks of x_0; x_0 (from n on, block j being positions n + j * block ...) sees
    its own block of x_0 and the earlier ones."""
    out = np.zeros((seq_len, seq_len), bool)
    for i in range(seq_len):
        noised, bi = i < n, (i if i < n else i - n) // block
        for j in range(seq_len):
            bj = (j if j < n else j - n) // block
            if noised:
                out[i, j] = bj == bi if j < n else bj < bi
            else:
                out[i, j] = j >= n and bj <= bi
    return out


def sliding_tile_reference(seq_len, p):
    """STA from its definition: the video's tokens tile by tile, each tile's (frame, row, column) of tiles; a
    video token sees the video tiles of a window of `window` tiles a side, as centred on its tile as the
    canvas allows (odd windows centred, even ones one tile more before), and the text; text sees all."""
    dims = "thw"
    tile, tiles, window = ([p[f"{what}_{a}"] for a in dims] for what in ("tile", "tiles", "window"))
    video = int(np.prod(tile) * np.prod(tiles))
    per_tile = tile[0] * tile[1] * tile[2]

    def coords(i):                                  # the tile's (t, y, x) among the tiles
        n = i // per_tile
        return n // (tiles[1] * tiles[2]), n // tiles[2] % tiles[1], n % tiles[2]

    def first(c, w, count):                         # the window's first tile: centred, then moved inside
        start = c - w // 2
        return max(min(start, count - w), 0) if w <= count else count - w
    out = np.zeros((seq_len, seq_len), bool)
    for i in range(seq_len):
        if i >= video:
            out[i, :min(video + p["text"], seq_len)] = True
            continue
        lo = [first(c, w, n) for c, w, n in zip(coords(i), window, tiles)]
        for j in range(min(video, seq_len)):
            out[i, j] = all(a <= c < a + w for a, c, w in zip(lo, coords(j), window))
        out[i, video:min(video + p["text"], seq_len)] = True
    return out


def neighborhood_reference(seq_len, width, window):
    """NATTEN's neighbourhood, query by query: the window starts `window // 2` rows (columns) before the
    query's, moved inward so that it ends at the image's last row (column) at the latest."""
    height = -(-seq_len // width)
    out = np.zeros((seq_len, seq_len), bool)
    for i in range(seq_len):
        row, col = divmod(i, width)
        first_row, first_col = max(row - window // 2, 0), max(col - window // 2, 0)
        first_row = min(first_row, height - window)
        first_col = min(first_col, width - window)
        for r in range(first_row, first_row + window):
            lo, hi = r * width + max(first_col, 0), r * width + first_col + window
            if 0 <= r:
                out[i, max(lo, 0):min(hi, seq_len)] = True
    return out


def morton_reference(seq_len, radius):
    """Images of 64 x 64 tokens in Z order: token m's column and row are its bits 0, 2, .., 10 and 1, 3, .., 11
    (read one bit at a time in Python); pairs within one image and `radius` columns and rows."""
    def pixel(m):
        x = sum(((m >> (2 * b)) & 1) << b for b in range(6))
        y = sum(((m >> (2 * b + 1)) & 1) << b for b in range(6))
        return m // 4096, x, y
    image, x, y = (np.asarray(c) for c in zip(*(pixel(m) for m in range(seq_len))))
    near = lambda c: np.abs(c[:, None] - c[None, :]) <= radius      # noqa: E731
    return (image[:, None] == image[None, :]) & near(x) & near(y)


def cross_images_reference(seq_len, kv_len, lead, text, images):
    """Text run i (the queries from lead on, run by run) sees image i (the keys, image by image), pair by pair."""
    out = np.zeros((seq_len, kv_len), bool)
    q0 = lead
    for i, n in enumerate(text):
        if i < len(images):
            k0 = sum(images[:i])
            out[q0:q0 + n, k0:k0 + images[i]] = True
        q0 += n
    return out


def tree_verify_reference(seq_len, kv_len, anc):
    """Draft token i sees the prefix (kv_len - seq_len keys) and draft token j where anc[i][j] != 0."""
    prefix = kv_len - seq_len
    out = np.zeros((seq_len, kv_len), bool)
    for i in range(seq_len):
        out[i, :prefix] = True
        for j in range(seq_len):
            out[i, prefix + j] = anc[i][j] != 0
    return out


def video_reference(seq_len, width, height, radius, past):
    """A token of frame t at (y, x) sees frames t - past .. t within `radius` rows and columns."""
    i = np.arange(seq_len)
    frame, rest = np.divmod(i, width * height)
    y, x = np.divmod(rest, width)
    dt = frame[:, None] - frame[None, :]
    return ((0 <= dt) & (dt <= past) & (np.abs(y[:, None] - y[None, :]) <= radius)
            & (np.abs(x[:, None] - x[None, :]) <= radius))


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 90))
def test_meaning(name, seed, seq_len):
    params = example_params(name, seq_len, np.random.default_rng(seed))
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=seq_len, **params)
    params.setdefault("kv_len", seq_len)
    for head in range(bound.num_heads or 1):
        np.testing.assert_array_equal(bound.dense(0, head), reference(name, seq_len, params, head))


def test_morton_local_across_images():
    """Two images and part of a third; the tiles are sound (bit operations: not exact) and, over tiles aligned
    with the Morton squares, exactly the truth here."""
    from conftest import tile_truth
    bound = maskc.load(EXAMPLES / "morton_local.mask").bind(seq_len=2 * 4096 + 300, radius=2)
    dense = bound.dense()
    np.testing.assert_array_equal(dense, morton_reference(bound.seq_len, 2))
    assert not bound.tile_map(64, 64).exact
    got, truth = bound.tiles(64, 64), tile_truth(dense, 64, 64)
    assert not np.any((got != maskc.PARTIAL) & (got != truth))
    assert (got == maskc.PARTIAL).sum() <= 1.05 * (truth == maskc.PARTIAL).sum()


def test_per_head_window_needs_one_window_per_head():
    mask = maskc.load(EXAMPLES / "per_head_window.mask")
    bound = mask.bind(seq_len=64, num_heads=3, window=[1, 8, 64])
    for head, window in enumerate([1, 8, 64]):
        np.testing.assert_array_equal(bound.dense(0, head), reference("per_head_window", 64, {"window": [window]}))
    with pytest.raises(maskc.BindError, match="num_heads"):
        mask.bind(seq_len=64, window=[1, 8, 64])
    with pytest.raises(maskc.BindError, match="'window' has 2 entries, one per head, but num_heads = 3"):
        mask.bind(seq_len=64, num_heads=3, window=[1, 8])
    with pytest.raises(maskc.BindError, match="requirement"):
        mask.bind(seq_len=64, num_heads=3, window=[1, 0, 8])


def test_cross_images_is_exact_and_keys_cover_kv_len():
    """Each text run's keys are one interval (its image): exact tiles, at a kv_len unlike seq_len."""
    from conftest import tile_truth
    mask = maskc.load(EXAMPLES / "cross_images.mask")
    assert mask.exact
    p = {"lead": 5, "text": [10, 0, 30, 17], "images": [64, 40, 64]}     # one text run too many: sees nothing
    bound = mask.bind(seq_len=62, kv_len=168, **p)
    dense = bound.dense()
    np.testing.assert_array_equal(dense, cross_images_reference(62, 168, **p))
    for bm, bn in ((16, 16), (7, 13), (64, 32)):
        np.testing.assert_array_equal(bound.tiles(bm, bn), tile_truth(dense, bm, bn))
    with pytest.raises(maskc.BindError, match=r"must cover \[0, 168\) \(the keys"):
        mask.bind(seq_len=62, kv_len=168, lead=5, text=[57], images=[62])


def test_tree_verify_sees_prefix_and_ancestors():
    mask = maskc.load(EXAMPLES / "tree_verify.mask")
    anc = [[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]]       # 0 <- 1, 0 <- 2 <- 3
    bound = mask.bind(seq_len=4, kv_len=10, anc=anc)
    np.testing.assert_array_equal(bound.dense(), tree_verify_reference(4, 10, anc))
    with pytest.raises(maskc.BindError, match=r"table 'anc' has 4 x 3 entries, but is declared \[seq_len, seq_len\]"):
        mask.bind(seq_len=4, kv_len=10, anc=[r[:3] for r in anc])
    with pytest.raises(maskc.BindError, match="requirement"):
        mask.bind(seq_len=4, kv_len=3, anc=anc)


def test_hstu_targets_see_history_and_themselves_only():
    bound = maskc.load(EXAMPLES / "hstu.mask").bind(seq_len=10, users=[10], targets=[3])
    dense = bound.dense()
    for target in (7, 8, 9):
        assert dense[target, :7].all() and dense[target, target]
        assert not dense[target, [t for t in (7, 8, 9) if t != target]].any()
    assert not dense[:7, 7:].any()            # history never sees a target


@pytest.mark.parametrize("partial", ["auto", "elements"])
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_kernel_compiles_through_nvrtc(name, partial):
    """Every example's forward, with PARTIAL tiles masked each way (Options.partial_tiles) where it has a choice."""
    pytest.importorskip("cupy")
    from maskc.codegen.emit import emit_kernel
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=300, **example_params(
        name, 300, np.random.default_rng(0)))
    source = emit_kernel(bound.kernel_spec(head_dim=128, dtype="bf16"), maskc.Options(partial_tiles=partial))
    if partial != "auto" and source.plan.partial_tiles != partial:
        pytest.skip("no tile path: PARTIAL tiles have one way")
    assert len(compile_to_cubin(source)) > 10_000
    for name_, value in bound.constants:          # const parameters are literals, not table reads
        assert f"const {name_} = {value}" in source.source


@pytest.mark.parametrize("engine", BACKWARD_ENGINES)
@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_backward_kernels_compile_through_nvrtc(name, engine):
    """Every entry of the backward source is in the cubin, on each dK/dV engine; fp16 and D=64 for half of
    the examples."""
    pytest.importorskip("cupy")
    from maskc.codegen.emit import emit_backward_kernel
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=300, **example_params(
        name, 300, np.random.default_rng(0)))
    odd = EXAMPLE_NAMES.index(name) % 2
    spec = bound.backward_spec(head_dim=64 if odd else 128, dtype="fp16" if odd else "bf16", engine=engine)
    assert spec.engine == engine
    source = emit_backward_kernel(spec)
    cubin = compile_to_cubin(source)
    for entry in source.functions:
        assert entry.encode() in cubin
    ordered = {spec.entry_dkdv_ordered} if engine == "wgmma_tma" else set()     # dQ in turns: wgmma_tma only
    stored = {spec.entry_tile_words} if spec.partial_tiles == "stored" else set()   # the stored path's builder
    assert stored == set() or (engine == "wgmma_tma" and spec.predicate.tile_bits)
    assert set(source.functions) == {spec.entry_prep, spec.entry_dkdv, spec.entry_dkdv_det, spec.entry_dq,
                                     spec.entry_dq_convert} | ordered | stored


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_head_dim_256_backward_compiles_through_nvrtc(name):
    """Every example's backward at head dim 256 (Hopper's wgmma_tma, the warpgroups splitting the head dim): every
    entry in the cubin and the dK/dV kernel's shared memory within the CTA's (the template asserts it too);
    fp16 for half of the examples."""
    pytest.importorskip("cupy")
    from maskc.codegen.emit import emit_backward_kernel
    odd = EXAMPLE_NAMES.index(name) % 2
    spec = maskc.load(EXAMPLES / f"{name}.mask").backward_spec(head_dim=256, dtype="fp16" if odd else "bf16")
    assert spec.split_head_dim
    source = emit_backward_kernel(spec)
    cubin = compile_to_cubin(source)
    assert set(source.functions) == {spec.entry_prep, spec.entry_dkdv, spec.entry_dkdv_det, spec.entry_dq,
                                     spec.entry_dq_convert}
    for entry in source.functions:
        assert entry.encode() in cubin


def test_backward_at_head_dim_256_needs_hopper():
    with pytest.raises(ValueError, match="head dim 256"):
        maskc.load(EXAMPLES / "causal.mask").backward_spec(head_dim=256, arch="sm_89")


def test_const_parameters_are_compiled_in_and_checked():
    mask = maskc.load(EXAMPLES / "clear.mask")
    assert mask.const_params == ("text", "width")
    assert mask.const_values() == (("text", 512), ("width", 128))      # the defaults clear.mask declares
    assert mask.const_values({"width": 64}) == (("text", 512), ("width", 64))
    assert "(128)" in mask.kernel_spec().predicate.source
    with pytest.raises(maskc.MaskError, match="no const parameter 'radius'"):
        mask.const_values({"radius": 3})
    bare = maskc.compile_mask("mask m(w: const int, n: const int = 4)\n  allow k <= q, q - k < w * n\n")
    with pytest.raises(maskc.MaskError, match="const parameter.s. w into the kernel") as err:
        bare.kernel_spec()                         # no value, no default
    assert "--param w=VALUE" in err.value.hint
    a = mask.bind(seq_len=100, text=10, width=8, radius=3).kernel_spec().predicate.source
    b = mask.bind(seq_len=100, text=10, width=9, radius=3).kernel_spec().predicate.source
    assert a != b and "(8)" in a and "(9)" in b
    with pytest.raises(maskc.BindError, match="const"):
        mask.bind(seq_len=100, text=10, width=[8, 9], radius=3)
