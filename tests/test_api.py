"""The public Python API as a FlexAttention user meets it: attention's signature and GQA rule,
create_block_mask / create_mask, BlockMask devices, and short reprs."""
import inspect
import warnings

import numpy as np
import pytest

import maskc
from conftest import EXAMPLES, EXAMPLE_NAMES, example_params

torch = pytest.importorskip("torch")


def _bound(name="document", S=300, seed=0):
    return maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=S, **example_params(name, S, np.random.default_rng(seed)))


def test_attention_signature_is_flex_shaped():
    params = inspect.signature(maskc.attention).parameters
    assert list(params)[:4] == ["query", "key", "value", "mask"]
    keyword_only = {n for n, p in params.items() if p.kind is inspect.Parameter.KEYWORD_ONLY}
    assert {"scale", "enable_gqa", "return_lse", "deterministic", "block_mask"} <= keyword_only
    assert params["enable_gqa"].default is False and params["scale"].default is None


def test_gqa_needs_enable_gqa_and_then_matches_repeated_heads():
    bound = _bound()
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 300, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(1, 2, 300, 16, generator=g, dtype=torch.float64) for _ in range(2))
    with pytest.raises(ValueError, match="Hq=4 and Hkv=2"):
        maskc.attention(q, k, v, bound)
    out = maskc.attention(q, k, v, bound, enable_gqa=True)
    ref = maskc.reference_attention(q.numpy(), k.numpy(), v.numpy(), bound)     # numpy float64, h // 2
    np.testing.assert_allclose(out.numpy(), ref, atol=1e-12)
    repeated = maskc.attention(q, k.repeat_interleave(2, 1), v.repeat_interleave(2, 1), bound)
    assert torch.allclose(out, repeated)


def test_inputs_must_share_one_floating_point_dtype():
    """As in Flex: integer inputs (whose averages would be truncated) and mixed dtypes are refused."""
    bound = _bound(S=64)
    q = torch.randn(1, 2, 64, 8)
    with pytest.raises(ValueError, match="floating point"):
        maskc.attention(q.int(), q.int(), q.int(), bound)
    with pytest.raises(ValueError, match="same dtype"):
        maskc.attention(q, q.double(), q, bound)
    assert maskc.attention(q, q, q, bound).dtype == torch.float32


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_create_block_mask_drives_flex_attention_and_maskc_alike(name):
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
    S = 200
    H = 2
    params = example_params(name, S, np.random.default_rng(3), heads=H)
    params.pop("num_heads", None)                             # Flex's H says it
    KV = params.pop("kv_len", S)                              # cross attention: the keys' own length
    mask = maskc.load(EXAMPLES / f"{name}.mask")
    block_mask = maskc.create_block_mask(EXAMPLES / f"{name}.mask", B=None, H=H, Q_LEN=S, KV_LEN=KV, BLOCK_SIZE=64,
                                         **params)
    assert isinstance(block_mask, BlockMask) and block_mask.kv_num_blocks.device.type == "cpu"
    bound = mask.bind(seq_len=S, kv_len=KV, num_heads=H if mask.reads_head else None, **params)
    np.testing.assert_array_equal(block_mask.to_dense()[0, 0].numpy().astype(bool), bound.tiles(64, 64) != maskc.EMPTY)
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, H, n, 16, generator=g) for n in (S, KV, KV))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")                       # Flex's note about running uncompiled
        theirs = flex_attention(q, k, v, block_mask=block_mask, score_mod=bound.flex_score_mod())
    ours = maskc.attention(q, k, v, block_mask=block_mask)
    dense = maskc.create_mask(mask, H=H, Q_LEN=S, KV_LEN=KV, **params)[0]          # (H, S, KV)
    seen = dense.any(-1)                                   # Flex leaves rows that see nothing undefined
    assert torch.allclose(ours[0][seen], theirs[0][seen], atol=1e-5)
    ref = maskc.reference_attention(q.numpy(), k.numpy(), v.numpy(), bound)
    np.testing.assert_allclose(ours.numpy(), ref, atol=1e-5)


def test_create_mask_is_the_dense_mask():
    dense = maskc.create_mask(EXAMPLES / "document.mask", B=2, H=3, Q_LEN=40, docs=[[10, 30], [40]])
    assert dense.shape == (2, 3, 40, 40) and dense.dtype == torch.bool
    bound = maskc.load(EXAMPLES / "document.mask").bind(seq_len=40, docs=[[10, 30], [40]])
    for b in range(2):
        for h in range(3):
            np.testing.assert_array_equal(dense[b, h].numpy(), bound.dense(b))
    with pytest.raises(maskc.BindError, match="B=3"):
        maskc.create_mask(EXAMPLES / "document.mask", B=3, Q_LEN=40, docs=[[10, 30], [40]])
    with pytest.raises(TypeError, match="Q_LEN"):
        maskc.create_block_mask(EXAMPLES / "causal.mask")


def test_flex_helpers_default_to_the_cpu_and_follow_the_positions_device():
    bound = _bound("causal", 50)
    assert bound.to_flex_block_mask().kv_indices.device.type == "cpu"
    mod = bound.flex_mask_mod()
    assert mod.device.type == "cpu"
    q, k = torch.arange(50, device="meta")[:, None], torch.arange(50, device="meta")[None, :]
    assert mod(torch.tensor(0, device="meta"), torch.tensor(0, device="meta"), q, k).device.type == "meta"
    assert mod.on("meta") is mod.on("meta")                  # one copy per device


def test_block_mask_of_other_lengths_is_refused():
    bound = _bound("causal", 64)
    other = _bound("causal", 32).to_flex_block_mask()
    other.mask_mod.bound = bound                              # a BlockMask whose lengths disagree with its mask
    q = torch.randn(1, 1, 64, 8)
    with pytest.raises(maskc.InputError, match="covers"):
        maskc.attention(q, q, q, block_mask=other)


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
def test_reprs_are_short_and_name_the_mask(name):
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(
        seq_len=100_000, **example_params(name, 100_000, np.random.default_rng(0)))
    objects = [bound.mask, bound, bound.tile_map(128, 128), bound.descriptor(128, 64), bound.flex_mask_mod(),
               bound.kernel_spec(head_dim=64)]
    for obj in objects:
        text = repr(obj)
        assert len(text) < 700 and "array(" not in text and "\n" not in text, text
    assert name in repr(bound) and name in repr(bound.mask)
    counts = bound.tile_map(128, 128).counts()
    classes = bound.tile_map(128, 128).classes
    assert counts == {"FULL": int((classes == maskc.FULL).sum()), "PARTIAL": int((classes == maskc.PARTIAL).sum()),
                      "EMPTY": int((classes == maskc.EMPTY).sum())}
