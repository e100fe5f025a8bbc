"""A score modifier's expression as C statements (:class:`ScoreWriter`), for :mod:`maskc.codegen.score`: the
parts free of q, k and the score hoisted into ``ScoreHead`` fields, the rest per pair with its derivative
(forward mode), in the kernels' raw units (see maskc.codegen.score's docstring)."""
from __future__ import annotations

from maskc import ir
from maskc.codegen.cwriter import TableLayout
from maskc.ir.walk import mentions

ONE = "1.f"   # a derivative of 1 (additive modifiers), which multiplies nothing


def _literal(value: float) -> str:
    text = repr(float(value))
    return (text if any(c in text for c in ".e") else text + ".0") + "f"


def _reads(e, score: bool) -> bool:
    """Whether ``e`` reads the score (``score``), else whether it reads q or k."""
    if isinstance(e, ir.ScoreIn):
        return score
    if isinstance(e, ir.FArith):
        return _reads(e.left, score) or _reads(e.right, score)
    if isinstance(e, ir.FCall):
        return any(_reads(a, score) for a in e.args)
    if isinstance(e, ir.ToFloat):
        return not score and _int_reads_position(e.value)
    if isinstance(e, ir.FloatAt):
        return not score and _int_reads_position(e.index)
    return False


def _int_reads_position(e: ir.IntExpr) -> bool:
    return mentions(e, lambda n: isinstance(n, ir.Pos))


def _reads_pos(e, which: str) -> bool:
    """Whether the score-free ``e`` reads the position ``which`` ("q" or "k")."""
    if isinstance(e, ir.FArith):
        return _reads_pos(e.left, which) or _reads_pos(e.right, which)
    if isinstance(e, ir.FCall):
        return any(_reads_pos(a, which) for a in e.args)
    if isinstance(e, (ir.ToFloat, ir.FloatAt)):
        return mentions(e.value if isinstance(e, ir.ToFloat) else e.index,
                        lambda n: isinstance(n, ir.Pos) and n.which == which)
    return False


def top_chain(e) -> frozenset[int]:
    """The nodes of ``score +- B +- C ...`` at the top of a modifier (ids): where a term added to every score
    of a row may be left out of the forward's scores."""
    ids = set()
    while isinstance(e, ir.FArith) and e.op in "+-" and is_score(e.left) and not is_score(e.right):
        ids.add(id(e))
        e = e.left
    return frozenset(ids)


def top_softcap(e):
    """``e`` where the whole modifier is ``softcap(...)`` of the score (the forward then leaves its factor to the
    softmax's scale), else None."""
    return e if isinstance(e, ir.FCall) and e.fn == "softcap" and is_score(e) else None


def is_score(e) -> bool:
    return _reads(e, True)


def _is_pair(e) -> bool:
    """Reads q or k (not the score): computed per element."""
    return not is_score(e) and _reads(e, False)


