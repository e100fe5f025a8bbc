"""maskc.analysis.condprog: a compiled ``require`` condition is the Evaluator's, array for array."""
import warnings

import numpy as np
import pytest
from hypothesis import event, given, settings, strategies as st

import maskc
from maskc import ir
from maskc.analysis.condprog import CondProgram, Inexact, program_of
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.formprog import Env
from maskc.analysis.values import INT32

_TEXT = "mask m(users: segments, t: per users, a: int, c: int)\n  allow k <= q\n"

_leaves = st.one_of(
    st.builds(ir.Const, st.one_of(st.integers(-40, 40), st.integers(-(1 << 62), 1 << 62))),
    st.builds(ir.ParamRef, st.sampled_from(["a", "c"])),
    st.builds(ir.Builtin, st.sampled_from(["seq_len", "kv_len", "h", "b"])),
    st.just(ir.Pos("q")),
    st.builds(ir.SegAttr, st.just("users"), st.sampled_from(["start", "end", "length", "index"]), st.just("q")),
    st.just(ir.SegValue("t", "users", "q")))
_ints = st.recursive(_leaves, lambda inner: st.one_of(
    st.builds(ir.Arith, st.sampled_from(["+", "-", "*"]), inner, inner),
    st.builds(ir.Func, st.sampled_from(["min", "max"]), st.lists(inner, min_size=2, max_size=3).map(tuple)),
    st.builds(ir.Func, st.just("abs"), st.tuples(inner))), max_leaves=6)
_conds = st.recursive(
    st.one_of(st.builds(ir.Cmp, st.sampled_from(["<", "<=", "==", "!=", ">=", ">"]), _ints, _ints),
              st.builds(ir.Truth, st.booleans())),
    lambda inner: st.one_of(st.builds(ir.Negate, inner),
                            st.builds(ir.All, st.lists(inner, min_size=1, max_size=3).map(tuple)),
                            st.builds(ir.Any_, st.lists(inner, min_size=1, max_size=3).map(tuple))), max_leaves=5)


@settings(max_examples=400)
@given(_conds, st.lists(st.integers(0, 9), min_size=1, max_size=4), st.integers(0, 6),
       st.lists(st.integers(-INT32, INT32), min_size=4, max_size=4), st.integers(-50, 50),
       st.sampled_from([-INT32, -3, 0, 2, INT32]), st.integers(0, 2))
def test_a_compiled_condition_is_the_evaluators(cond, lengths, tail, targets, a, c, head):
    """CondProgram.run is the Evaluator's truth at every position (segment starts, inside, the gap after the
    segments and past them), or Inexact where an integer of parameters alone leaves int64 (the Evaluator's
    scalars wrap there)."""
    lengths = [lengths[0] + 1] + lengths[1:]                  # seq_len >= 1
    seq_len = sum(lengths) + tail
    kv_len = seq_len + 3
    values = {"users": lengths + [tail] if tail else lengths, "t": (targets * 3)[:len(lengths) + (1 if tail else 0)]}
    bound = maskc.compile_mask(_TEXT).bind(seq_len=seq_len, kv_len=kv_len, a=a, c=c, **values)
    params = bound.params.batch[0]
    q = np.arange(-1, seq_len + 2, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)        # int64 scalars wrapping in the Evaluator
        expected = Evaluator(bound.mask.resolved, params, seq_len, kv_len, head, 0).cond(cond, q, None)
        try:
            found = CondProgram(cond).run(Env(params, seq_len, kv_len, head, 0, q))
        except Inexact:
            event("inexact")
            return
    event("array" if np.ndim(found) else "one value")
    np.testing.assert_array_equal(np.broadcast_to(np.asarray(found, bool), q.shape),
                                  np.broadcast_to(np.asarray(expected, bool), q.shape))


@pytest.mark.parametrize("text", [
    "0 <= targets(q) <= users.length(q) - max(c - 1, 0)",
    "users.index(q) >= 0 or c > 2",
    "not (q < c) and abs(targets(q) - c) < 100",
])
def test_conditions_of_the_compiled_nodes_are_compiled(text):
    """A require of positions, segments, parameters, + - *, min, max, abs, comparisons and logic compiles, once."""
    mask = maskc.compile_mask("mask m(users: segments, targets: per users, c: int)\n"
                              f"  require {text}\n  allow k <= q\n")
    (rule,) = mask.resolved.requires
    assert program_of(rule.cond) is not None and program_of(rule.cond) is program_of(rule.cond)


@pytest.mark.parametrize("text", ["q // c >= 0", "(q & c) >= 0", "same(users)"])
def test_other_conditions_keep_the_evaluator(text):
    """Division (the Evaluator checks its divisor), bit operations and ``same`` are not compiled."""
    mask = maskc.compile_mask("mask m(users: segments, c: int)\n"
                              f"  require {text}\n  allow k <= q\n")
    (rule,) = mask.resolved.requires
    assert program_of(rule.cond) is None


def test_an_integer_of_parameters_past_int64_is_inexact():
    """``2**62 * c < 0`` with c = 2: the Evaluator's int64 scalars wrap (true), Python's integers do not (false):
    the program says Inexact rather than disagree, and bind takes the Evaluator's."""
    bound = maskc.compile_mask(_TEXT).bind(seq_len=4, a=0, c=2, users=[4], t=[0])
    params = bound.params.batch[0]
    cond = ir.Cmp("<", ir.Arith("*", ir.Const(1 << 62), ir.ParamRef("c")), ir.Const(0))
    q = np.arange(4, dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert bool(Evaluator(bound.mask.resolved, params, 4, 4).cond(cond, q, None))
    with pytest.raises(Inexact):
        CondProgram(cond).run(Env(params, 4, 4, 0, 0, q))
