"""Hypothesis strategies: random .mask programs (as text) with valid parameter values.

``exact=True`` draws from the fragment where every atom is linear in k (q-side anything, bit operations
included), for which maskc promises exact tile classes; ``exact=False`` adds products, squares, floor
division, bit operations and k-side segment attributes, where it promises only soundness.
"""
from __future__ import annotations

import numpy as np
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
    kind = draw(st.sampled_from(["+", "-", "*const", "min", "max", "abs", "//", "%", "clamp", "sq",
                                 "&", "|", "^", ">>", "<<", "~"]))
    a, b = draw(q_expr(depth - 1)), draw(q_expr(depth - 1))
    if kind in ("+", "-", "&", "|", "^"):
        return f"({a} {kind} {b})"
    if kind in (">>", "<<"):
        return f"({a} {kind} {draw(st.integers(0, 5 if kind == '>>' else 3))})"
    if kind == "~":
        return f"~{a}"
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
    choice = draw(st.integers(0, 12 if not exact else 6))
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
    if choice == 10:       # a bit operation of k with anything of q
        op = draw(st.sampled_from(["&", "|", "^"]))
        return f"({draw(k_expr(exact, depth - 1))} {op} {draw(q_expr(1))})"
    if choice == 11:       # shifts: >> by a constant is a floor, by a form of q (or << of q by k) opaque
        n = draw(st.sampled_from(["0", "1", "3", "(q % 4)", "(a % 3)"]))
        return (f"({draw(k_expr(exact, depth - 1))} >> {n})" if draw(st.booleans()) else
                f"({draw(q_expr(1))} << (k % 3))")
    if choice == 12:       # masks with a constant: floors (& 7, & -4) and bit tests (& 5)
        return f"({draw(k_expr(exact, depth - 1))} {draw(st.sampled_from(['&', '|', '^']))} " \
               f"{draw(st.sampled_from([1, 3, 5, 7, -4, 6]))})"
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


def _mask(draw, header: str, conditions, max_deny: int, max_conditions: int) -> str:
    """A mask with 1-3 allow rules and up to ``max_deny`` deny rules, each of 1..max_conditions conditions."""
    lines = [header]
    for kind, lo, hi in (("allow", 1, 3), ("deny", 0, max_deny)):
        for _ in range(draw(st.integers(lo, hi))):
            conds = [draw(conditions) for _ in range(draw(st.integers(1, max_conditions)))]
            lines.append(f"  {kind} " + ", ".join(conds))
    return "\n".join(lines) + "\n"


@st.composite
def mask_text(draw, exact: bool):
    return _mask(draw, HEADER, condition(exact), max_deny=2, max_conditions=2)


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


# -- masks that read k through // and % (images, frames, chunks) ----------------------------------------

CHUNK_HEADER = "mask m(w: const int, ht: int, o: int, a: int, docs: segments)"


@st.composite
def coordinate(draw, pos: str, consistent: bool):
    """An image coordinate of ``pos`` (q or k): column, row, row within a frame, frame, or a chunk index.
    ``consistent`` draws from one image (width w, height ht, offset o); else divisors are drawn at random."""
    if consistent:
        return draw(st.sampled_from([f"({pos} - o) % w", f"({pos} - o) // w", f"(({pos} - o) // w) % ht",
                                     f"({pos} - o) // (w * ht)", f"({pos} - o) % (w * ht)"]))
    d, e = draw(st.integers(1, 9)), draw(st.integers(1, 4))
    off = draw(st.integers(-6, 6))
    return draw(st.sampled_from([f"({pos} + {off}) // {d}", f"({pos} + {off}) % {d}", f"({pos} // {d}) % {e}",
                                 f"(2 * {pos} + {off}) // {2 * d}", f"({off} - {pos}) // {d}",
                                 f"({off} - {pos}) % {d}", f"{pos} // ({d} * w)", f"ceildiv({pos} + {off}, {d})"]))


@st.composite
def q_guard(draw):
    """A condition on q alone that pins it to a point, an interval or a residue (true at rows in the middle of
    a q_block and false at both its ends: two guards, ``q >= lo`` and ``q <= hi``), or one side of an interval
    (a rule may draw both sides)."""
    n, d = draw(st.integers(0, 100)), draw(st.integers(0, 6))
    m = draw(st.integers(2, 9))
    return draw(st.sampled_from([f"q == {n}", f"q in [a, a + {d}]", f"q in [{n}, {n + d + 1})", f"abs(q - {n}) <= {d}",
                                 f"q % {m} == {n % m}", f"(q - o) % w == {d}", f"q == docs.start(q) + {d}",
                                 f"2 * (q % {m}) + 1 >= {n % (2 * m)}", f"3 * q <= {n}", f"q <= a + {d}", f"q < {n}",
                                 f"q > {n}"]))


