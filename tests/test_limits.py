"""Bounded work (issue 17, item 4): inputs that used to take exponential time or unbounded memory are
either handled by an algorithm that does not blow up, or refused by a budget with a located error.
The budgets count work (nodes, cases), never time, so these tests assert errors and results only."""
import numpy as np
import pytest

import maskc
from maskc.errors import ComplexityError
from maskc.linear import MAX_TERM_NODES
from maskc.resolve import MAX_EXPANDED_NODES

from conftest import tile_truth


def _compile_error(text: str) -> ComplexityError:
    with pytest.raises(ComplexityError) as info:
        maskc.compile_mask(text, path="limits.mask")
    err = info.value
    assert err.span is not None and err.span.file == "limits.mask"
    assert "Traceback" not in str(err) and "^" in str(err)
    return err


def _agrees(text: str, oracle, n: int = 40, **params):
    """The compiled mask's tiles and dense mask against a numpy oracle of (q, k)."""
    bound = maskc.compile_mask(text).bind(n, **params)
    q, k = np.meshgrid(np.arange(n), np.arange(n), indexing="ij")
    expected = oracle(q, k)
    np.testing.assert_array_equal(bound.dense(), expected)
    np.testing.assert_array_equal(bound.tiles(8, 8), tile_truth(expected.astype(np.int8), 8, 8))


def test_nested_abs_from_the_issue_is_refused_at_its_rule():
    # 13 nested abs: abs(x) is max(x, -x), so the term doubles per level (over 30 s before the budget)
    text = "mask m()\n  allow k <= q\n  allow " + "abs(" * 13 + "k - q" + ")" * 13 + " <= 3\n"
    err = _compile_error(text)
    assert (err.span.line, err.span.col) == (3, 3)
    assert str(MAX_TERM_NODES) in err.message and "abs" in err.hint


def test_nested_abs_within_the_budget_is_exact():
    text = "mask m()\n  allow " + "abs(" * 6 + "k - q" + ")" * 6 + " <= 3\n"
    _agrees(text, lambda q, k: np.abs(k - q) <= 3)


def test_a_let_chain_that_doubles_is_refused_at_its_rule():
    lets = "".join(f"  let a{i} = a{i - 1} + a{i - 1}\n" for i in range(1, 30))
    err = _compile_error("mask m()\n  let a0 = k - q\n" + lets + "  allow a29 <= 3\n")
    assert err.span.line == 32 and str(MAX_EXPANDED_NODES) in err.message and "let" in err.hint


def test_a_let_function_nested_into_itself_is_refused():
    # its argument is shared, so resolving is quick, but written out it doubles per call
    _compile_error("mask m()\n  let f(x) = x + x\n  allow " + "f(" * 20 + "k" + ")" * 20 + " <= q\n")


def test_a_short_let_chain_still_compiles_and_is_exact():
    lets = "".join(f"  let a{i} = a{i - 1} + a{i - 1}\n" for i in range(1, 6))
    _agrees("mask m()\n  let a0 = k - q\n" + lets + "  allow a5 <= 64, k <= q\n",
            lambda q, k: (32 * (k - q) <= 64) & (k <= q))


def test_powers_of_powers_are_refused():
    _compile_error("mask m()\n  allow " + "(" * 5 + "k" + "**8)" * 5 + " <= q\n")


@pytest.mark.parametrize("n", [3, 40])
def test_many_inequalities_no_longer_double_the_work(n):
    # each '!=' has two cases; 40 of them were 2**40 combinations before partial conjunctions were merged
    _agrees("mask m()\n  allow " + " and ".join(["k != q"] * n) + ", k <= q\n", lambda q, k: k < q)
    _agrees("mask m()\n  allow k <= q, " + " and ".join(f"k != q - {i}" for i in range(n)) + "\n",
            lambda q, k: k <= q - n)


def test_inequalities_in_many_directions_hit_the_region_budget():
    # genuinely 2**12 regions: refused, at the rule, with a hint
    err = _compile_error("mask m()\n  allow " + " and ".join(f"{i + 2} * k != q" for i in range(12)) + "\n")
    assert err.span.line == 2 and err.hint
