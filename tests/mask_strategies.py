"""Hypothesis strategies: random .mask programs (as text) with valid parameter values.

``exact=True`` draws from the fragment where every atom is linear in k (q-side anything), for
which maskc promises exact tile classes; ``exact=False`` adds products, squares, floor division
and k-side segment attributes, where it promises only soundness.
"""
from __future__ import annotations

from hypothesis import strategies as st

HEADER = "mask m(a: int, c: int, docs: segments, t: per docs, sub: segments from a)"

Q_LEAVES = ["q", "a", "c", "seq_len", "kv_len", "docs.start(q)", "docs.end(q)", "docs.length(q)",
            "docs.index(q)", "t(q)", "sub.start(q)", "sub.end(q)", "sub.index(q)", "b"]
K_LEAVES_GENERAL = ["docs.start(k)", "docs.end(k)", "t(k)", "sub.index(k)", "docs.length(k)"]


@st.composite
def q_expr(draw, depth=2):
    """An integer expression free of k."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(Q_LEAVES)) if draw(st.integers(0, 3)) else str(draw(st.integers(-5, 40)))
    kind = draw(st.sampled_from(["+", "-", "*const", "min", "max", "abs", "//", "%", "clamp", "sq"]))
    a, b = draw(q_expr(depth - 1)), draw(q_expr(depth - 1))
    if kind in "+-":
        return f"({a} {kind} {b})"
    if kind == "*const":
        return f"{draw(st.integers(-3, 3))} * {a}"
    if kind in ("min", "max"):
        return f"{kind}({a}, {b})"
    if kind == "abs":
        return f"abs({a})"
    if kind in ("//", "%"):
        return f"({a} {kind} {draw(st.integers(1, 7))})"
    if kind == "sq":
        return f"({a}) ** 2"
    return f"clamp({a}, {b}, {draw(q_expr(depth - 1))})"


@st.composite
def k_expr(draw, exact: bool, depth=1):
    """An integer expression that uses k (linearly when exact)."""
    choice = draw(st.integers(0, 9 if not exact else 6))
    if choice <= 2 or depth == 0:
        coef = draw(st.sampled_from([1, 1, 1, -1, 2, -2, 3]))
        term = "k" if coef == 1 else f"{coef} * k"
        return f"({term} + {draw(q_expr(1))})" if draw(st.booleans()) else term
    if choice in (3, 4):
        fn = draw(st.sampled_from(["min", "max"]))
        return f"{fn}({draw(k_expr(exact, depth - 1))}, {draw(q_expr(1))})"
    if choice == 5:
        return f"abs(q - {draw(k_expr(exact, depth - 1))})"
    if choice == 6:
        return f"clamp({draw(k_expr(exact, depth - 1))}, {draw(q_expr(1))}, {draw(q_expr(1))})"
    if choice == 7:
        return f"({draw(k_expr(exact, depth - 1))}) * ({draw(q_expr(1))})"
    if choice == 8:
        return f"({draw(k_expr(exact, depth - 1))}) // {draw(st.integers(1, 6))}"
    return draw(st.sampled_from(K_LEAVES_GENERAL))


@st.composite
def atom(draw, exact: bool):
    kind = draw(st.integers(0, 9))
    if kind <= 4:
        op = draw(st.sampled_from(["<", "<=", "==", "!=", ">", ">="]))
        left = draw(k_expr(exact)) if draw(st.integers(0, 4)) else draw(q_expr())
        return f"{left} {op} {draw(q_expr(1))}"
    if kind == 5:
        return draw(st.sampled_from(["same(docs)", "same(sub)", "not same(docs)"]))
    if kind == 6:
        br = draw(st.sampled_from(["[ )", "[ ]", "( )", "( ]"])).split()
        lo, hi = draw(q_expr(1)), draw(q_expr(1))
        neg = "not " if draw(st.booleans()) else ""
        return f"{draw(k_expr(exact, 1))} {neg}in {br[0]}{lo}, {hi}{br[1]}"
    if kind == 7:
        return f"{draw(q_expr())} <= {draw(q_expr())}"
    if kind == 8:
        return draw(st.sampled_from(["k <= q", "k >= q", "q - k < a", "k < c"]))
    return draw(st.sampled_from(["true", "false"])) if draw(st.integers(0, 4)) == 0 else "k <= q + c"


@st.composite
def condition(draw, exact: bool, depth=2):
    if depth == 0 or draw(st.integers(0, 1)) == 0:
        return draw(atom(exact))
    kind = draw(st.sampled_from(["and", "or", "not"]))
    if kind == "not":
        return f"not ({draw(condition(exact, depth - 1))})"
    return f"({draw(condition(exact, depth - 1))} {kind} {draw(condition(exact, depth - 1))})"


@st.composite
def mask_text(draw, exact: bool):
    lines = [HEADER]
    for kind, lo, hi in (("allow", 1, 3), ("deny", 0, 2)):
        for _ in range(draw(st.integers(lo, hi))):
            conds = [draw(condition(exact)) for _ in range(draw(st.integers(1, 2)))]
            lines.append(f"  {kind} " + ", ".join(conds))
    return "\n".join(lines) + "\n"


@st.composite
def lengths(draw, total: int):
    parts = draw(st.integers(1, 5))
    if total == 0:
        return [0] * draw(st.integers(1, 2))
    cuts = sorted(draw(st.lists(st.integers(0, total), min_size=parts - 1, max_size=parts - 1)))
    return [b - a for a, b in zip([0] + cuts, cuts + [total])]


@st.composite
def binding(draw, max_len: int = 70):
    """(seq_len, kv_len, params) valid for HEADER."""
    seq_len = draw(st.integers(1, max_len))
    kv_len = seq_len if draw(st.integers(0, 3)) else draw(st.integers(1, max_len))
    a = draw(st.integers(0, seq_len))
    docs = draw(lengths(seq_len))
    params = {"a": a, "c": draw(st.integers(-3, seq_len + 3)), "docs": docs,
              "t": [draw(st.integers(-2, 9)) for _ in docs], "sub": draw(lengths(seq_len - a))}
    return seq_len, kv_len, params


tile_shape = st.tuples(st.integers(1, 24), st.integers(1, 24))
