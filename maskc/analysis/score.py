"""Score modifiers, evaluated: the reference semantics of ``score = ...`` in numpy float64, with the derivative
the backward needs, and bind's check that the kernels' integer arithmetic cannot overflow.

Semantics (docs/language/score.md): for a visible pair, the kernel's score ``x = scale * (q_vec . k_vec)`` (the
softmax scale applied first, as FlexAttention's ``score_mod`` receives it) becomes ``mod(x)``, and the softmax
runs over the modified scores; hidden pairs stay hidden. The gradient flows through it:
``dL/dx = dL/dmod * mod'(x)``. Integer sub-expressions are computed exactly (Python's floor semantics) and then
rounded to float; a float table read at an index outside it reads its nearest entry (the index is clamped to
``[0, n)``: relative-position buckets past the last read the last).
"""
from __future__ import annotations

import math

import numpy as np

from maskc import ir
from maskc.analysis.evaluate import Evaluator
from maskc.analysis.values import INT32, INT32_MIN
from maskc.errors import BindError
from maskc.ir.walk import depends_on_position, mentions, nodes as walk_nodes
from maskc.bound_params import BatchParams

POSITION_SLACK = 256
"""Kernels evaluate the modifier on whole tiles: positions up to a tile (at most 256) past seq_len and kv_len."""


def float_table_index(index: np.ndarray, n: int) -> np.ndarray:
    """Where a float table of ``n`` entries is read at ``index``: clamped into [0, n)."""
    return np.clip(index, 0, n - 1)


class ScoreEvaluator(Evaluator):
    """Evaluates a mask's score modifier for one batch element and head, with its derivative in the incoming
    score: the values of :class:`~maskc.analysis.interpret.Interpreter`'s walk are dual numbers (value,
    derivative) in numpy float64, its integer parts those of :class:`~maskc.analysis.evaluate.Evaluator`;
    q and k broadcast as there."""

    def __call__(self, score: np.ndarray, q, k) -> tuple[np.ndarray, np.ndarray]:
        """(mod(score), mod'(score)) elementwise, float64, broadcast to ``score``'s shape."""
        modifier = self.mask.score
        assert modifier is not None, "a mask without a score modifier"
        value, grad = self.score(modifier.expr, np.asarray(score, np.float64), q, k)
        shape = np.broadcast_shapes(np.shape(score), np.shape(value))
        return np.broadcast_to(value, shape).astype(np.float64), np.broadcast_to(grad, shape).astype(np.float64)

    def score_in(self, x):
        return x, np.float64(1.0)

    def float_const(self, value: float, x):
        return np.float64(value), np.float64(0.0)

    def float_param(self, name: str, x):
        return np.float64(self.params.float(name)), np.float64(0.0)

    def float_at(self, table: str, index, x):
        values = self.params.float(table)
        return values[float_table_index(np.asarray(index, np.int64), len(values))], np.float64(0.0)

    def to_float(self, value, x):
        return np.asarray(value, np.float64), np.float64(0.0)

    def farith(self, op: str, left, right):
        (a, da), (b, db) = left, right
        if op == "+":
            return a + b, da + db
        if op == "-":
            return a - b, da - db
        if op == "*":
            return a * b, da * b + a * db
        with np.errstate(divide="ignore", invalid="ignore"):
            return a / b, da / b        # b never reads the score (resolve)

    def fcall(self, fn: str, args: list):
        a, da = args[0]
        if fn == "tanh":
            t = np.tanh(a)
            return t, da * (1.0 - t * t)
        cap = args[1][0]
        t = np.tanh(a / cap)
        return cap * t, da * (1.0 - t * t)


def modified_scores(mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int, head: int,
                    batch_index: int, scores: np.ndarray, rows, cols) -> tuple[np.ndarray, np.ndarray]:
    """(mod(scores), mod'(scores)) for the dense block ``scores[rows x cols]`` (positions: ranges or integer
    arrays) of one batch element and head; the scores themselves and 1 for a mask without a modifier."""
    if mask.score is None:
        return scores, np.ones_like(scores)
    q = np.asarray(rows, np.int64)[:, None]
    k = np.asarray(cols, np.int64)[None, :]
    return ScoreEvaluator(mask, params, seq_len, kv_len, head, batch_index)(scores, q, k)


def float_nodes(expr: ir.ScoreExpr):
    """Every float node of a modifier's expression (not the integer expressions inside ToFloat and FloatAt)."""
    stack = [expr]
    while stack:
        e = stack.pop()
        yield e
        if isinstance(e, ir.FArith):
            stack += [e.left, e.right]
        elif isinstance(e, ir.FCall):
            stack += list(e.args)


