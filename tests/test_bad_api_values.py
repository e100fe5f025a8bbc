"""Bad values handed to the Python API (issue 17, items 3 and 6): a MaskError that says what is wrong,
never ZeroDivisionError, IndexError or a value pasted into CUDA."""
import numpy as np
import pytest

import maskc
from maskc.errors import BindError, MaskError

from conftest import EXAMPLES


@pytest.fixture(scope="module")
def bound():
    return maskc.load(EXAMPLES / "sliding_window.mask").bind(64, window=8)


@pytest.mark.parametrize("blocks", [(0, 0), (0, 16), (16, -1), (2 ** 31, 16), (1.5, 16), ("16", 16), (True, 16),
                                    (None, 16)])
def test_tile_sides_are_checked(bound, blocks):
    """tiles(0, 0) raised ZeroDivisionError on ae0f919; negative sides ValueError from numpy."""
    for method in (bound.tiles, bound.tile_map, bound.descriptor):
        with pytest.raises(BindError, match="block_[mn]"):
            method(*blocks)


def test_good_tile_sides_still_work(bound):
    assert bound.tiles(16, 8).shape == (4, 8)
    assert bound.tiles(1, 1).shape == (64, 64)


@pytest.mark.parametrize("args", [(1, 0), (-1, 0), (0, -1), ("0", 0), (0.0, 0)])
def test_dense_indices_are_checked(bound, args):
    with pytest.raises(BindError, match="batch_index|head"):
        bound.dense(*args)


def test_dense_head_within_num_heads():
    heads = maskc.compile_mask("mask m()\n  allow k <= q, q - k <= h\n").bind(8, num_heads=2)
    heads.dense(0, 1)
    with pytest.raises(BindError, match="head"):
        heads.dense(0, 2)


SOFTCAP = "mask m(cap: float = 2.0)\n  allow k <= q\n  score = softcap(score, cap)\n"


@pytest.mark.parametrize("heads", [None, 2])
@pytest.mark.parametrize("method", ["dense", "modified_scores", "restricted dense", "restricted modified_scores"])
def test_every_element_and_head_index_is_checked(heads, method):
    """dense() and modified_scores(), of a binding and of a block of one, take batch elements in [0, batch) and
    heads in [0, num_heads), head 0 alone where bound without num_heads; on 5dc54e1 a binding without heads took
    any head, and modified_scores() any head and an IndexError for a batch element past the last."""
    bound = maskc.compile_mask(SOFTCAP).bind(8, num_heads=heads, cap=[2.0, 3.0])
    target = bound.restrict((0, 4), (0, 8)) if method.startswith("restricted") else bound
    name = method.split()[-1]

    def call(b, h):
        if name == "dense":
            return target.dense(b, h)
        return target.modified_scores(np.zeros((target.seq_len, target.kv_len)), b, h)

    last = (heads or 1) - 1
    call(1, last)
    for b, h, words in [(2, 0, "batch_index must be an integer in [0, 2), got 2"),
                        (0, last + 1, f"head must be an integer in [0, {heads or 1}), got {last + 1}"),
                        (0, 3, "head must be an integer in"), (-1, 0, "batch_index"), (0, -1, "head")]:
        with pytest.raises(BindError) as info:
            call(b, h)
        assert words in str(info.value), str(info.value)
        if heads is None and "head must" in words:
            assert "bind with num_heads=" in str(info.value), str(info.value)


def test_flex_sizes_are_below_2_to_the_31():
    """check_index's message says [0, 2**31) for the BlockMask's H and B; on 5dc54e1 nothing held them to it."""
    bound = maskc.compile_mask(SOFTCAP).bind(8)
    with pytest.raises(BindError, match=r"H \(the BlockMask's heads\) must be an integer in \[0, 2\*\*31\)"):
        bound.to_flex_block_mask(H=2 ** 62)     # a RuntimeError from torch on 5dc54e1 (2**31: memory)


@pytest.fixture(scope="module")
def clear():
    return maskc.load(EXAMPLES / "clear.mask")


@pytest.mark.parametrize("width,message", [(0, "divisor"), (-3, "divisor"), (2 ** 32, "32 bits"),
                                           ("7; evil()", "integer"), ("128", "integer"), (True, "integer"),
                                           (2.0, "integer")])
def test_const_values_are_checked_before_emitting(clear, width, message):
    """On ae0f919 each of these was written into the CUDA source as it was."""
    with pytest.raises(BindError, match=message) as info:
        clear.kernel_source(constants={"width": width})
    assert "width" in str(info.value) and info.value.span.line == 7


@pytest.mark.parametrize("constants", ["width=3", b"width", 5, [("width",)], [("width", 3, 4)]])
def test_constants_must_be_pairs(clear, constants):
    with pytest.raises(BindError, match="must map const parameter names to integers"):
        clear.kernel_source(constants=constants)


def test_const_requirement_is_checked():
    compiled = maskc.compile_mask("mask m(w: const int = 4)\n  require w >= 2, w <= 64\n  allow q - k < w, k <= q\n")
    compiled.kernel_spec(constants={"w": 64})
    for w in (1, 65):
        with pytest.raises(BindError, match="'w' = .*requirement") as info:
            compiled.kernel_spec(constants={"w": w})
        assert info.value.span.line == 2
    bad_default = maskc.compile_mask("mask m(w: const int = 0)\n  allow k <= q // w\n")
    with pytest.raises(BindError, match="divisor"):
        bad_default.kernel_spec()


def test_const_requirement_reading_run_time_values_waits_for_bind():
    compiled = maskc.compile_mask("mask m(w: const int = 4)\n  require w <= seq_len\n  allow q - k < w, k <= q\n")
    compiled.kernel_spec(constants={"w": 100})
    with pytest.raises(BindError):
        compiled.bind(8, w=100)


def test_cli_const_values_exit_1_without_writing(tmp_path):
    from click.testing import CliRunner
    from maskc.cli import cli
    for value in ("0", "-3", str(2 ** 32)):
        out = tmp_path / f"k{value}.cu"
        result = CliRunner().invoke(cli, ["compile", str(EXAMPLES / "clear.mask"), "--param", f"width={value}",
                                          "-o", str(out)])
        assert result.exit_code == 1 and "width" in result.output and "internal error" not in result.output
        assert not out.exists()
    assert issubclass(BindError, MaskError)


@pytest.mark.parametrize("scale", ["x", float("nan"), -1.0, 0, True, [1.0], float("inf")])
def test_attention_scale_is_checked_on_the_cpu_path_too(bound, scale):
    # the CPU path returned NaNs for nan, ran negative scales the kernels refuse, and 'x' was a bare ValueError
    torch = pytest.importorskip("torch")
    from maskc.runtime.operands import AttentionInputError
    q = torch.randn(1, 1, 64, 16)
    with pytest.raises(AttentionInputError, match=r"scale must be a finite positive number, got "):
        maskc.attention(q, q, q, bound, scale=scale)
    assert maskc.attention(q, q, q, bound, scale=0.25).shape == q.shape


@pytest.mark.parametrize("text", [b"mask a()\n  allow k <= q\n", None, 5])
def test_compile_mask_takes_text(text):
    # bytes raised "a bytes-like object is required, not 'str'", the opposite of the mistake
    with pytest.raises(TypeError, match=r"takes the text of a \.mask file as a str, not "):
        maskc.compile_mask(text)
