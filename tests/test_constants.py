"""const parameters are written into CUDA as literals (issue 17, item 6): their values are checked (type,
32-bit range, the divisors they decide positive) before anything is emitted, from the Python API and from
`maskc compile --param`."""
import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import maskc
from maskc.cli import cli
from maskc.errors import BindError

from conftest import EXAMPLES

CLEAR = EXAMPLES / "clear.mask"
NESTED = "mask m(a: const int = 3, c: const int = 2)\n  allow k <= q // (a // c), q - k < 64 // c\n"


@pytest.mark.parametrize("value", ["5", "5); __trap(); (", 5.0, True, None, [8], 2 ** 32, -2 ** 31 - 1,
                                   np.float32(3)])
def test_kernel_source_refuses_a_value_that_is_not_a_32_bit_integer(value):
    """kernel_source(constants=...) pasted strings and floats into the CUDA source."""
    mask = maskc.load(CLEAR)
    with pytest.raises(BindError, match="const parameter 'width'") as err:
        mask.kernel_source(constants={"width": value}, engine="mma", arch="sm_80")
    assert err.value.span is not None and err.value.span.line > 1          # at the parameter


@pytest.mark.parametrize("value", [0, -3])
def test_a_const_divisor_must_be_positive(value):
    mask = maskc.load(CLEAR)
    with pytest.raises(BindError, match=f"'width' = {value} makes the divisor 'width' = {value}, and a divisor must be positive"):
        mask.kernel_spec(constants={"width": value})
    with pytest.raises(BindError):
        mask.backward_spec(head_dim=64, constants={"width": value})


def test_numpy_integers_are_integers():
    mask = maskc.load(CLEAR)
    assert mask.const_values({"width": np.int64(64)}) == (("text", 512), ("width", 64))
    assert "(64)" in mask.kernel_spec(constants={"width": np.int32(64)}).predicate.source


def test_inner_divisors_are_checked_first():
    """(a // c) with c = 0 would divide by zero while folding the outer divisor."""
    mask = maskc.compile_mask(NESTED)
    with pytest.raises(BindError, match="'c' = 0 makes the divisor 'c' = 0"):
        mask.const_values({"c": 0})
    with pytest.raises(BindError, match=r"'a' = 1, 'c' = 2 makes the divisor '.*a.*c.*' = 0"):
        mask.const_values({"a": 1})
    assert mask.const_values({"a": 4}) == (("a", 4), ("c", 2))


def test_a_bad_default_is_refused_too():
    mask = maskc.compile_mask("mask m(w: const int = 0)\n  allow k <= q // w\n")
    with pytest.raises(BindError, match="'w' = 0 makes the divisor 'w' = 0"):
        mask.kernel_spec()


@pytest.mark.parametrize("given", ["width=64", 64, [("width",)], [1, 2]])
def test_constants_that_are_not_a_mapping(given):
    with pytest.raises(maskc.MaskError):
        maskc.load(CLEAR).const_values(given)


@settings(max_examples=50, deadline=None)
@given(a=st.one_of(st.integers(-4, 8), st.integers(-2 ** 40, 2 ** 40)),
       c=st.one_of(st.integers(-4, 8), st.integers(-2 ** 40, 2 ** 40)))
def test_accepted_constants_are_what_bind_accepts(a, c):
    """An oracle independent of check_constants: bind's own checks (32-bit ints, positive divisors)."""
    mask = maskc.compile_mask(NESTED)
    try:
        mask.bind(8, a=a, c=c)
        bind_ok = True
    except BindError:
        bind_ok = False
    try:
        mask.const_values({"a": a, "c": c})
        const_ok = True
    except BindError:
        const_ok = False
    assert const_ok == bind_ok


@pytest.mark.parametrize("value", ["0", "-3", str(2 ** 32), "64;32"])
def test_cli_compile_refuses_bad_const_values(value, tmp_path):
    out = tmp_path / "clear.cu"
    result = CliRunner().invoke(cli, ["compile", str(CLEAR), "--param", f"width={value}", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert "width" in result.output and "internal error" not in result.output
    assert "Traceback" not in result.output and not out.exists()