def integer_parts(expr: ir.ScoreExpr):
    """Every integer expression the modifier computes: ToFloat values and float-table indices."""
    for e in float_nodes(expr):
        if isinstance(e, ir.ToFloat):
            yield e.value
        elif isinstance(e, ir.FloatAt):
            yield e.index


def reads_head(mask: ir.ResolvedMask) -> bool:
    """Whether the mask's score modifier reads h (a ``float per h``, a per-head int, h itself): its binding
    then needs num_heads."""
    return mask.score is not None and any(
        mentions(part, lambda n: isinstance(n, ir.Builtin) and n.name == "h") for part in integer_parts(mask.score.expr))


def check_score(mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int, num_heads: int | None,
                batch: int, at: str = "", b: int = 0) -> None:
    """Bind's check of a score modifier (``params``: batch element ``b``'s): every intermediate of its integer
    parts fits in 32 bits (the kernels compute them in int) and every divisor is positive, for every position
    up to POSITION_SLACK past the ends, head and batch element, by interval arithmetic, so sound (it may refuse
    what never overflows); every softcap's cap is positive at every head (a cap reads no position); and no right
    side of '/' can be 0 there (:func:`_check_divisors`)."""
    if mask.score is None:
        return
    box = {"q": (0, seq_len + POSITION_SLACK), "k": (0, kv_len + POSITION_SLACK),
           "seq_len": (seq_len, seq_len), "kv_len": (kv_len, kv_len), "h": (0, max(0, (num_heads or 1) - 1)),
           "b": (0, batch - 1)}
    for part in integer_parts(mask.score.expr):
        _interval(part, box, params, mask.name, at)
    _check_caps(mask, params, seq_len, kv_len, num_heads if reads_head(mask) else None, b, at)
    _check_divisors(mask, params, box, seq_len, kv_len, num_heads if reads_head(mask) else None, b, at)


DIVISOR_HINT = ("the kernels compute the modifier on whole tiles before masking, hidden pairs included, up to "
                f"{POSITION_SLACK} positions past the ends: keep a divisor away from 0 at every position, "
                "e.g. max(q - k, 1)")


def zero_of_divisor(divisor: ir.ScoreExpr) -> dict[str, int] | None:
    """Where a right side of '/' that reads no parameter and no length is 0 at a place every binding's check
    covers (q and k in [0, POSITION_SLACK], as seq_len and kv_len are at least 1; h = b = 0): the values of the
    names it reads there ({'q': 0, 'k': 0}); None where it reads the binding (bind checks it) or is not 0
    there. A divisor whose integer parts pass 32 bits there is left to bind, which says so."""
    reads_binding = any(isinstance(n, (ir.FloatParam, ir.FloatAt)) for n in float_nodes(divisor)) or any(
        mentions(part, lambda n: isinstance(n, (ir.ParamRef, ir.TableAt, ir.SegAttr, ir.SegValue))
                 or (isinstance(n, ir.Builtin) and n.name in ("seq_len", "kv_len")))
        for part in integer_parts(divisor))
    if reads_binding:
        return None
    box = {"q": (0, POSITION_SLACK), "k": (0, POSITION_SLACK), "h": (0, 0), "b": (0, 0)}
    no_params = BatchParams((), ())
    try:
        for part in integer_parts(divisor):
            _interval(part, box, no_params, "", "")
    except BindError:
        return None
    q, k = np.arange(POSITION_SLACK + 1)[:, None], np.arange(POSITION_SLACK + 1)[None, :]
    ev = ScoreEvaluator(None, no_params, 1, 1, 0, 0)    # type: ignore[arg-type]  # the mask only names table errors
    value = np.broadcast_to(ev.score(divisor, np.zeros(1), q, k)[0], (len(q), k.shape[1]))
    zeros = np.argwhere(value == 0)
    if not len(zeros):
        return None
    at = {"q": int(zeros[0][0]), "k": int(zeros[0][1]), "h": 0, "b": 0}
    read = {n.which if isinstance(n, ir.Pos) else n.name for part in integer_parts(divisor) for n in walk_nodes(part)
            if isinstance(n, (ir.Pos, ir.Builtin))}
    return {name: value for name, value in at.items() if name in read}


def _check_divisors(mask: ir.ResolvedMask, params: BatchParams, box: dict, seq_len: int, kv_len: int,
                    num_heads: int | None, b: int, at: str) -> None:
    """No right side of '/' contains 0 in its interval over ``box``'s positions, at any head of batch element
    ``b`` (h and b exact, so a divisor free of q and k is judged on its value); else a BindError at it."""
    assert mask.score is not None, "a mask without a score modifier"
    divisions = [e for e in float_nodes(mask.score.expr) if isinstance(e, ir.FArith) and e.op == "/"]
    for h in range(num_heads) if num_heads else (0,):
        exact = {**box, "h": (h, h), "b": (b, b)}
        head = f" at head {h}" if num_heads else ""
        for division in divisions:
            _divisor_interval(division.right, exact, params, mask, seq_len, kv_len, h, b, head + at)


