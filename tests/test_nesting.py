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
        "nested sum": head + "  allow k <= " + "1 + (" * (n - 1) + "q" + ")" * (n - 1) + "\n",
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


# -- flat sums: regrouped, any length ------------------------------------------------------------------

def _flat_sum(terms: list[str], signs: list[bool]) -> str:
    return terms[0] + "".join(f" {'+' if plus else '-'} {t}" for t, plus in zip(terms[1:], signs[1:]))


def _value(values: list, signs: list[bool]):
    """The sum left to right, without Python's parser (which cannot take 5000 terms in one expression)."""
    total = values[0]
    for v, plus in zip(values[1:], signs[1:]):
        total = total + v if plus else total - v
    return total


TERMS = {"1": 1, "a": 3, "q": "q", "k": "k", "2 * c": -4, "(a - 1)": 2, "(q - k + 1)": "d", "c * (1 - a)": 4}


def _check_flat_sum(picks: list[str], signs: list[bool], seq_len: int = 12):
    import numpy as np
    q, k = np.meshgrid(np.arange(seq_len), np.arange(seq_len), indexing="ij")
    arrays = {"q": q, "k": k, "d": q - k + 1}
    values = [arrays[TERMS[t]] if isinstance(TERMS[t], str) else TERMS[t] for t in picks]
    compiled = maskc.compile_mask(f"mask m(a: int, c: int)\n  allow k <= {_flat_sum(picks, signs)}\n")
    dense = compiled.bind(seq_len, a=3, c=-2).dense()
    assert (dense == (k <= _value(values, signs))).all()
    return compiled


@pytest.mark.parametrize("n", [MAX_NESTING + 1, 1000, 5000])
def test_a_flat_sum_of_any_length_runs_every_pass(n, tmp_path):
    """A flat sum is not nesting: past MAX_NESTING terms (refused before session 24) it compiles, binds to what
    its terms add up to, and every pass runs (kernel, explain, lint), inside 40 levels of true nesting too (a sum of
    5000 terms nests 13 deep)."""
    import random
    rng = random.Random(n)
    picks = [rng.choice(sorted(TERMS)) for _ in range(n)]
    signs = [True] + [rng.random() < 0.5 for _ in range(n - 1)]
    compiled = _check_flat_sum(picks, signs)
    compiled.kernel_spec(head_dim=64)
    text = "mask m(a: int = 3, c: int = -2)\n  allow k <= " + "-(" * 40 + _flat_sum(picks, signs) + ")" * 40 + "\n"
    (tmp_path / "m.mask").write_text(text)
    for args in (["explain", str(tmp_path / "m.mask"), "--seq-len", "40"], ["lint", str(tmp_path / "m.mask")]):
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0 and "internal error" not in result.output, result.output


def test_a_flat_sum_needs_a_stack_of_log_depth():
    """The guarantee the nesting limit gives, kept for flat sums: compiling and binding one of 4000 terms takes no
    more stack than the nesting limit allows: it passes under a recursion limit that a left-to-right tree of its
    4000 levels could never pass."""
    import sys
    text = "mask m(a: int)\n  allow k <= q" + " + a - 1" * 2000 + "\n"
    limit = sys.getrecursionlimit()
    try:
        sys.setrecursionlimit(600)
        assert maskc.compile_mask(text).bind(64, a=1).dense().sum() == 64 * 65 // 2
    finally:
        sys.setrecursionlimit(limit)


def test_long_sums_keep_their_order_and_signs_in_the_syntax():
    """The regrouped tree holds the same terms in the same order, each with its sign: a - b + c ... read back."""
    from maskc import ir
    from maskc.frontend.parse import SUM_AS_WRITTEN, parse
    n = 3 * SUM_AS_WRITTEN + 1
    signs = [True] + [i % 3 != 1 for i in range(1, n)]
    rule = parse("mask m()\n  allow k <= " + _flat_sum([f"{i}" for i in range(n)], signs) + "\n").masks[0].rules[0]
    out: list[tuple[int, bool]] = []
    stack = [(rule.conditions[0].operands[1], True)]
    while stack:
        node, plus = stack.pop()
        if isinstance(node, ir.BinOp):
            stack += [(node.right, plus == (node.op == "+")), (node.left, plus)]
        else:
            out.append((node.value, plus))
    assert out == list(zip(range(n), signs))
    short = parse("mask m()\n  allow k <= q - 1 + 2\n").masks[0].rules[0].conditions[0].operands[1]
    assert isinstance(short.left, ir.BinOp) and short.op == "+"          # as written, left to right


def test_a_flat_float_sum_in_a_score_modifier():
    compiled = maskc.compile_mask("mask m()\n  allow k <= q\n  score = score" + " + 0.25" * 200 + "\n")
    assert compiled.resolved.score is not None


try:
    from hypothesis import given, settings, strategies as st

    @settings(max_examples=40, deadline=None)
    @given(st.integers(1, 400).flatmap(lambda n: st.lists(st.tuples(st.sampled_from(sorted(TERMS)), st.booleans()),
                                                          min_size=n, max_size=n)))
    def test_random_flat_sums_bind_to_their_value(items):
        """Sums of random terms and signs, 1 to 400 terms (regrouped past SUM_AS_WRITTEN): bound, they show what
        their terms add up to left to right."""
        picks = [t for t, _ in items]
        signs = [True] + [plus for _, plus in items[1:]]
        _check_flat_sum(picks, signs)
except ImportError:          # hypothesis is a test extra
    pass