class ScoreWriter:
    def __init__(self, layout: TableLayout, constants: dict[str, int]):
        self.layout, self.constants = layout, constants
        self.fields: list[str] = []          # C expressions of ScoreHead's fields, in order
        self.lines: list[str] = []           # score_mod's statements (value), in order
        self.grad_lines: list[str] = []      # score_mod_grad's extra statements (derivatives)
        self._memo: dict = {}
        # the forward's variant (score_mod_fwd): the additive terms of the top chain that read no key position
        # are left out of its scores and collected here (C, natural units) for the LSE (score_row)
        self.forward = False
        self.top: frozenset[int] = frozenset()
        self.row_terms: list[str] = []
        # and where the whole modifier is softcap(...), its positive factor cap / scale is left out of the
        # forward's scores: ``unit`` (a ScoreHead field) multiplies the softmax's scale instead
        self.top_softcap = None
        self.unit: str | None = None

    # -- hoisted, per work item --------------------------------------------------------------
    def head(self, code: str) -> str:
        """A ScoreHead field holding ``code`` (which may read ``mask``, ``b``, ``h``, ``scale``, ``inv_scale``)."""
        if code in ("scale", "inv_scale"):
            return f"c.{code}"
        if code not in self.fields:
            self.fields.append(code)
        return f"c.f{self.fields.index(code)}"

    def integer(self, e: ir.IntExpr) -> str:
        if isinstance(e, ir.Const):
            return f"({e.value})"
        if isinstance(e, ir.Pos):
            return e.which
        if isinstance(e, ir.Builtin):
            return {"seq_len": "mask[0]", "kv_len": "mask[1]", "h": "h", "b": "b"}[e.name]
        if isinstance(e, ir.ParamRef):
            return f"({self.constants[e.name]})" if e.name in self.constants else f"mask[{self.layout.int_slot(e.name)}]"
        if isinstance(e, ir.TableAt):       # a per-head int parameter (resolve allows no other table here)
            return f"(mask + mask[{self.layout.table_slot(e.table)}])[1 + {self.integer(e.indices[0])}]"
        if isinstance(e, ir.Func):
            args = [self.integer(a) for a in e.args]
            return f"abs({args[0]})" if e.fn == "abs" else f"{e.fn}({args[0]}, {args[1]})"
        if not isinstance(e, ir.Arith):      # resolve lets no segment reach a score modifier
            raise TypeError(e)
        left, right = self.integer(e.left), self.integer(e.right)
        if e.op in ("//", "%"):         # Python's floor semantics, in int (bind proved the values fit)
            fn = "maskc_floordiv" if e.op == "//" else "maskc_floormod"
            return f"{fn}((int){left}, (int){right})"
        return f"({left} {e.op} {right})"

    def natural(self, e, hoist: bool = True) -> str:
        """A score-free float expression; parts free of q and k hoisted into ScoreHead when ``hoist``."""
        if hoist and not _is_pair(e):
            return self.head(self.natural(e, hoist=False))
        if isinstance(e, ir.FloatConst):
            return _literal(e.value)
        if isinstance(e, ir.FloatParam):
            return f"__int_as_float(mask[{self.layout.float_slot(e.name)}])"
        if isinstance(e, ir.FloatAt):
            return f"maskc_float_at(mask + mask[{self.layout.float_slot(e.table)}], {self.integer(e.index)})"
        if isinstance(e, ir.ToFloat):
            split = _position_linear(e.value) if hoist else None
            if split is None:
                return f"(float){self.integer(e.value)}"
            cq, ck, rest = split      # cq q + ck k + rest: the positions as floats, the rest hoisted
            terms = [_times(cq, "qf"), _times(ck, "kf")] + ([self.head(f"(float){self.integer(rest)}")] if rest else [])
            return "(" + (" + ".join(t for t in terms if t).replace("+ -", "- ") or "0.f") + ")"   # q - q: 0
        if isinstance(e, ir.FArith):
            return f"({self.natural(e.left, hoist)} {e.op} {self.natural(e.right, hoist)})"
        args = [self.natural(a, hoist) for a in e.args]
        fn = "maskc_tanh" if hoist else "tanhf"      # per work item: the accurate one
        return f"{fn}({args[0]})" if e.fn == "tanh" else f"({args[1]} * {fn}({args[0]} / {args[1]}))"

    def scaled(self, e, factor: str) -> tuple[str, str | None]:
        """The score-free ``e`` times ``factor`` (``inv_scale`` or ``-inv_scale``) as (a, b) meaning ``a * b``
        (b None: just a): one hoisted constant when ``e`` is free of q and k; for a product ``H * P`` the
        factor folds into H's hoisted constant."""
        if not _is_pair(e):
            return self.head(f"({self.natural(e, hoist=False)}) * {factor}"), None
        if isinstance(e, ir.FArith) and e.op == "*" and (not _is_pair(e.left) or not _is_pair(e.right)):
            h, p = (e.left, e.right) if not _is_pair(e.left) else (e.right, e.left)
            return self.scaled(h, factor)[0], self.natural(p)
        return self.head(factor), self.natural(e)

    # -- per element: the score ------------------------------------------------------------
    def local(self, code: str, grad: bool = False) -> str:
        lines = self.grad_lines if grad else self.lines
        name = f"{'d' if grad else 'v'}{sum(len(x) for x in (self.lines, self.grad_lines))}"
        lines.append(f"    const float {name} = {code};")
        return name

    def to(self, value: str, unit: str, want: str) -> str:
        if unit == want:
            return value
        return f"({value} * {self.head('scale' if want == 'nat' else 'inv_scale')})"

    def score(self, e) -> tuple[str, str, str | None]:
        """(C value, its unit "raw" or "nat", its derivative mod'(x): C, ONE, or None for 0) of a
        score-reading node."""
        key = e
        if key in self._memo:
            return self._memo[key]
        out = self._score(e)
        self._memo[key] = out
        return out

    def _score(self, e):
        if isinstance(e, ir.ScoreIn):
            return "s", "raw", ONE
        if isinstance(e, ir.FArith):
            ls, rs = is_score(e.left), is_score(e.right)
            if e.op in "+-":
                if ls and rs:
                    (a, ua, da), (b, ub, db) = self.score(e.left), self.score(e.right)
                    unit = "raw" if ua == ub == "raw" else "nat"
                    value = self.local(f"{self.to(a, ua, unit)} {e.op} {self.to(b, ub, unit)}")
                    return value, unit, self.grad_sum(da, db, e.op)
                if ls:     # A +- B: raw A + (+-B) / scale
                    a, ua, da = self.score(e.left)
                    raw = self.to(a, ua, "raw")
                    if self.forward and id(e) in self.top:
                        shifted = self.shift_without_rows(raw, e.right, e.op == "-")
                        if shifted is not None:
                            return shifted, "raw", da
                    return self.shift(raw, e.right, e.op == "-"), "raw", da
                b, ub, db = self.score(e.right)       # B +- A
                if e.op == "-":
                    negated = self.local(f"-{self.to(b, ub, 'raw')}")
                    return self.shift(negated, e.left, False), "raw", self.grad_scale(db, "-1.f")
                return self.shift(self.to(b, ub, "raw"), e.left, False), "raw", db
            if e.op == "*" and ls and rs:
                (a, ua, da), (b, ub, db) = self.score(e.left), self.score(e.right)
                a, b = self.to(a, ua, "nat"), self.to(b, ub, "nat")
                return self.local(f"{a} * {b}"), "nat", self.grad_sum(self.grad_scale(da, b), self.grad_scale(db, a), "+")
            score_side, other = (e.left, e.right) if ls else (e.right, e.left)
            a, ua, da = self.score(score_side)
            if e.op == "*":
                factor = self.natural(other)
            elif _is_pair(other):      # resolve: the divisor never reads the score
                factor = f"(1.f / {self.natural(other)})"
            else:
                factor = self.head(f"1.f / ({self.natural(other, hoist=False)})")
            return self.local(f"{a} * {factor}"), ua, self.grad_scale(da, factor)
        if isinstance(e, ir.FCall):
            a, ua, da = self.score(e.args[0])
            if e.fn == "softcap":      # resolve: the cap reads neither q nor k, and bind: it is positive
                # cap * tanh(x / cap) with x = scale * s, in raw units: (cap / scale) * tanh(s * (scale / cap)); the
                # same with |cap| (tanh is odd), so the factor is positive even for a cap a device update made
                # negative, which the forward's softmax scale relies on (score_unit)
                cap = f"fabsf({self.natural(e.args[1], hoist=False)})"
                t = self.local(f"maskc_tanh({self.to(a, ua, 'raw')} * {self.head(f'scale / {cap}')})")
                factor = self.head(f"{cap} * inv_scale")
                if self.forward and e is self.top_softcap:
                    self.unit = factor       # the forward's softmax takes the factor into its scale
                    return t, "raw", None
                value = self.local(f"{factor} * {t}")
                return value, "raw", self.grad_scale(da, self.local(f"fmaf(-{t}, {t}, 1.f)", grad=True))
            t = value = self.local(f"maskc_tanh({self.to(a, ua, 'nat')})")
            return value, "nat", self.grad_scale(da, self.local(f"fmaf(-{t}, {t}, 1.f)", grad=True))
        raise TypeError(e)

    def shift(self, raw: str, other, negate: bool) -> str:
        """``raw + (-other if negate else other) / scale``: one add of a hoisted constant, or one FMA."""
        a, b = self.scaled(other, "-inv_scale" if negate else "inv_scale")
        return self.local(f"{raw} + {a}" if b is None else f"fmaf({a}, {b}, {raw})")

    def shift_without_rows(self, raw: str, other, negate: bool) -> str | None:
        """The forward's ``raw +- other / scale`` without the part of ``other`` that reads no key position, which
        goes to ``row_terms`` (the softmax of a row is unchanged by a constant added to all its scores, the
        LSE takes it back): nothing left for a term free of k; for ``H * (cq q + ck k + rest)`` (ALiBi's
        ``slope * (q - k)``) one FMA on ``kfo``, the key's position less the row's origin ``of`` (a work item's
        first query: near the diagonal, where the weight is, the product stays small and exact). None: no such
        part (the plain shift applies)."""
        sign = "-" if negate else ""
        if not _reads_pos(other, "k"):
            self.row_terms.append(f"{sign}{self.natural(other)}")
            return raw
        factor, value = None, other
        if isinstance(other, ir.FArith) and other.op == "*":
            for known, p in ((other.left, other.right), (other.right, other.left)):
                if not _is_pair(known) and isinstance(p, ir.ToFloat):
                    factor, value = known, p
        if not isinstance(value, ir.ToFloat) or (split := _position_linear(value.value)) is None:
            return None
        cq, ck, rest = split
        scale_factor = "-inv_scale" if negate else "inv_scale"
        a = self.head(scale_factor) if factor is None else self.scaled(factor, scale_factor)[0]
        weight = "1.f" if factor is None else self.natural(factor)
        parts = [_times(cq, "qf"), _times(ck, "of"), self.head(f"(float){self.integer(rest)}") if rest else ""]
        self.row_terms.append(f"{sign}{weight} * ({' + '.join(x for x in parts if x)})".replace("+ -", "- "))
        return self.local(f"fmaf({a}, {_times(ck, 'kfo')}, {raw})")

    def grad_scale(self, d: str | None, factor: str) -> str | None:
        if d is None:
            return None
        if d == ONE:
            return factor
        return self.local(f"{d} * {factor}", grad=True)

    def grad_sum(self, a: str | None, b: str | None, op: str) -> str | None:
        if a is None and b is None:
            return None
        if b is None:
            return a
        if a is None:
            return b if op == "+" else self.local(f"-{b}", grad=True)
        return self.local(f"{a} {op} {b}", grad=True)