def _float_interval(e: ir.ScoreExpr, box, params: BatchParams, mask: ir.ResolvedMask, seq_len: int, kv_len: int,
                    h: int, b: int, at: str) -> tuple[float, float]:
    """Bounds of a float expression free of the score over ``box`` (sound: interval arithmetic), raising a
    BindError at any right side of '/' whose bounds hold 0."""
    def sub(x):
        return _float_interval(x, box, params, mask, seq_len, kv_len, h, b, at)

    if isinstance(e, ir.FloatConst):
        return e.value, e.value
    if isinstance(e, ir.FloatParam):
        value = float(params.float(e.name))
        return value, value
    if isinstance(e, ir.FloatAt):
        values = np.asarray(params.float(e.table), np.float64)
        lo, hi = float_table_index(np.array(_interval(e.index, box, params, mask.name, at)), len(values))
        return float(values[lo:hi + 1].min()), float(values[lo:hi + 1].max())
    if isinstance(e, ir.ToFloat):
        lo, hi = _interval(e.value, box, params, mask.name, at)
        return float(lo), float(hi)
    if isinstance(e, ir.FArith):
        (a, bb), (c, d) = sub(e.left), sub(e.right)
        if e.op == "+":
            return a + c, bb + d
        if e.op == "-":
            return a - d, bb - c
        if e.op == "/":
            c, d = _divisor_interval(e.right, box, params, mask, seq_len, kv_len, h, b, at)
        corners = [a * c, a * d, bb * c, bb * d] if e.op == "*" else [a / c, a / d, bb / c, bb / d]
        return min(corners), max(corners)
    if isinstance(e, ir.FCall):
        a, bb = sub(e.args[0])
        if e.fn == "tanh":
            return math.tanh(a), math.tanh(bb)
        c, d = sub(e.args[1])
        if c <= 0:                      # |cap * tanh(x / cap)| < |cap| whatever x is
            top = max(abs(c), abs(d))
            return -top, top
        # increasing in x; in the cap, increasing where x > 0 and decreasing where x < 0: the corners bound it
        return (min(c * math.tanh(a / c), d * math.tanh(a / d)), max(c * math.tanh(bb / c), d * math.tanh(bb / d)))
    raise TypeError(e)      # ScoreIn: resolve keeps the score off the right of '/'


def _divisor_interval(divisor: ir.ScoreExpr, box, params: BatchParams, mask: ir.ResolvedMask, seq_len: int,
                      kv_len: int, h: int, b: int, at: str) -> tuple[float, float]:
    """A right side of '/''s bounds over ``box``, which must not hold 0 (else a BindError at it)."""
    lo, hi = _float_interval(divisor, box, params, mask, seq_len, kv_len, h, b, at)
    if lo <= 0 <= hi:
        raise _zero_divisor(divisor, (lo, hi), box, params, mask, seq_len, kv_len, h, b, at)
    return lo, hi


def _zero_divisor(divisor: ir.ScoreExpr, bounds: tuple[float, float], box, params: BatchParams,
                  mask: ir.ResolvedMask, seq_len: int, kv_len: int, h: int, b: int, at: str) -> BindError:
    lo, hi = bounds
    where = f"the right side of '/' in the score modifier of mask '{mask.name}'"
    if any(depends_on_position(part) for part in integer_parts(divisor)):
        return BindError(f"{where} may be 0: it spans [{lo:g}, {hi:g}] for q in [0, {box['q'][1]}] and k in "
                         f"[0, {box['k'][1]}]{at}", divisor.span, DIVISOR_HINT)
    ev = ScoreEvaluator(mask, params, seq_len, kv_len, h, b)
    reads = ", ".join(sorted(set(_named(ev, divisor, "")))) or "numbers alone"
    value = f"is {lo:g}" if lo == hi else f"may be 0 (it spans [{lo:g}, {hi:g}])"
    return BindError(f"{where} {value} with {reads}{at}; a divisor must not be 0", divisor.span)