@st.composite
def chunk_atom(draw, consistent: bool):
    kind = draw(st.integers(0, 8))
    if kind == 8:          # q alone: rows pinned inside a q_block
        return draw(q_guard())
    if kind <= 1:          # a window along one coordinate
        form = draw(coordinate("k", consistent))
        d = draw(st.integers(0, 4))
        op = draw(st.sampled_from(["<=", "<", ">=", ">", "=="]))
        return f"{form} {op} {form.replace('k', 'q')} + {d}" if kind else \
            f"abs({form.replace('k', 'q')} - {form}) <= {d}"
    if kind == 2:          # a disc on the grid
        x, y = "(k - o) % w", "(k - o) // w"
        return f"({x.replace('k', 'q')} - {x}) ** 2 + ({y.replace('k', 'q')} - {y}) ** 2 < {draw(st.integers(0, 30))}"
    if kind == 3:          # a chunk or coordinate range
        form = draw(coordinate("k", consistent))
        lo = draw(st.integers(-2, 6))
        return f"{form} in [{form.replace('k', 'q')} - {lo}, {form.replace('k', 'q')} + {draw(st.integers(0, 4))}]"
    if kind == 4:          # a coordinate against a constant
        op = draw(st.sampled_from(["<", ">=", "!="]))
        return f"{draw(coordinate('k', consistent))} {op} {draw(st.integers(0, 5))}"
    if kind == 5:
        return draw(st.sampled_from(["k <= q", "k >= q - a", "same(docs)", "k < a or q < a", "q >= o"]))
    if kind == 6:          # a different coordinate of q and k (an image's column against a chunk)
        shift = draw(st.integers(-2, 3))
        return f"{draw(coordinate('k', consistent))} <= {draw(coordinate('q', consistent))} + {shift}"
    return f"{draw(coordinate('k', consistent))} + {draw(coordinate('k', consistent))} <= q"


@st.composite
def chunk_mask_text(draw, consistent: bool = True):
    return _mask(draw, CHUNK_HEADER, chunk_atom(consistent), max_deny=1, max_conditions=3)


@st.composite
def chunk_binding(draw, max_len: int = 120):
    """(seq_len, kv_len, params) valid for CHUNK_HEADER."""
    seq_len = draw(st.integers(1, max_len))
    kv_len = seq_len if draw(st.integers(0, 3)) else draw(st.integers(1, max_len))
    params = {"w": draw(st.integers(1, 13)), "ht": draw(st.integers(1, 5)), "o": draw(st.integers(-5, 20)),
              "a": draw(st.integers(0, seq_len)), "docs": draw(lengths(seq_len))}
    return seq_len, kv_len, params


def perturbed(draw, mask, values: dict, seq_len: int) -> dict:
    """New values for some of ``values``' parameters (as bind takes a batch's: one list per parameter): any
    integers near the valid range, segments of any lengths (negative ones, sums short of or past their range) or
    a valid split, per-segment arrays of any entries, table entries of any sign. Whatever bind makes of them."""
    out = {}
    small = st.one_of(st.integers(-3, -1), st.integers(0, seq_len + 3))
    for p in mask.resolved.params:
        if p.const or p.name not in values or not draw(st.booleans()):
            continue
        v = values[p.name]
        if p.kind == "int":
            out[p.name] = [draw(small) for _ in v]
        elif p.kind == "segments":
            def lengths(total, n):
                if draw(st.booleans()):
                    return draw(st.lists(st.integers(-2, seq_len), min_size=1, max_size=n))
                cuts = sorted(draw(st.lists(st.integers(0, total), min_size=n - 1, max_size=n - 1)))
                return [b - a for a, b in zip([0] + cuts, cuts + [total])]
            out[p.name] = [lengths(sum(e), 6) for e in v]
        elif p.kind == "per":
            seg = values[p.of] if p.of not in out else out[p.of]
            out[p.name] = [draw(st.lists(st.integers(-2, seq_len), min_size=len(e), max_size=len(e))) for e in seg]
        elif p.kind == "table":
            out[p.name] = [np.asarray(draw(st.lists(st.integers(-2, seq_len), min_size=np.size(e),
                                                    max_size=np.size(e)))).reshape(np.shape(e)).tolist() for e in v]
    return out