def _position_linear(e: ir.IntExpr) -> tuple[int, int, ir.IntExpr | None] | None:
    """``e`` as ``cq * q + ck * k + rest`` (rest free of positions, None for 0), or None when it reads q or k
    otherwise (through ``//``, ``min``, a product of positions...)."""
    if isinstance(e, ir.Pos):
        return (1, 0, None) if e.which == "q" else (0, 1, None)
    if not _int_reads_position(e):
        return 0, 0, e
    if isinstance(e, ir.Arith) and e.op in ("+", "-"):
        left, right = _position_linear(e.left), _position_linear(e.right)
        if left is None or right is None:
            return None
        sign = 1 if e.op == "+" else -1
        rest = left[2] if right[2] is None else (
            ir.Arith(e.op, left[2] if left[2] is not None else ir.Const(0), right[2]))
        return left[0] + sign * right[0], left[1] + sign * right[1], rest
    if isinstance(e, ir.Arith) and e.op == "*":
        for const, other in ((e.left, e.right), (e.right, e.left)):
            if isinstance(const, ir.Const):
                inner = _position_linear(other)
                if inner is None:
                    return None
                rest = None if inner[2] is None else ir.Arith("*", const, inner[2])
                return const.value * inner[0], const.value * inner[1], rest
    return None


def _times(coef: int, name: str) -> str:
    return "" if coef == 0 else name if coef == 1 else f"-{name}" if coef == -1 else f"{coef}.f * {name}"
