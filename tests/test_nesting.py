"""Nesting is bounded (issue 17, item 3): past MAX_NESTING levels, or MAX_CALL_DEPTH masks calling one
another, a located MaskError; up to them, every pass (explain and lint too) runs without RecursionError.
On ae0f919 these inputs raised RecursionError from 340-480 levels."""
import pytest
from click.testing import CliRunner

import maskc
from maskc.cli import cli
from maskc.errors import MaskError
from maskc.frontend.parse import MAX_NESTING
from maskc.frontend.resolve import MAX_CALL_DEPTH


def shapes(n: int) -> dict[str, str]:
    """Masks whose one rule nests about n levels, each a different way."""
    head = "mask m(a: int = 1)\n"
    lets = "".join(f"  let a{i} = a{i - 1} + 1\n" for i in range(1, n))
    fns = "".join(f"  let f{i}(x) = f{i - 1}(x) + 1\n" for i in range(1, n))
    return {
        "sum": head + "  allow k <= q" + " + 1" * (n - 1) + "\n",
        "negation": head + "  allow k <= " + "-" * (n - 1) + "q\n",
        "not": head + "  allow " + "not " * (n - 1) + "k <= q\n",
        "min": head + "  allow k <= " + "min(" * (n - 2) + "q" + ", a)" * (n - 2) + "\n",
        "product": head + "  allow k <= " + "a * (" * (n - 2) + "q" + ")" * (n - 2) + "\n",
        "lets": head + "  let a0 = q\n" + lets + f"  allow k <= a{n - 1}\n",
        "let functions": head + "  let f0(x) = x\n" + fns + f"  allow k <= f{n - 1}(q)\n",
    }


@pytest.mark.parametrize("shape", sorted(shapes(3)))
def test_nesting_up_to_the_limit_runs_every_pass(shape, tmp_path):
    text = shapes(MAX_NESTING - 2)[shape]
    compiled = maskc.compile_mask(text)
    bound = compiled.bind(40)
    bound.dense()
    bound.tiles(16, 16)
    compiled.kernel_spec(head_dim=64)
    (tmp_path / "m.mask").write_text(text)
    for args in (["explain", str(tmp_path / "m.mask"), "--seq-len", "40"], ["lint", str(tmp_path / "m.mask")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0 and "internal error" not in result.output, result.output


@pytest.mark.parametrize("n", [MAX_NESTING + 2, 480, 5000])
@pytest.mark.parametrize("shape", sorted(shapes(3)))
def test_nesting_past_the_limit_is_a_located_error(shape, n):
    with pytest.raises(MaskError, match=f"more than {MAX_NESTING} levels|nests too deeply") as info:
        maskc.compile_mask(shapes(n)[shape])
    assert info.value.span is not None and info.value.span.line >= 2 and info.value.span.source_line


def test_parentheses_alone_do_not_nest():
    assert maskc.compile_mask("mask m()\n  allow k <= " + "(" * 5000 + "q" + ")" * 5000 + "\n").bind(4).dense().sum() == 10


def test_min_of_many_arguments_is_bounded():
    """min(a, b, c, ...) becomes nested pairs: a long argument list nests as deep."""
    args = ", ".join(f"q + {i}" for i in range(3 * MAX_NESTING))
    with pytest.raises(MaskError, match="levels deep"):
        maskc.compile_mask(f"mask m()\n  allow k <= min({args})\n")


def chain(n: int, extra: str = "") -> str:
    text = "mask m0()\n  allow k <= q\n"
    return text + "".join(f"mask m{i}()\n{extra}  allow m{i - 1}()\n" for i in range(1, n))


@pytest.mark.parametrize("n", [MAX_CALL_DEPTH + 1, 150, 3000])
def test_mask_call_chains_past_the_limit(n, tmp_path):
    with pytest.raises(MaskError, match=f"more than {MAX_CALL_DEPTH} deep") as info:
        maskc.compile_mask(chain(n), name=f"m{n - 1}")
    assert info.value.span.source_line.strip().startswith("allow m")
    (tmp_path / "c.mask").write_text(chain(n))
    with pytest.raises(MaskError, match=f"more than {MAX_CALL_DEPTH} deep"):
        maskc.compile_all(tmp_path / "c.mask")


def test_deepest_chain_with_deep_lets_in_every_mask():
    """The resolver's worst case within the limits: MAX_CALL_DEPTH masks, each with deep lets."""
    lets = "  let a0 = q\n" + "".join(f"  let a{i} = a{i - 1} + 1\n" for i in range(1, MAX_NESTING // 2))
    text = chain(MAX_CALL_DEPTH, lets)
    try:
        maskc.compile_mask(text, name=f"m{MAX_CALL_DEPTH - 1}").bind(8).dense()
    except MaskError:
        pass
    n = MAX_NESTING - MAX_CALL_DEPTH - 6            # resolve's steps: two per let, two per call level
    deep = "  let a0 = q\n" + "".join(f"  let a{i} = a{i - 1} + 1\n" for i in range(1, n)) + f"  allow k <= a{n - 1}\n"
    text = "mask m0()\n" + deep + "".join(f"mask m{i}()\n  allow m{i - 1}() and k >= 0\n"
                                          for i in range(1, MAX_CALL_DEPTH))
    maskc.compile_mask(text, name=f"m{MAX_CALL_DEPTH - 1}").bind(8).dense()
