"""Mask parameters named like a call's own keywords (maskc.call_params): every call that binds takes ``params=``
beside the keyword arguments, and a keyword that could mean either the call's argument or the mask's parameter is
an error naming the way out, never a silent choice. tests/catalogue's tiled_natten declares ``H``."""
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

import maskc
from maskc.cli import cli

CATALOGUE = Path(__file__).parent / "catalogue"
NATTEN = dict(W=16, K_W=3, K_H=3, T_W=4, T_H=4)          # tiled_natten's values but H, on a 16 x 16 canvas


def tiled_natten():
    return maskc.load(CATALOGUE / "natten.mask", "tiled_natten")


def test_params_mapping_binds_as_keywords_do():
    mask = maskc.load(Path(__file__).parent.parent / "examples" / "document.mask")
    by_keywords = mask.bind(64, docs=[10, 54])
    assert np.array_equal(mask.bind(64, params={"docs": [10, 54]}).dense(), by_keywords.dense())
    hstu = maskc.load(Path(__file__).parent.parent / "examples" / "hstu.mask")
    both = hstu.bind(50, params={"users": [20, 30]}, targets=[2, 3])          # some in each
    assert np.array_equal(both.dense(), hstu.bind(50, users=[20, 30], targets=[2, 3]).dense())


@pytest.mark.parametrize("params,message", [
    ({"docs": [64]}, "parameter 'docs' is given twice, in params= and as docs="),
    ([("docs", [64])], "params= takes a mapping"),
    ({1: [64]}, "maps parameter names"),
])
def test_params_mapping_misuse_is_a_type_error(params, message):
    mask = maskc.load(Path(__file__).parent.parent / "examples" / "document.mask")
    with pytest.raises(TypeError, match=message):
        mask.bind(64, params=params, docs=[64])


def test_params_cannot_be_a_parameter_name():
    with pytest.raises(maskc.MaskError, match="'params' is the name of the mapping") as info:
        maskc.compile_mask("mask m(params: int)\n  allow k <= q\n")
    assert (info.value.span.line, info.value.span.col) == (1, 8)


def test_cli_param_reaches_a_parameter_named_like_an_api_keyword():
    """--param is its own namespace: tiled_natten's H is given there like any other parameter."""
    args = [f"{k}={v}" for k, v in NATTEN.items()] + ["H=16"]
    result = CliRunner().invoke(cli, ["show", str(CATALOGUE / "natten.mask"), "-m", "tiled_natten", "--seq-len", "256",
                                      "--block-m", "16", "--block-n", "16"] + [x for a in args for x in ("--param", a)])
    assert result.exit_code == 0, result.output


# -- create_block_mask / create_mask (torch) -----------------------------------------------------------------

def test_create_block_mask_takes_a_parameter_named_h_in_params():
    pytest.importorskip("torch")
    mask = tiled_natten()
    want = mask.bind(256, H=16, **NATTEN)
    block_mask = maskc.create_block_mask(mask, Q_LEN=256, BLOCK_SIZE=16, params={"H": 16}, **NATTEN)
    assert block_mask.mask_mod.bound.params.batch[0].ints == want.params.batch[0].ints
    dense = maskc.create_mask(mask, Q_LEN=256, params={"H": 16}, **NATTEN)
    assert np.array_equal(dense[0, 0].numpy(), want.dense())
    # with params= giving the mask's H, H= is create_block_mask's heads (repeated: the mask does not read h)
    assert tuple(maskc.create_block_mask(mask, None, 3, 256, params={"H": 16}, **NATTEN).kv_num_blocks.shape)[:2] == (1, 3)


@pytest.mark.parametrize("call", ["create_block_mask", "create_mask"])
def test_create_block_mask_refuses_h_that_could_mean_either(call):
    """H=16 once meant the heads silently, and the mask's H was missing (or took its default)."""
    pytest.importorskip("torch")
    with pytest.raises(maskc.BindError) as info:
        getattr(maskc, call)(tiled_natten(), Q_LEN=256, H=16, **NATTEN)
    err = info.value
    assert f"{call}(H=...) is ambiguous" in err.message and "declares a parameter 'H'" in err.message
    assert err.hint == f"give the mask's value as params={{'H': ...}}; H= then means {call}'s number of heads only"
    assert (err.span.line, err.span.col) == (20, 27) and err.span.file.endswith("natten.mask")
    with pytest.raises(maskc.BindError) as missing:        # not given at all: bind's error, with the way out
        getattr(maskc, call)(tiled_natten(), Q_LEN=256, **NATTEN)
    assert "needs parameter 'H'" in missing.value.message and "params={'H': ...}" in missing.value.hint


@pytest.mark.parametrize("keyword,value", [("BLOCK_SIZE", 16), ("device", "cpu"), ("B", 1), ("KV_LEN", 64),
                                           ("Q_LEN", 64)])
def test_every_keyword_of_create_block_mask_is_guarded(keyword, value):
    pytest.importorskip("torch")
    mask = maskc.compile_mask(f"mask m({keyword}: int = 4)\n  allow k <= q, q - k < {keyword}\n")
    args = {"Q_LEN": 64, keyword: value}
    with pytest.raises(maskc.BindError, match=rf"create_block_mask\({keyword}=\.\.\.\) is ambiguous"):
        maskc.create_block_mask(mask, **args)
    block_mask = maskc.create_block_mask(mask, params={keyword: 2}, **args)
    assert block_mask.mask_mod.bound.params.batch[0].int(keyword) == 2


# -- bind_on_device, update ------------------------------------------------------------------------------------

@pytest.mark.parametrize("keyword,value", [("device", "cpu"), ("max_bytes", 1 << 20), ("max_segments", 4)])
def test_bind_on_device_takes_parameters_named_like_its_keywords_in_params(keyword, value):
    pytest.importorskip("torch")
    mask = maskc.compile_mask(f"mask m(docs: segments, {keyword}: int)\n  allow same(docs), k <= q, q - k < {keyword}\n")
    own = {"device": "cpu", keyword: value}
    with pytest.raises(maskc.BindError, match=rf"bind_on_device\({keyword}=\.\.\.\) is ambiguous") as info:
        mask.bind_on_device(64, docs=[64], **own)
    assert info.value.hint.startswith(f"give the mask's value as params={{'{keyword}': ...}}")
    dm = mask.bind_on_device(64, docs=[32, 32], params={keyword: 5}, **own)
    assert np.array_equal(dm.to_host().dense(), mask.bind(64, docs=[32, 32], params={keyword: 5}).dense())
    dm.update(params={keyword: 3})
    assert np.array_equal(dm.to_host().dense(), mask.bind(64, docs=[32, 32], params={keyword: 3}).dense())
    with pytest.raises(TypeError, match="given twice"):
        dm.update(params={"docs": [64]}, docs=[64])
