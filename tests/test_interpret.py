"""The one interpreter (maskc.analysis.interpret): every node of the resolved IR has its case, and its backends
(numpy for dense() and the score reference, torch for Flex's mask_mod and score_mod) compute the same values,
node by node, at every position pair and for every batch element and head."""
import typing

import numpy as np
import pytest

import maskc
from maskc import ir
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.score import ScoreEvaluator
from maskc.flex_mods import _TorchScores, _TorchValues

torch = pytest.importorskip("torch")

SOURCE = """\
mask m(n: int = 3, docs: segments, w: per docs = 2, t: table[4, n], s: per h, c: float = 2.5, f: float table,
       g: float per h)
  allow k <= q
  deny same(docs) and k < q - w(q)
  score = score + c * f[q - k] - g
"""
S = 12
VALUES = [dict(docs=[5, 7], w=[1, 3], t=[[(i * 5 + j) % 7 - 3 for j in range(3)] for i in range(4)], s=[2, 5],
               f=[0.5, -1.0, 2.0], g=[0.25, -0.75], c=2.5),
          dict(docs=[12], w=[4], t=[[i - j for j in range(3)] for i in range(4)], s=[1, 1], f=[3.0],
               g=[1.0, 2.0], c=-1.5)]
BATCHED = {key: [v[key] for v in VALUES] for key in VALUES[0]}

q, k = ir.Pos("q"), ir.Pos("k")
one, three = ir.Const(1), ir.Const(3)
INTS = [one, q, k, ir.Builtin("seq_len"), ir.Builtin("kv_len"), ir.Builtin("h"), ir.Builtin("b"), ir.ParamRef("n"),
        *(ir.SegAttr("docs", a, p) for a in ir.SEGMENT_ATTRS for p in "qk"), ir.SegValue("w", "docs", "k"),
        ir.TableAt("t", (ir.Arith("%", q, ir.Const(4)), ir.Arith("%", k, three)), (ir.ParamRef("n"), one)),
        ir.TableAt("s", (ir.Builtin("h"),), (one,)),
        ir.Func("min", (q, ir.Arith("*", k, three))), ir.Func("max", (q, k)), ir.Func("abs", (ir.Arith("-", q, k),)),
        *(ir.Arith(op, ir.Arith("-", q, ir.Const(5)), three) for op in ("+", "-", "*", "//", "%")),
        *(ir.Arith(op, ir.Arith("-", k, q), ir.Const(2)) for op in ir.BIT_OPS)]
CONDS = [ir.Truth(True), ir.Truth(False), *(ir.Cmp(op, q, ir.Arith("+", k, one)) for op in
                                           ("<", "<=", "==", "!=", ">=", ">")),
         ir.Same("docs"), ir.Negate(ir.Same("docs")), ir.All((ir.Cmp("<=", k, q), ir.Same("docs"))),
         ir.Any_((ir.Cmp("<", q, k), ir.Negate(ir.Same("docs"))))]
SCORES = [ir.ScoreIn(), ir.FloatConst(0.5), ir.FloatParam("c"), ir.FloatAt("f", ir.Arith("-", q, k)),
          ir.FloatAt("g", ir.Builtin("h")), ir.ToFloat(ir.Arith("//", ir.Arith("-", q, k), three)),
          *(ir.FArith(op, ir.ScoreIn(), ir.FloatParam("c")) for op in ("+", "-", "*", "/")),
          ir.FCall("tanh", (ir.ScoreIn(),)), ir.FCall("softcap", (ir.ScoreIn(), ir.FloatParam("c")))]


def test_every_node_has_a_case():
    """A node added to the IR's unions without a case in the interpreter (or a sample here) fails this."""
    covered = {type(e) for e in INTS + CONDS + SCORES}
    for union in (ir.IntExpr, ir.Cond, ir.ScoreExpr):
        assert set(typing.get_args(union)) <= covered


@pytest.fixture(scope="module")
def bound():
    return maskc.compile_mask(SOURCE).bind(seq_len=S, num_heads=2, **BATCHED)


@pytest.mark.parametrize("expr", INTS + CONDS, ids=repr)
def test_torch_and_numpy_agree(bound, expr):
    mod = bound.flex_mask_mod()
    qs, ks = np.arange(S)[:, None], np.arange(S)[None, :]
    for b in range(bound.batch):
        for h in range(2):
            ev = Evaluator(bound.mask.resolved, bound.params.batch[b], S, S, h, b)
            tv = _TorchValues(mod, torch.tensor(b), torch.tensor(h))
            walk = "int" if isinstance(expr, typing.get_args(ir.IntExpr)) else "cond"
            want = np.broadcast_to(getattr(ev, walk)(expr, qs, ks), (S, S))
            got = getattr(tv, walk)(expr, torch.from_numpy(qs), torch.from_numpy(ks))
            np.testing.assert_array_equal(np.broadcast_to(np.asarray(got), (S, S)), want, err_msg=f"b={b} h={h}")


@pytest.mark.parametrize("expr", SCORES, ids=repr)
def test_score_backends_agree(bound, expr):
    score_mod = bound.flex_score_mod()
    x = np.random.default_rng(0).uniform(-3, 3, (S, S))
    qs, ks = np.arange(S)[:, None], np.arange(S)[None, :]
    for b in range(bound.batch):
        for h in range(2):
            want, _ = ScoreEvaluator(bound.mask.resolved, bound.params.batch[b], S, S, h, b).score(expr, x, qs, ks)
            got = _TorchScores(score_mod, torch.tensor(b), torch.tensor(h)).score(
                expr, torch.from_numpy(x), torch.from_numpy(qs), torch.from_numpy(ks))
            np.testing.assert_allclose(np.broadcast_to(np.asarray(got, np.float64), (S, S)),
                                       np.broadcast_to(want, (S, S)), rtol=1e-12, err_msg=f"b={b} h={h}")
