"""FlexAttention interop: the mask_mod maskc writes in torch ops, and the BlockMask arrays."""
import numpy as np
import pytest
from hypothesis import given, strategies as st

import maskc
from conftest import EXAMPLES, EXAMPLE_NAMES, example_params

torch = pytest.importorskip("torch")


@pytest.mark.parametrize("name", EXAMPLE_NAMES)
@given(seed=st.integers(0, 2**32 - 1), seq_len=st.integers(1, 150))
def test_mask_mod_matches_dense(name, seed, seq_len):
    rng = np.random.default_rng(seed)
    params = example_params(name, seq_len, rng)
    bound = maskc.load(EXAMPLES / f"{name}.mask").bind(seq_len=seq_len, **params)
    mod = bound.flex_mask_mod(device="cpu")
    q = torch.arange(seq_len)[:, None]
    k = torch.arange(bound.kv_len)[None, :]          # cross_images and tree_verify bring their own kv_len
    for h in range(bound.num_heads or 1):
        got = mod(torch.tensor(0), torch.tensor(h), q, k)
        np.testing.assert_array_equal(np.broadcast_to(got.numpy(), (seq_len, bound.kv_len)), bound.dense(0, h))


def test_mask_mod_reads_each_batch_element():
    bound = maskc.load(EXAMPLES / "document.mask").bind(seq_len=40, kv_len=50, docs=[[10, 30], [40]])
    mod = bound.flex_mask_mod(device="cpu")
    q, k = torch.arange(40)[:, None], torch.arange(50)[None, :]
    for b in range(2):
        np.testing.assert_array_equal(mod(torch.tensor(b), torch.tensor(0), q, k).numpy(), bound.dense(b))


def test_block_mask_rebuilds_tiles():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    bound = maskc.load(EXAMPLES / "shared_prompt.mask").bind(seq_len=1000, prompt=300, responses=[200, 500])
    block_mask = bound.to_flex_block_mask(block_size=128, device="cpu")
    dense = block_mask.to_dense()[0, 0].numpy()       # 1 where a block is listed (partial or full)
    tiles = bound.tiles(128, 128)
    np.testing.assert_array_equal(dense.astype(bool), tiles != maskc.EMPTY)
    assert isinstance(block_mask, flex.BlockMask)


def test_mask_mod_on_its_own_device_is_itself_and_compiles_without_side_effects():
    """on() of the tables' own device returns the object (nothing cached: dynamo refuses dict mutation inside
    flex_attention's higher-order op), and the mask_mod traces under torch.compile."""
    torch = pytest.importorskip("torch")
    from torch.nn.attention.flex_attention import flex_attention

    bound = maskc.load(EXAMPLES / "document.mask").bind(seq_len=200, docs=[80, 120])
    mod = bound.flex_mask_mod()
    assert mod.on("cpu") is mod and len(mod._copies) == 1
    q = torch.randn(1, 2, 200, 64)
    block_mask = bound.to_flex_block_mask()
    out = torch.compile(flex_attention)(q, q, q, block_mask=block_mask)
    ref = flex_attention(q, q, q, block_mask=block_mask)
    assert torch.allclose(out, ref, atol=1e-5) and len(mod._copies) == 1


@pytest.mark.parametrize("name,B,H,params", [
    ("causal", 2, 3, {}), ("causal", None, None, {}), ("causal", None, 5, {}), ("causal", 4, None, {}),
    ("document", 2, 3, {"docs": [[100, 412], [500, 12]]}), ("document", None, 2, {"docs": [[100, 412], [500, 12]]}),
    ("per_head_window", 2, 4, {"window": [16, 32, 200, 128]}),
])
def test_create_block_mask_has_the_shape_flex_gives(name, B, H, params):
    """maskc.create_block_mask(B=, H=) gives the BlockMask torch's create_block_mask gives for the same
    arguments and the mask's own mask_mod: the same (B, H) in every array (a mask the same for every batch
    element or head broadcast), the same blocks where maskc's tiles are exact (per head, maskc lists the blocks
    any head needs: sound, the mask_mod hides the rest), and the same flex_attention output."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    mine = maskc.create_block_mask(EXAMPLES / f"{name}.mask", B=B, H=H, Q_LEN=512, **params)
    batch = mine.mask_mod.bound.batch            # a batch the parameters give stands for B=None
    theirs = create_block_mask(mine.mask_mod, B if B is not None or batch == 1 else batch, H, 512, 512, device="cpu")
    assert mine.shape == theirs.shape
    for field in ("kv_num_blocks", "kv_indices", "full_kv_num_blocks", "full_kv_indices", "q_num_blocks",
                  "q_indices", "full_q_num_blocks", "full_q_indices"):
        assert getattr(mine, field).shape == getattr(theirs, field).shape, field
    listed, needed = mine.to_dense().bool(), theirs.to_dense().bool()
    assert bool((needed <= listed).all())
    if name != "per_head_window":
        assert torch.equal(listed, needed)
        assert torch.equal(mine.full_kv_num_blocks, theirs.full_kv_num_blocks)
    q = torch.randn(mine.shape[0], H or 1, 512, 16, generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(flex_attention(q, q, q, block_mask=mine), flex_attention(q, q, q, block_mask=theirs))


def test_create_block_mask_refuses_a_batch_the_parameters_contradict():
    with pytest.raises(maskc.BindError, match="B=3, but the parameters describe 2 batch elements"):
        maskc.create_block_mask(EXAMPLES / "document.mask", B=3, Q_LEN=512, docs=[[100, 412], [500, 12]])
