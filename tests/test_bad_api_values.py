"""Bad values handed to the Python API (issue 17, items 3 and 6): a MaskError that says what is wrong,
never ZeroDivisionError, IndexError or a value pasted into CUDA."""
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