def _check_caps(mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int, num_heads: int | None,
                b: int, at: str) -> None:
    """Each softcap's cap (free of q and k: resolve) positive at every head, else a BindError at the cap naming
    the parameters it reads and their values."""
    assert mask.score is not None, "a mask without a score modifier"
    caps = [e.args[1] for e in float_nodes(mask.score.expr) if isinstance(e, ir.FCall) and e.fn == "softcap"]
    zero = np.zeros(1, np.int64)
    for h in range(num_heads) if num_heads else (0,):
        ev = ScoreEvaluator(mask, params, seq_len, kv_len, h, b)
        for cap in caps:
            value = float(np.ravel(ev.score(cap, np.zeros(1), zero, zero)[0])[0])
            if not value > 0:
                head = f" at head {h}" if num_heads else ""
                reads = ", ".join(sorted(set(_named(ev, cap, head)))) or "numbers alone"
                raise BindError(f"softcap's cap is {value} with {reads}{at}; a cap must be positive", cap.span,
                                "softcap(x, cap) is cap * tanh(x / cap): it bounds x to (-cap, cap)")


def score_bound(mask: ir.ResolvedMask, params: BatchParams, seq_len: int, kv_len: int, num_heads: int | None,
                b: int = 0) -> float | None:
    """The bound the modifier puts on every modified score of batch element ``b`` (``params``: its values):
    where the whole modifier is ``softcap(x, cap)``, ``|mod| < cap`` whatever ``x`` is, so the largest cap over the
    heads (a cap reads no position; bind has checked each is positive); None for any other modifier (and
    without one)."""
    if mask.score is None:
        return None
    top = mask.score.expr
    if not (isinstance(top, ir.FCall) and top.fn == "softcap"):
        return None
    zero = np.zeros(1, np.int64)
    caps = []
    for h in range(num_heads) if num_heads and reads_head(mask) else (0,):
        ev = ScoreEvaluator(mask, params, seq_len, kv_len, h, b)
        caps.append(float(np.ravel(ev.score(top.args[1], np.zeros(1), zero, zero)[0])[0]))
    return max(caps)


def _named(ev: "ScoreEvaluator", cap: ir.ScoreExpr, head: str):
    """``'c' = 1.5`` for each parameter a cap reads (``at head 2`` for one value per head)."""
    zero = np.zeros(1, np.int64)
    for e in float_nodes(cap):
        if isinstance(e, ir.FloatParam):
            yield f"'{e.name}' = {ev.params.float(e.name)}"
        elif isinstance(e, ir.FloatAt):
            yield f"'{e.table}' = {float(np.ravel(ev.score(e, np.zeros(1), zero, zero)[0])[0])}{head}"
    for part in integer_parts(cap):
        for n in walk_nodes(part):
            if isinstance(n, ir.ParamRef):
                yield f"'{n.name}' = {ev.params.int(n.name)}"
            elif isinstance(n, ir.TableAt):
                yield f"'{n.table}' = {int(np.ravel(ev.int(n, zero, zero))[0])}{head}"


def _interval(e: ir.IntExpr, box, params: BatchParams, name: str, at: str) -> tuple[int, int]:
    if isinstance(e, ir.Const):
        out = (e.value, e.value)
    elif isinstance(e, ir.Pos):
        out = box[e.which]
    elif isinstance(e, ir.Builtin):
        out = box[e.name]
    elif isinstance(e, ir.ParamRef):
        out = (params.int(e.name),) * 2
    elif isinstance(e, ir.TableAt):
        values = params.table(e.table).values
        out = (int(values.min()), int(values.max())) if len(values) else (0, 0)
    elif isinstance(e, ir.Func):
        args = [_interval(a, box, params, name, at) for a in e.args]
        if e.fn == "abs":
            lo, hi = args[0]
            out = (0 if lo <= 0 <= hi else min(abs(lo), abs(hi)), max(abs(lo), abs(hi)))
        else:
            pick = min if e.fn == "min" else max
            out = (pick(a[0] for a in args), pick(a[1] for a in args))
    elif isinstance(e, ir.Arith):
        (a, b), (c, d) = _interval(e.left, box, params, name, at), _interval(e.right, box, params, name, at)
        if e.op in ("//", "%"):
            if c <= 0:
                raise BindError(f"a divisor of the score modifier of mask '{name}' may be {c}; it must be "
                                f"positive{at}", e.right.span)
            out = (min(a // c, a // d), max(b // c, b // d)) if e.op == "//" else (0, d - 1)
        elif e.op == "+":
            out = (a + c, b + d)
        elif e.op == "-":
            out = (a - d, b - c)
        else:
            products = (a * c, a * d, b * c, b * d)
            out = (min(products), max(products))
    else:
        raise TypeError(e)
    if out[0] < INT32_MIN or out[1] > INT32:
        raise BindError(f"the score modifier of mask '{name}' computes values in [{out[0]}, {out[1]}] here, past "
                        f"32 bits{at}", getattr(e, "span", None), "the kernels compute its integer parts in int")
    return out
